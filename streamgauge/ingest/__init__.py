"""streamgauge.ingest"""
