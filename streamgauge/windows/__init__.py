"""streamgauge.windows"""
