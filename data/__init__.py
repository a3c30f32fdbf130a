"""kvcost.data"""
