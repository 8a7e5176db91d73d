"""One SparkSession per process, configured for small, stateful streaming jobs.

Spark's cold start costs seconds, so the daemon and the test run each build one session and
share it. ``spark.sql.shuffle.partitions`` is the number of state-store partitions of every
stateful query and is frozen into its checkpoint: Spark's default of 200 makes each
micro-batch of a small job run 200 tasks, so it defaults to one per core here (at least 2).

Spark starts its Python workers (which run the spool source) with ``python3`` from ``PATH``
unless told otherwise; outside an activated venv that interpreter lacks pyarrow and
streamgauge. The workers therefore default to this process's own interpreter
(``PYSPARK_PYTHON``, which the driver hands to every executor: on a cluster that path must
exist on each worker host, with pyspark's dependencies and pyarrow installed).

On a cluster (any master but ``local``), executors also need the code the spool source and
the window job ship to them as pickles by reference (``streamgauge.windows.source`` and
what it imports). The session zips this process's ``streamgauge`` package and adds it with
``addPyFile`` before registering the source, so the executors' Python workers import the
driver's code; the driver's own Python workers (which run the source's ``latestOffset`` and
planning) get no includes from Spark, so the zip also leads the ``PYTHONPATH`` the driver's
JVM starts them with. Nothing needs to be installed on the workers but Python and the
third-party packages (pyarrow, pandas, numpy: pyspark's own Python dependencies).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import shutil
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

from pyspark.sql import SparkSession

import streamgauge
from streamgauge.operator.jvm_logs import BATCH_FALLING_BEHIND_LOGGER, JvmLogs
from streamgauge.windows.source import SpoolDataSource

#: Where a ``local[*]`` job's driver, block manager and UI listen.
LOOPBACK = "127.0.0.1"


def build_spark_session(
    master: str = "local[*]",
    *,
    app_name: str = "streamgauge",
    shuffle_partitions: int | None = None,
    ui_port: int | None = None,
    extra_conf: dict[str, str] | None = None,
    jvm_logs: JvmLogs | None = None,
) -> SparkSession:
    """``jvm_logs``: where the driver JVM's log4j2 events and its stdout/stderr go (files
    under the daemon's ``logs/``, see ``operator.jvm_logs``); None leaves both on this
    process's terminal. Only a session that launches the JVM applies it."""
    # One state partition per core: each partition's state store writes its own files and
    # runs its own task every batch, so more partitions than cores make a batch of a stateful
    # query (session, sliding, kll windows) take longer, not shorter. A checkpoint keeps the
    # count it started with.
    partitions = shuffle_partitions or max(2, os.cpu_count() or 1)
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
        # Checkpoints on a local path: Hadoop's raw local file system instead of its
        # ChecksumFileSystem wrapper. The wrapper writes a .crc file beside every state delta,
        # offset and commit file, and without Hadoop's native library each file it creates
        # forks a chmod (JFR shows a process per file). Without it a batch's state commit and
        # its offset and commit log writes take a fraction of the time. What the .crc guarded
        # is still checked: state files are LZ4 blocks with their own checksums, the offset
        # and commit logs versioned JSON.
        .config("spark.hadoop.fs.file.impl", "org.apache.hadoop.fs.RawLocalFileSystem")
        .config(
            "spark.hadoop.fs.AbstractFileSystem.file.impl",
            "org.apache.hadoop.fs.local.RawLocalFs",
        )
    )
    local = master == "local" or master.startswith("local[")
    if local:
        # One machine: keep the driver and its UI on loopback, not on the first interface.
        builder = builder.config("spark.driver.host", LOOPBACK).config(
            "spark.driver.bindAddress", LOOPBACK
        )
        # The UI (which can kill jobs) ignores spark.driver.bindAddress: Spark 4.3's
        # WebUI.bind listens on SPARK_LOCAL_IP, else on every interface (javap). The JVM
        # starts below and reads this process's environment then.
        os.environ.setdefault("SPARK_LOCAL_IP", LOOPBACK)
    if ui_port is not None:
        builder = builder.config("spark.ui.port", str(ui_port))
    conf = dict(extra_conf or {})
    if jvm_logs is not None:
        options = conf.get("spark.driver.extraJavaOptions", "")
        conf["spark.driver.extraJavaOptions"] = f"{options} {jvm_logs.java_options()}".strip()
    for key, value in conf.items():
        builder = builder.config(key, value)
    with contextlib.ExitStack() as launching:
        if jvm_logs is not None:
            launching.enter_context(jvm_logs.capture_output())
        if not local:
            launching.enter_context(_shipped_on_driver_pythonpath())
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    _quiet(spark, BATCH_FALLING_BEHIND_LOGGER)
    if not local:
        # Before registering: the source's pickled class carries the includes known then.
        spark.sparkContext.addPyFile(str(package_zip()))
    spark.dataSource.register(SpoolDataSource)
    return spark


@contextlib.contextmanager
def _shipped_on_driver_pythonpath() -> Iterator[None]:
    """The driver's own Python workers (the streaming source's offsets, planning) get no
    ``addPyFile`` includes from Spark, only the PYTHONPATH of the driver's JVM, which inherits
    this process's environment when it starts: the zip leads it for that moment only (the
    receivers ``run`` starts later must not import from a file that goes away with us)."""
    inherited = os.environ.get("PYTHONPATH")
    shipped = str(package_zip())
    os.environ["PYTHONPATH"] = f"{shipped}{os.pathsep}{inherited}" if inherited else shipped
    try:
        yield
    finally:
        if inherited is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = inherited


@functools.cache
def package_zip() -> Path:
    """This process's ``streamgauge`` package as a zip for ``addPyFile``, built once.

    Spark serves an added file from its path for the application's lifetime, so the zip
    lives in a private temporary directory removed when this process exits.
    """
    package = Path(streamgauge.__file__).resolve().parent
    directory = Path(tempfile.mkdtemp(prefix="streamgauge-pyfiles-"))
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    target = directory / "streamgauge.zip"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in sorted(package.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                archive.write(path, Path("streamgauge") / path.relative_to(package))
    return target


def _quiet(spark: SparkSession, logger: str) -> None:
    """Silence one chatty logger: a micro-batch longer than the trigger interval is normal
    under load (the next one starts at once), but Spark warns about every one of them."""
    jvm = spark.sparkContext._jvm
    if jvm is None:
        return
    configurator = jvm.org.apache.logging.log4j.core.config.Configurator
    configurator.setLevel(logger, jvm.org.apache.logging.log4j.Level.ERROR)
