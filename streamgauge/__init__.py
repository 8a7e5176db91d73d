"""streamgauge: StatsD metrics → durable segment log → Spark event-time windows → PostgreSQL → Grafana."""

__version__ = "0.1.0"
