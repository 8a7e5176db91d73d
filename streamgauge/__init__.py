"""streamgauge: StatsD metrics → segment log → Spark event-time windows → PostgreSQL → Grafana."""

from streamgauge.compiled_cache import use_versioned_cache

__version__ = "0.1.0"

use_versioned_cache()  # before any module imports numba (compiled_cache.py says why)
