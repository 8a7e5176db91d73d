"""One SparkSession per process, configured for small, stateful streaming jobs.

Spark's cold start costs seconds (DESIGN.md §9), so the daemon and the test run each build one
session and share it. ``spark.sql.shuffle.partitions`` is the number of state-store
partitions of every stateful query and is frozen into its checkpoint: Spark's default of 200
makes each micro-batch of a small job run 200 tasks, so it defaults to a few per core here.

Spark starts its Python workers (which run the spool source) with ``python3`` from ``PATH``
unless told otherwise; outside an activated venv that interpreter lacks pyarrow and
streamgauge. The workers therefore default to this process's own interpreter.
"""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession

from streamgauge.windows.source import SpoolDataSource


def build_spark_session(
    master: str = "local[*]",
    *,
    app_name: str = "streamgauge",
    shuffle_partitions: int | None = None,
    ui_port: int | None = None,
    extra_conf: dict[str, str] | None = None,
) -> SparkSession:
    partitions = shuffle_partitions or max(2, 2 * (os.cpu_count() or 1))
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.sql.shuffle.partitions", str(partitions))
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.streaming.metricsEnabled", "true")
        # Adaptive execution does not apply to streaming; Spark warns once per query otherwise.
        .config("spark.sql.adaptive.enabled", "false")
    )
    if master.startswith("local"):
        # One machine: keep the driver and its UI on loopback, not on the first interface.
        builder = builder.config("spark.driver.host", "127.0.0.1").config(
            "spark.driver.bindAddress", "127.0.0.1"
        )
    if ui_port is not None:
        builder = builder.config("spark.ui.port", str(ui_port))
    for key, value in (extra_conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    _quiet(spark, "org.apache.spark.sql.execution.streaming.ProcessingTimeExecutor")
    spark.dataSource.register(SpoolDataSource)
    return spark


def _quiet(spark: SparkSession, logger: str) -> None:
    """Silence one chatty logger: a micro-batch longer than the trigger interval is normal
    under load (the next one starts at once), but Spark warns about every one of them."""
    jvm = spark.sparkContext._jvm
    if jvm is None:
        return
    configurator = jvm.org.apache.logging.log4j.core.config.Configurator
    configurator.setLevel(logger, jvm.org.apache.logging.log4j.Level.ERROR)
