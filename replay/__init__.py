"""kvcost.replay"""
