"""kvcost.calibration"""
