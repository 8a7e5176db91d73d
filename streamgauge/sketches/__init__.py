"""streamgauge.sketches"""
