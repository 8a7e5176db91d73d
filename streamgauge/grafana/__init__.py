"""streamgauge.grafana"""
