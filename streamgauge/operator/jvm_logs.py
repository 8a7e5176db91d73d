"""Where the JVM's and Spark's own output goes: files under ``<data-dir>/logs/``, not the terminal.

Spark speaks through two channels, and both are taken off the terminal:

- **log4j2** (``WARN ProcessingTimeExecutor``, ``NativeCodeLoader``, ``ERROR Executor``, the
  shutdown's ``DAGScheduler`` lines): a log4j2 properties file given to the driver JVM with
  ``-Dlog4j2.configurationFile`` (``spark.driver.extraJavaOptions``) writes them to
  ``spark.log``, rotated by size, and every ERROR event once more, as one line without its
  stack trace, to ``spark-errors.log``, which the terminal of ``run`` follows
  (``operator.terminal``). ``sc.setLogLevel`` alone is not enough: it only changes levels,
  and Spark prints its start-up lines before it can be called.
- **the JVM's stdout and stderr** (``WARNING: Using incubator modules``, "Using Spark's
  default log4j profile", what the Python workers the JVM starts print, their tracebacks on
  Ctrl-C): the JVM inherits the file descriptors of the process that launches it, so they
  point at ``jvm.log`` while the session starts (``capture_output``) and at the terminal
  again right after.

With ``echo`` (``run -v``) the log4j2 events also go to stderr and the JVM keeps the terminal,
as before this module existed; the files are written either way.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

SPARK_LOG = "spark.log"
SPARK_ERRORS = "spark-errors.log"
JVM_LOG = "jvm.log"
PROPERTIES = "log4j2.properties"
#: The logger of "Current batch is falling behind" (Spark 4: the ``runtime`` package).
BATCH_FALLING_BEHIND_LOGGER = (
    "org.apache.spark.sql.execution.streaming.runtime.ProcessingTimeExecutor"
)
#: spark.log rolls over at this size, keeping this many old files (spark.log.1 ... .N).
SPARK_LOG_BYTES = "10MB"
SPARK_LOG_KEEP = 5


@dataclass(frozen=True, slots=True)
class JvmLogs:
    """The log directory of one Spark driver, and whether its output also reaches the terminal."""

    directory: Path
    echo: bool = False

    @property
    def spark_log(self) -> Path:
        return self.directory / SPARK_LOG

    @property
    def errors_log(self) -> Path:
        return self.directory / SPARK_ERRORS

    @property
    def jvm_log(self) -> Path:
        return self.directory / JVM_LOG

    def java_options(self) -> str:
        """Writes the log4j2 properties file; the option that makes the driver JVM read it."""
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / PROPERTIES
        path.write_text(log4j2_properties(self.directory, echo=self.echo))
        return f"-Dlog4j2.configurationFile=file:{path}"

    @contextlib.contextmanager
    def capture_output(self) -> Iterator[None]:
        """While the JVM is launched: its stdout and stderr go to ``jvm.log`` (the previous
        run's is kept as ``jvm.log.1``). This process's own streams are restored on exit;
        anything it wrote meanwhile went to the file too (so keep the block to the launch)."""
        if self.echo:
            yield
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        if self.jvm_log.exists():
            os.replace(self.jvm_log, self.directory / f"{JVM_LOG}.1")
        sys.stdout.flush()
        sys.stderr.flush()
        target = os.open(self.jvm_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        saved = (os.dup(1), os.dup(2))
        try:
            os.dup2(target, 1)
            os.dup2(target, 2)
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in (target, *saved):
                os.close(fd)


def log4j2_properties(directory: Path, *, echo: bool) -> str:
    """The driver's log4j2 configuration: everything at WARN and above to ``spark.log``
    (rotated), ERROR events as single lines to ``spark-errors.log``, and with ``echo`` the
    WARN lines to stderr as well.

    The root level is WARN, the level Spark gives an interactive driver: with any other, Spark
    prints "Setting default log level" on start. Streaming's per-batch "falling behind"
    warning is dropped: under load it is normal (the next batch starts at once) and it came
    every half second.
    """
    lines = [
        "status = error",
        "name = streamgauge",
        "appender.file.type = RollingFile",
        "appender.file.name = file",
        f"appender.file.fileName = {directory / SPARK_LOG}",
        f"appender.file.filePattern = {directory / SPARK_LOG}.%i",
        "appender.file.layout.type = PatternLayout",
        "appender.file.layout.pattern = %d{yyyy-MM-dd HH:mm:ss.SSS} %p %c{1}: %m%n%ex",
        "appender.file.policies.type = Policies",
        "appender.file.policies.size.type = SizeBasedTriggeringPolicy",
        f"appender.file.policies.size.size = {SPARK_LOG_BYTES}",
        "appender.file.strategy.type = DefaultRolloverStrategy",
        f"appender.file.strategy.max = {SPARK_LOG_KEEP}",
        # One line per ERROR event, no stack trace: what the terminal shows, naming spark.log.
        "appender.errors.type = RollingFile",
        "appender.errors.name = errors",
        f"appender.errors.fileName = {directory / SPARK_ERRORS}",
        f"appender.errors.filePattern = {directory / SPARK_ERRORS}.%i",
        "appender.errors.layout.type = PatternLayout",
        "appender.errors.layout.alwaysWriteExceptions = false",
        "appender.errors.layout.pattern = "
        "%d{yyyy-MM-dd HH:mm:ss} %p %c{1}: %maxLen{%replace{%m}{[\\r\\n]+}{ }}{400}%n",
        "appender.errors.filter.threshold.type = ThresholdFilter",
        "appender.errors.filter.threshold.level = error",
        "appender.errors.policies.type = Policies",
        "appender.errors.policies.size.type = SizeBasedTriggeringPolicy",
        "appender.errors.policies.size.size = 1MB",
        "appender.errors.strategy.type = DefaultRolloverStrategy",
        "appender.errors.strategy.max = 1",
        "rootLogger.level = warn",
        "rootLogger.appenderRef.file.ref = file",
        "rootLogger.appenderRef.errors.ref = errors",
        f"logger.behind.name = {BATCH_FALLING_BEHIND_LOGGER}",
        "logger.behind.level = error",
    ]
    if echo:
        lines += [
            "appender.console.type = Console",
            "appender.console.name = console",
            "appender.console.target = SYSTEM_ERR",
            "appender.console.layout.type = PatternLayout",
            "appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex",
            "rootLogger.appenderRef.console.ref = console",
        ]
    return "\n".join(lines) + "\n"
