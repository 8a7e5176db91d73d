"""streamgauge.sketches: mergeable summaries with a known, tested error, in formats tools
outside streamgauge read (``docs/architecture.md §6``).

- :mod:`.accuracy` turns error targets (``distinct_error``, ``quantile_error``, ``value_range``)
  into :class:`SketchParams`.
- :mod:`.hll` — DataSketches HLL_8 distinct counts, interchangeable with Spark's ``hll_*``.
- :mod:`.tdigest` — DataSketches t-digest percentiles (tails), merged from pane partials.
- :mod:`.hdr` — HDR-histogram bucket rows that SQL merges by adding counts (any quantile, any
  range, bounded relative error), and their standard HdrHistogram encoding.

Each module works on serialized bytes/strings as the unit of storage and merge; nothing here
knows about ingest, Spark or PostgreSQL.
"""

from streamgauge.sketches.accuracy import SketchParams, compile_accuracy
from streamgauge.sketches.hdr import HdrBuckets, HdrLayout

__all__ = ["HdrBuckets", "HdrLayout", "SketchParams", "compile_accuracy"]
