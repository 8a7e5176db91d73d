"""streamgauge.configs"""
