"""streamgauge.sinks"""
