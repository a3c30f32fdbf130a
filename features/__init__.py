"""kvcost.features"""
