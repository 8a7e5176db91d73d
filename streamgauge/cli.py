"""``streamgauge``: run | ingest | process | validate | send | query | replay | grafana | status
| top.

``run`` is the whole daemon on one machine: an embedded PostgreSQL (unless ``--postgres-url``),
receiver processes writing the segment log, and the Spark window job in this process (see
``daemon.py``). ``ingest`` and ``process`` run the two halves alone, for several hosts sharing
one spool. ``status``, ``top`` and the terminal of ``run`` are in ``streamgauge.operator``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streamgauge.clock import SystemClock
from streamgauge.operator.snapshot import first_line as _first_line
from streamgauge.operator.snapshot import json_value

if TYPE_CHECKING:  # the daemon pulls in PySpark: imported only by the commands that run it
    from streamgauge.daemon import WindowJob
    from streamgauge.operator.jvm_logs import JvmLogs
    from streamgauge.windows.plan import WindowPlan

DEFAULT_CONFIG = "configs/quickstart.yaml"
DEFAULT_DATA_DIR = "streamgauge-data"
DEFAULT_LISTEN = "127.0.0.1:8125"
DEFAULT_MASTER = "local[*]"
RECEIVER_NAME = "udp-0"

log = logging.getLogger("streamgauge")


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(grafana=not words or words[0] not in QUICK_COMMANDS)
    args = parser.parse_args(words)
    # `run` replaces this with its terminal (operator.terminal) once its data dir exists.
    logging.basicConfig(
        level=_log_level(args),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("py4j").setLevel(logging.WARNING)
    handler: Any = args.handler
    return int(handler(args))


LOG_LEVELS = ("debug", "info", "warning", "error")


def _log_level(args: argparse.Namespace) -> int:
    """``--log-level``, else DEBUG with ``-v``, else INFO for the daemons, WARNING otherwise."""
    named = getattr(args, "log_level", None)
    if named:
        return int(getattr(logging, named.upper()))
    if getattr(args, "verbose", False):
        return logging.DEBUG
    return logging.INFO if args.command in ("run", "ingest", "process") else logging.WARNING


#: Commands a person runs while the daemon keeps the cores busy: their parser leaves out the
#: ``grafana`` commands, whose package imports the Grafana SDK and pydantic (a third of a
#: second idle, a second on a loaded machine) before any of them runs.
QUICK_COMMANDS = frozenset({"status", "top", "query", "send"})


def build_parser(*, grafana: bool = True) -> argparse.ArgumentParser:
    """The whole command line; ``grafana=False`` has a ``grafana`` command that only names
    itself (for ``QUICK_COMMANDS``, which never reach it)."""
    parser = argparse.ArgumentParser(prog="streamgauge", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser, *, config: bool = True) -> None:
        if config:
            p.add_argument("--config", default=DEFAULT_CONFIG, help="window config YAML")
        p.add_argument("--data-dir", default=DEFAULT_DATA_DIR, type=Path,
                       help="segment log, checkpoints, embedded PostgreSQL (default ./%(default)s)")
        p.add_argument("-v", "--verbose", action="store_true",
                       help="debug logging; with run, Spark's and the JVM's output on the "
                       "terminal too (it always goes to DATA_DIR/logs/)")
        p.add_argument("--log-level", choices=LOG_LEVELS,
                       help="streamgauge's own messages (default info for run, ingest and "
                       "process)")

    run = commands.add_parser("run", help="the whole daemon: receivers, Spark job, store")
    common(run)
    run.add_argument("--listen", action="append", metavar="ADDR",
                     help="udp://HOST:PORT, tcp://HOST:PORT, unixgram:///PATH or HOST:PORT (UDP); "
                     f"repeatable (default {DEFAULT_LISTEN})")
    run.add_argument("--receivers", type=int, default=1, metavar="N",
                     help="ingest processes sharing each UDP port with SO_REUSEPORT, streams "
                     "udp-0..udp-N-1; TCP and Unix listeners are served by udp-0 (default 1)")
    run.add_argument("--postgres-url", help="use this PostgreSQL instead of the embedded one")
    run.add_argument("--pg-port", type=int, help="TCP port of the embedded PostgreSQL")
    run.add_argument("--master", default=DEFAULT_MASTER, help="Spark master (default %(default)s)")
    run.add_argument("--trigger", help=_TRIGGER_HELP)
    run.add_argument("--status-every", type=float, metavar="SECONDS",
                     help="how often the status line is drawn (default 1 on a terminal, where "
                     "it is redrawn in place; 30 otherwise, as a line of its own)")
    retention_flags(run)
    spool_flag(run)
    spool_quota_flag(run)
    receiver_flags(run)
    run.set_defaults(handler=cmd_run)

    ingest = commands.add_parser("ingest", help="receiver only (UDP, TCP, Unix datagram), "
                                 "writing one stream of the segment log")
    common(ingest)
    ingest.add_argument("--listen", action="append", metavar="ADDR",
                        help="udp://HOST:PORT, tcp://HOST:PORT, unixgram:///PATH or HOST:PORT "
                        f"(UDP); repeatable, one process serves them all "
                        f"(default {DEFAULT_LISTEN})")
    ingest.add_argument("--receiver", default=RECEIVER_NAME, help="stream name in the spool")
    receiver_flags(ingest)
    spool_flag(ingest)
    spool_quota_flag(ingest)
    ingest.add_argument("--inherit-fd", type=int, action="append", help=argparse.SUPPRESS)
    ingest.set_defaults(handler=cmd_ingest)

    process = commands.add_parser("process", help="Spark window job only, reading the spool")
    common(process)
    process.add_argument("--postgres-url")
    process.add_argument("--pg-port", type=int)
    process.add_argument("--master", default=DEFAULT_MASTER)
    process.add_argument("--trigger", help=_TRIGGER_HELP)
    retention_flags(process)
    spool_quota_flag(process)  # its janitor frees committed segments for the receivers' quota
    spool_flag(process)
    process.set_defaults(handler=cmd_process)

    validate = commands.add_parser("validate", help="check a config; print the compiled form")
    validate.add_argument("file")
    validate.set_defaults(handler=cmd_validate)

    send = commands.add_parser("send", help="send StatsD lines over UDP")
    send.add_argument("lines", nargs="+", help="lines such as 'api.requests:1|c'; - reads stdin")
    send.add_argument("--to", default=DEFAULT_LISTEN, help="HOST:PORT (default %(default)s)")
    send.set_defaults(handler=cmd_send)

    query = commands.add_parser("query", help="run SQL against the result store")
    query.add_argument("sql")
    where = query.add_mutually_exclusive_group()
    where.add_argument("--data-dir", type=Path, default=Path(DEFAULT_DATA_DIR))
    where.add_argument("--postgres-url")
    query.add_argument("--json", action="store_true", help="one JSON object per row")
    query.set_defaults(handler=cmd_query)

    replay = commands.add_parser(
        "replay", help="recompute final windows from the segment log; publish corrections"
    )
    replay.add_argument("--from", dest="from_time", required=True,
                        help="ISO-8601 UTC (2026-11-21T10:00:00Z) or epoch seconds")
    replay.add_argument("--to", dest="to_time", required=True, help="same forms; exclusive")
    replay.add_argument("--config", default=DEFAULT_CONFIG)
    replay.add_argument("--data-dir", type=Path, default=Path(DEFAULT_DATA_DIR))
    replay.add_argument("--postgres-url")
    spool_flag(replay)
    replay.set_defaults(handler=cmd_replay)

    if grafana:
        from streamgauge.grafana.commands import register as register_grafana

        register_grafana(commands)
    else:
        commands.add_parser("grafana", help="Grafana dashboards and alert rules")

    status = commands.add_parser("status", help="what a running daemon is doing")
    status.add_argument("--data-dir", type=Path, default=Path(DEFAULT_DATA_DIR))
    status.add_argument("--json", action="store_true",
                        help="the whole status as one JSON document (docs/self-metrics.md)")
    status.add_argument("--watch", type=float, nargs="?", const=2.0, metavar="SECONDS",
                        help="redraw every SECONDS (default 2) until Ctrl-C; with --json one "
                        "document per line")
    spool_flag(status)
    status.set_defaults(handler=cmd_status)

    top = commands.add_parser("top", help="the heaviest metrics and series right now")
    top.add_argument("--data-dir", type=Path, default=Path(DEFAULT_DATA_DIR))
    spool_flag(top)
    top.add_argument("--seconds", type=float, default=10.0,
                     help="how much of the segment log to read, back from now "
                     "(default %(default)s)")
    top.add_argument("--limit", type=int, default=15, metavar="N",
                     help="metrics and series shown (default %(default)s)")
    top.add_argument("--json", action="store_true", help="one JSON document")
    top.add_argument("--watch", type=float, nargs="?", const=2.0, metavar="SECONDS",
                     help="redraw every SECONDS (default 2) until Ctrl-C")
    top.set_defaults(handler=cmd_top)
    return parser


#: The receiver settings ``run`` passes through to its ``ingest`` children (flag, dest).
RECEIVER_FLAGS = (
    ("--max-skew", "max_skew"), ("--max-series", "max_series"),
    ("--max-series-per-metric", "max_series_per_metric"), ("--series-ttl", "series_ttl"),
    ("--max-line-bytes", "max_line_bytes"), ("--max-tags", "max_tags"), ("--rcvbuf", "rcvbuf"),
    ("--unix-mode", "unix_mode"), ("--worker-nice", "worker_nice"),
)  # fmt: skip


def receiver_flags(p: argparse.ArgumentParser) -> None:
    """Flags of the receivers, on ``ingest`` and on ``run`` (which hands them to its children)."""
    p.add_argument("--max-skew", type=float, default=600, metavar="SECONDS",
                   help="a DogStatsD |T timestamp is the event time only within this many "
                   "seconds of the receive clock (default %(default)s)")
    p.add_argument("--max-series", type=int, metavar="N",
                   help="active series per receiver before new ones fold into the "
                   "overflow series; 0 = no limit (default 100000)")
    p.add_argument("--max-series-per-metric", type=int, metavar="N",
                   help="active series per metric name; 0 = no limit (default 10000)")
    p.add_argument("--series-ttl", type=float, metavar="SECONDS",
                   help="a series stays active this long after its last sample (default 600)")
    p.add_argument("--max-line-bytes", type=int, metavar="N", help="(default 4096)")
    p.add_argument("--max-tags", type=int, metavar="N", help="tags per line (default 64)")
    p.add_argument("--rcvbuf", type=int, metavar="BYTES",
                   help="socket receive buffer (default 8 MiB)")
    p.add_argument("--unix-mode", default="0600", choices=["0600", "0660"],
                   help="permissions of unixgram sockets (default %(default)s)")
    p.add_argument("--worker-nice", type=int, metavar="N",
                   help="nice steps the receive loop and segment writer run below the socket "
                   "readers, so a reader waking to a filling buffer gets a core; 0 = alike "
                   "(default 8; Linux)")


def spool_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--spool", metavar="LOCATION",
        help="the segment log: a directory, or a pyarrow.fs URI that several hosts share, "
        "e.g. s3://bucket/prefix?region=eu-west-1 (default DATA_DIR/spool)",
    )  # fmt: skip


def _spool_location(args: argparse.Namespace) -> str:
    """``--spool`` as given (a path or a URI), or ``DATA_DIR/spool``; raises ``ValueError``
    (redacted: the URI may hold credentials) if pyarrow.fs cannot open it."""
    from streamgauge.ingest.spool_fs import resolve_spool

    location = args.spool or str(args.data_dir.resolve() / "spool")
    if "://" not in location:
        location = str(Path(location).resolve())  # children and Spark may run elsewhere
    resolve_spool(location)
    return location


def spool_quota_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--spool-quota", default="0", metavar="SIZE",
        help="disk quota of the segment log, all receivers together (e.g. 20GiB, 500MB); "
        "over it receivers refuse new data and count it as streamgauge.ingest.refused "
        "{reason=spool_quota} until retention frees space; 0 = none (default)",
    )  # fmt: skip


def retention_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--retain-log", default="3d", metavar="AGE",
        help="keep segments this long for replay, once every query has read them "
        "(default %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--retain-results", default="90d", metavar="AGE",
        help="delete windows that ended longer ago than this (default %(default)s)",
    )  # fmt: skip


# -- validate -----------------------------------------------------------------------------------


def cmd_validate(args: argparse.Namespace) -> int:
    import yaml

    from streamgauge.configs import ConfigError, describe_sketches, load_config

    try:
        config = load_config(args.file)
    except ConfigError as error:
        print(error, file=sys.stderr)
        print(f"{args.file}: {len(error.issues)} error(s)", file=sys.stderr)
        return 1
    print(yaml.safe_dump(config.to_canonical_dict(), sort_keys=False), end="")
    # As YAML comments, so the output still loads as the config it describes.
    described = describe_sketches(config.sketches, config.kll_windows)
    print("".join(f"# {line}\n" for line in described), end="")
    for warning in config.warnings:
        print(f"{args.file}: warning: {warning}", file=sys.stderr)
    return 0


def _check_retention_or_exit(args: argparse.Namespace) -> None:
    from streamgauge.configs import parse_duration_ms

    for flag in ("retain_log", "retain_results"):
        try:
            parse_duration_ms(getattr(args, flag))
        except ValueError as error:
            raise SystemExit(f"--{flag.replace('_', '-')}: {error}") from None


def _load_config_or_exit(path: str) -> Any:
    from streamgauge.configs import ConfigError, load_config

    try:
        return load_config(path)
    except ConfigError as error:
        print(error, file=sys.stderr)
        raise SystemExit(1) from None


# -- run / ingest / process ---------------------------------------------------------------------


def _tell_waiting_for_receiver(stream: str, holder: str) -> None:
    log.warning("waiting for receiver %s of the previous run (%s) to write its closing segment",
                stream, holder)  # fmt: skip


def _worker_nice(args: argparse.Namespace) -> int:
    """``--worker-nice``, or the receivers' default (``ingest/priority.py``)."""
    from streamgauge.ingest.priority import DEFAULT_WORKER_NICE

    return DEFAULT_WORKER_NICE if args.worker_nice is None else int(args.worker_nice)


def cmd_ingest(args: argparse.Namespace) -> int:
    import dataclasses

    from streamgauge.ingest.guard import CardinalityLimits
    from streamgauge.ingest.process import (
        IngestSettings,
        parse_byte_size,
        run_ingest,
        sockets_from_fds,
    )
    from streamgauge.ingest.protocol import DEFAULT_LIMITS
    from streamgauge.ingest.stream_lock import StreamBusy
    from streamgauge.ingest.transports import DEFAULT_RCVBUF_BYTES, parse_listen_spec
    from streamgauge.windows.plan import JobPaths, WindowPlan

    config = _load_config_or_exit(args.config)
    try:
        listen = [parse_listen_spec(text) for text in args.listen or [DEFAULT_LISTEN]]
        cardinality = CardinalityLimits()
        if args.max_series is not None:
            cardinality = dataclasses.replace(cardinality, max_series=args.max_series)
        if args.max_series_per_metric is not None:
            cardinality = dataclasses.replace(
                cardinality, max_series_per_metric=args.max_series_per_metric)
        if args.series_ttl is not None:
            cardinality = dataclasses.replace(cardinality, ttl_ms=round(args.series_ttl * 1000))
        limits = DEFAULT_LIMITS
        if args.max_line_bytes is not None:
            limits = dataclasses.replace(limits, max_line_bytes=args.max_line_bytes)
        if args.max_tags is not None:
            limits = dataclasses.replace(limits, max_tags=args.max_tags)
        settings = IngestSettings(
            args.data_dir.resolve(), args.receiver, config.pane_ms,
            spool_location=_spool_location(args),
            max_skew_ms=round(args.max_skew * 1000), limits=limits, cardinality=cardinality,
            rcvbuf_bytes=args.rcvbuf or DEFAULT_RCVBUF_BYTES, unix_mode=int(args.unix_mode, 8),
            worker_nice=_worker_nice(args),
            spool_quota_bytes=parse_byte_size(args.spool_quota, "--spool-quota"),
            sketches=config.sketches, kll_k=config.kll_k,
        )
        paths = JobPaths(settings.spool, settings.checkpoints)
        settings = dataclasses.replace(
            settings, query_checkpoints=tuple(WindowPlan.of(config, paths).checkpoints))
    except ValueError as error:
        print(f"streamgauge ingest: {error}", file=sys.stderr)
        return 2
    sockets = sockets_from_fds(args.inherit_fd) if args.inherit_fd else None
    try:
        run_ingest(settings, sock=sockets, listen=listen)
    except StreamBusy as error:
        print(f"streamgauge ingest: {error}", file=sys.stderr)
        return 2
    return 0


_TRIGGER_HELP = (
    "how often the window job looks for new segments (default: 0.1 seconds); a batch runs "
    "only when it changes what a reader sees"
)


def _window_plan(args: argparse.Namespace, config: Any, data_dir: Path) -> WindowPlan:
    """What the job runs for ``config``: its queries over the spool (``--spool``; default
    ``data_dir/spool``) and checkpoints under ``data_dir`` (Spark's own, on the job's host)."""
    from streamgauge.windows.plan import JobPaths, WindowPlan

    return WindowPlan.of(config, JobPaths(_spool_location(args), data_dir / "checkpoints"))


def _window_job(
    args: argparse.Namespace, plan: WindowPlan, url: str, jvm_logs: JvmLogs | None = None
) -> WindowJob:
    from streamgauge.configs import parse_duration_ms
    from streamgauge.daemon import WindowJob
    from streamgauge.ingest.process import parse_byte_size
    from streamgauge.windows.plan import TRIGGER_INTERVAL

    return WindowJob(
        plan, url, master=args.master, trigger=args.trigger or TRIGGER_INTERVAL,
        retain_log_ms=parse_duration_ms(args.retain_log),
        retain_results_ms=parse_duration_ms(args.retain_results),
        spool_quota_bytes=parse_byte_size(getattr(args, "spool_quota", "0"), "--spool-quota"),
        jvm_logs=jvm_logs,
    )  # fmt: skip


def _job_position(plan: WindowPlan) -> tuple[dict[str, Path], dict[str, dict[str, int]]]:
    """Per window: its query's checkpoint, and the segments it has committed (per stream)."""
    from streamgauge.retention import done_sequences

    checkpoints = {query.window.name: query.checkpoint for query in plan.queries}
    return checkpoints, {name: done_sequences(path) or {} for name, path in checkpoints.items()}


def _start_store(args: argparse.Namespace, data_dir: Path) -> tuple[str, Any]:
    """The store URL, and the embedded server to stop afterwards (None if external)."""
    if args.postgres_url:
        return str(args.postgres_url), None
    from streamgauge.sinks.embedded import EmbeddedPostgres

    server = EmbeddedPostgres(data_dir, port=args.pg_port)
    return server.start(), server


def cmd_process(args: argparse.Namespace) -> int:
    from streamgauge.daemon import StopRequested, supervise
    from streamgauge.ingest.process import parse_byte_size

    config = _load_config_or_exit(args.config)
    _check_retention_or_exit(args)
    try:
        parse_byte_size(args.spool_quota, "--spool-quota")  # before the store starts
        _spool_location(args)
    except ValueError as error:
        print(f"streamgauge process: {error}", file=sys.stderr)
        return 2
    data_dir = args.data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    stop = StopRequested()
    url, server = _start_store(args, data_dir)
    try:
        job = _window_job(args, _window_plan(args, config, data_dir), url)
        stop.install()
        print(f"spark ui: {job.ui_url}", flush=True)
        failure = supervise(stop, job, ingest=None)
        job.stop(drain=failure is None)
        return 0 if failure is None else 1
    finally:
        if server is not None:
            server.stop()


def _receiver_args(args: argparse.Namespace) -> list[str]:
    """``run``'s receiver flags as the ``ingest`` command line of its children."""
    return [
        arg for flag, dest in RECEIVER_FLAGS if getattr(args, dest) is not None
        for arg in (flag, str(getattr(args, dest)))
    ]


def cmd_run(args: argparse.Namespace) -> int:
    from streamgauge.daemon import (
        StopRequested,
        shutdown,
        supervise,
        terminate_with_parent,
        write_private_json,
    )
    from streamgauge.ingest.guard import CardinalityLimits
    from streamgauge.ingest.priority import job_nice, lower_thread_priority
    from streamgauge.ingest.process import (
        IngestChildren,
        bind_receivers,
        parse_byte_size,
        udp_address,
    )
    from streamgauge.ingest.stream_lock import StreamBusy, wait_for_writers
    from streamgauge.ingest.transports import parse_listen_spec
    from streamgauge.operator.catch_up import catch_up_now
    from streamgauge.operator.jvm_logs import JvmLogs
    from streamgauge.operator.snapshot import STATUS_LINE_FILE, read_ingest, window_status
    from streamgauge.operator.terminal import (
        LiveStatus,
        SparkErrors,
        Terminal,
        banner,
        configure_daemon_logging,
        forward_lines,
        stop_summary,
    )
    from streamgauge.redaction import redact_url

    config = _load_config_or_exit(args.config)
    _check_retention_or_exit(args)
    data_dir = args.data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    run_file = data_dir / "run.json"
    run_file.unlink(missing_ok=True)
    status_line = data_dir / STATUS_LINE_FILE  # what `status` shows as the daemon's last line
    status_line.unlink(missing_ok=True)
    # The terminal shows streamgauge's words only; Spark's and the JVM's go to logs/ (-v: both).
    # A stream of its own on the terminal: while the JVM starts, fd 1 and 2 point at jvm.log
    # (jvm_logs), and what the receivers or our log say meanwhile must still reach the screen.
    screen = open(os.dup(sys.stdout.fileno()), "w", buffering=1,  # noqa: SIM115 - ours until exit
                  encoding=sys.stdout.encoding, errors="replace")  # fmt: skip
    terminal = Terminal(screen, live=screen.isatty() and not args.verbose)
    logs_dir = data_dir / "logs"
    configure_daemon_logging(terminal, logs_dir, _log_level(args), verbose=args.verbose)
    jvm_logs = JvmLogs(logs_dir, echo=args.verbose)
    spark_errors = None if args.verbose else SparkErrors(jvm_logs.errors_log, jvm_logs.spark_log)
    # The receivers say only what goes wrong unless asked (the banner says where they listen).
    child_level = args.log_level or ("debug" if args.verbose else "warning")
    stop = StopRequested()
    # bound here so a busy port fails before anything starts; one socket list per child
    try:
        parse_byte_size(args.spool_quota, "--spool-quota")  # the children get the flag as given
        spool = _spool_location(args)
        # the receivers of a run that just died may still drain into the log and hold the port
        wait_for_writers(data_dir, on_wait=_tell_waiting_for_receiver)
        groups = bind_receivers(
            [parse_listen_spec(text) for text in args.listen or [DEFAULT_LISTEN]], args.receivers)
    except (ValueError, StreamBusy) as error:
        print(f"streamgauge run: {error}", file=sys.stderr)
        return 2
    udp = udp_address(groups[0])
    url, server = _start_store(args, data_dir)
    ingest: Any = None  # IngestChildren: supervised like one Popen
    job: WindowJob | None = None
    failure: str | None = None
    live: LiveStatus | None = None
    try:
        ingest = IngestChildren([
            subprocess.Popen(
                [sys.executable, "-m", "streamgauge", "ingest", "--config", str(args.config),
                 "--data-dir", str(data_dir), "--spool", spool, "--receiver", f"udp-{index}",
                 "--spool-quota", args.spool_quota, "--log-level", child_level,
                 *_receiver_args(args),
                 *[arg for sock in sockets for arg in ("--inherit-fd", str(sock.fileno()))]],
                pass_fds=[sock.fileno() for sock in sockets],
                preexec_fn=terminate_with_parent,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            )
            for index, sockets in enumerate(groups)
        ])
        for child in ingest.children:
            forward_lines(child.stdout, terminal)
        for sockets in groups:
            for sock in sockets:
                sock.close()  # the children own them now (and remove Unix socket files)
        # The window job can catch up from the log, a receiver cannot: it yields the cores
        # to the receivers (priority.py). The threads and processes this one starts from
        # here on (the JVM, Spark's workers) inherit its nice value; the store, started
        # before, keeps serving its readers (dashboards, alerts) at theirs.
        lower_thread_priority(threading.get_native_id(), job_nice(_worker_nice(args)))
        plan = _window_plan(args, config, data_dir)
        checkpoints, started_from = _job_position(plan)
        job = _window_job(args, plan, url, jvm_logs)
        stop.install()
        limits = CardinalityLimits()
        info = {
            "udp": udp,
            "postgres_url": url,
            "spark_ui": job.ui_url,
            "data_dir": str(data_dir),
            "config": str(Path(args.config).resolve()),
            "config_name": config.name,
            "pid": os.getpid(),
            "ingest_pid": ingest.pid,
            "ingest_pids": ingest.pids,
            "logs": str(logs_dir),
            # per window: its query's checkpoint, and what it had committed when started
            # (``status`` shows a catch-up's progress from them: operator/catch_up.py)
            "checkpoints": {name: str(path) for name, path in checkpoints.items()},
            "catch_up_from": started_from,
            # per receiver, as its guard applies them (``top`` compares the series with them)
            "cardinality": {
                "max_series": limits.max_series if args.max_series is None else args.max_series,
                "max_series_per_metric": limits.max_series_per_metric
                if args.max_series_per_metric is None else args.max_series_per_metric,
            },
        }  # fmt: skip
        terminal.line(banner(
            config_name=config.name, config_path=str(args.config),
            windows=[w.name for w in config.windows],
            listen=[text for text in args.listen or [] if not _is_udp(text, udp)],
            udp=udp, store=redact_url(url), spark_ui=job.ui_url, data_dir=data_dir,
            logs_dir=logs_dir,
        ))  # fmt: skip
        # run.json last: whoever waits for it (scripts, the e2e tests) finds the banner
        # printed already (written after it, the banner lost that race in one CI run)
        write_private_json(run_file, info)
        every = args.status_every or (1.0 if terminal.live else 30.0)
        live = LiveStatus(terminal, data_dir, url, every, spark_errors,
                          catch_up=lambda: catch_up_now(spool, checkpoints, started_from))
        live.start()
        failure = supervise(stop, job, ingest)
    finally:
        if live is not None:
            live.stop()

        def summary() -> None:
            if failure is None and job is not None:
                terminal.line(stop_summary(read_ingest(data_dir), window_status(url)))

        failure = shutdown(ingest, job, server, failure, before_store_stops=summary) or failure
        run_file.unlink(missing_ok=True)
        status_line.unlink(missing_ok=True)
    if failure:
        log.error("%s", failure)
        return 1
    return 0


def _is_udp(listen: str, udp: str) -> bool:
    """Whether ``--listen`` text names the UDP address the banner already shows."""
    return listen.removeprefix("udp://") == udp


# -- send / query / status ----------------------------------------------------------------------


def cmd_send(args: argparse.Namespace) -> int:
    import statsd

    from streamgauge.ingest.process import parse_listen

    host, port = parse_listen(args.to)
    lines = [line for arg in args.lines for line in _expand_stdin(arg)]
    client = statsd.StatsClient(host, port)
    # The client's incr/timing/gauge sample client-side and rewrite the line; `send` must put
    # each line on the wire exactly as given, so it uses the client's transport directly.
    for line in lines:
        client._send(line)
    client.close()
    print(f"sent {len(lines)} line(s) to {host}:{port}", file=sys.stderr)
    return 0


def _expand_stdin(arg: str) -> list[str]:
    if arg != "-":
        return [arg]
    return [line.rstrip("\n") for line in sys.stdin if line.strip()]


def cmd_query(args: argparse.Namespace) -> int:
    """Run SQL on the store. With ``--data-dir`` and no daemon running, the embedded store is
    started for the query and stopped again, so results stay readable after a shutdown."""
    import psycopg

    from streamgauge.redaction import redact_url
    from streamgauge.sinks.store import run_sql

    url, server = _query_store(args)
    try:
        columns, rows = run_sql(url, args.sql)
    except psycopg.OperationalError as error:
        print(f"cannot reach the store at {redact_url(url)}: {_first_line(error)}", file=sys.stderr)
        return 1
    except psycopg.Error as error:
        print(f"query failed: {_first_line(error)}", file=sys.stderr)
        return 1
    finally:
        if server is not None and not server.adopted:
            server.stop()
    if args.json:
        for row in rows:
            print(json.dumps(dict(zip(columns, row, strict=True)), default=json_value))
        return 0
    from streamgauge.operator.table import aligned, tsv

    cells = [[_query_cell(v) for v in row] for row in rows]
    if sys.stdout.isatty():  # a person reads it: aligned, and how many rows
        if columns:
            print(aligned(columns, cells))
        print(f"({len(rows)} row{'' if len(rows) == 1 else 's'})")
    elif columns or cells:  # a program reads it: one row per line, tab-separated
        print(tsv(columns, cells))
    return 0


def _query_cell(value: Any) -> str | None:
    """A store value as one cell: JSON for jsonb (tags), ISO-8601 UTC for timestamps."""
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True)
    return None if value is None else str(json_value(value))


def cmd_replay(args: argparse.Namespace) -> int:
    """Recompute final windows overlapping [--from, --to) with their late partials."""
    from streamgauge.operator.progress import WindowProgress
    from streamgauge.sinks.store import ResultStore
    from streamgauge.windows.replay import parse_time_ms, replay

    config = _load_config_or_exit(args.config)
    try:
        from_ms, to_ms = parse_time_ms(args.from_time), parse_time_ms(args.to_time)
    except ValueError as error:
        print(f"replay: {error}", file=sys.stderr)
        return 2
    url, server = _query_store(args)
    try:
        store = ResultStore(url)
        store.ensure_schema()
        # progress on stderr, the result on stdout
        progress = WindowProgress("replay", sys.stderr)
        progress.start()
        try:
            report = replay(
                config, _spool_location(args), store, SystemClock(),
                from_ms=from_ms, to_ms=to_ms, on_window=progress.window,
            )  # fmt: skip
        finally:
            progress.stop()
            store.close()
    finally:
        if server is not None and not server.adopted:
            server.stop()
    for item in report:
        if item.skipped:
            print(f"{config.name}.{item.window_name}: skipped: {item.skipped}")
            continue
        if item.watermark_ms is None:
            print(f"{config.name}.{item.window_name}: no watermark yet: nothing is final")
            continue
        superseded = (
            f", {item.windows_retracted} superseded session(s) removed"
            if item.windows_retracted else ""
        )  # fmt: skip
        print(
            f"{config.name}.{item.window_name}: {item.windows_recomputed} final window(s) "
            f"recomputed, {item.windows_corrected} corrected, "
            f"{item.late_partials_applied} late partial(s) applied{superseded}"
        )
    return 0


def _query_store(args: argparse.Namespace) -> tuple[str, Any]:
    """The URL to query, and an embedded server started for it (None if one is running)."""
    if args.postgres_url:
        return str(args.postgres_url), None
    data_dir = args.data_dir.resolve()
    run_file = data_dir / "run.json"
    if run_file.exists():
        return str(json.loads(run_file.read_text())["postgres_url"]), None
    if not (data_dir / "postgres.json").exists():
        raise SystemExit(
            f"no store under {data_dir}: start `streamgauge run --data-dir {data_dir}` "
            "or pass --postgres-url"
        )
    from streamgauge.sinks.embedded import EmbeddedPostgres

    server = EmbeddedPostgres(data_dir)
    return server.start(), server


def cmd_status(args: argparse.Namespace) -> int:
    """A table for a person, ``--json`` for programs; ``--watch`` redraws it. Reads files
    and one query (``operator.snapshot``): no PySpark, so it answers while Spark is busy."""
    from streamgauge.operator.snapshot import json_value, status_document

    data_dir = args.data_dir.resolve()
    spool = _spool_location(args)
    if args.watch is None:
        document = status_document(data_dir, spool)
        if args.json:
            print(json.dumps(document, indent=2, default=json_value))
        else:
            from streamgauge.operator.status_table import render

            print(render(document), end="")
        return 0
    return _watch_status(data_dir, spool, args.watch, as_json=args.json)


def _watch_status(data_dir: Path, spool: str, every_s: float, *, as_json: bool) -> int:
    """Every ``every_s``: the table redrawn from the top of the terminal (plain repeats when
    not a terminal), or one JSON document per line. Ctrl-C ends it."""
    import time

    from streamgauge.operator.snapshot import json_value, status_document
    from streamgauge.operator.status_table import render

    earlier: dict[str, Any] | None = None
    try:
        while True:
            started = time.monotonic()
            document = status_document(data_dir, spool)
            if as_json:
                print(json.dumps(document, default=json_value), flush=True)
            else:
                text = render(document, earlier=earlier, interval_s=every_s)
                if sys.stdout.isatty():
                    text = "\x1b[H\x1b[2J" + text  # home, clear: the table in place
                stamp = time.strftime("%H:%M:%S")
                print(f"{text}\n{stamp}  every {every_s:g} s, Ctrl-C to stop", flush=True)
            earlier = document
            time.sleep(max(0.0, every_s - (time.monotonic() - started)))
    except KeyboardInterrupt:
        return 0


def cmd_top(args: argparse.Namespace) -> int:
    """Per metric and series, from the last ``--seconds`` of the log (``operator.top``)."""
    import time

    from streamgauge.operator.top import collect, render

    if args.seconds <= 0 or args.limit <= 0:
        print("streamgauge top: --seconds and --limit must be positive", file=sys.stderr)
        return 2
    data_dir = args.data_dir.resolve()
    spool = _spool_location(args)
    try:
        while True:
            report = collect(data_dir, spool, args.seconds)
            if args.json:
                print(json.dumps(report.to_json(args.limit), indent=None if args.watch else 2),
                      flush=True)  # fmt: skip
            else:
                text = render(report, args.limit)
                if args.watch and sys.stdout.isatty():
                    text = "\x1b[H\x1b[2J" + text  # home, clear: the table in place
                print(text, end="", flush=True)
            if args.watch is None:
                return 0
            time.sleep(args.watch)
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
