"""kvcost.models"""
