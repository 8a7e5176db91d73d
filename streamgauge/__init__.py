"""streamgauge: StatsD metrics → segment log → Spark event-time windows → PostgreSQL → Grafana."""

__version__ = "0.1.0"
