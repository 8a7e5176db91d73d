"""``streamgauge``: run | ingest | process | validate | send | query | replay | grafana | status.

``run`` is the whole daemon on one machine: an embedded PostgreSQL (unless ``--postgres-url``),
receiver processes writing the segment log, and the Spark window job in this process (see
``daemon.py``). ``ingest`` and ``process`` run the two halves alone, for several hosts sharing
one spool.
"""

from __future__ import annotations

import argparse
import datetime as dt
import decimal
import json
import logging
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streamgauge.clock import SystemClock

if TYPE_CHECKING:  # the daemon pulls in PySpark: imported only by the commands that run it
    from streamgauge.daemon import WindowJob

DEFAULT_CONFIG = "configs/quickstart.yaml"
DEFAULT_DATA_DIR = "streamgauge-data"
DEFAULT_LISTEN = "127.0.0.1:8125"
DEFAULT_MASTER = "local[*]"
RECEIVER_NAME = "udp-0"

log = logging.getLogger("streamgauge")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    daemon = args.command in ("run", "ingest", "process")
    logging.basicConfig(
        level=logging.DEBUG if getattr(args, "verbose", False) else
        logging.INFO if daemon else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("py4j").setLevel(logging.WARNING)
    handler: Any = args.handler
    return int(handler(args))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="streamgauge", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser, *, config: bool = True) -> None:
        if config:
            p.add_argument("--config", default=DEFAULT_CONFIG, help="window config YAML")
        p.add_argument("--data-dir", default=DEFAULT_DATA_DIR, type=Path,
                       help="segment log, checkpoints, embedded PostgreSQL (default ./%(default)s)")
        p.add_argument("-v", "--verbose", action="store_true")

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
    run.add_argument("--trigger", default="0.5 seconds", help="micro-batch interval")
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
    process.add_argument("--trigger", default="0.5 seconds")
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
    replay.add_argument("--master", default=DEFAULT_MASTER)
    spool_flag(replay)
    replay.set_defaults(handler=cmd_replay)

    from streamgauge.grafana.commands import register as register_grafana

    register_grafana(commands)

    status = commands.add_parser("status", help="what a running daemon is doing")
    status.add_argument("--data-dir", type=Path, default=Path(DEFAULT_DATA_DIR))
    spool_flag(status)
    status.set_defaults(handler=cmd_status)
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


def cmd_ingest(args: argparse.Namespace) -> int:
    import dataclasses

    from streamgauge.ingest.guard import CardinalityLimits
    from streamgauge.ingest.priority import DEFAULT_WORKER_NICE
    from streamgauge.ingest.process import (
        IngestSettings,
        parse_byte_size,
        run_ingest,
        sockets_from_fds,
    )
    from streamgauge.ingest.protocol import DEFAULT_LIMITS
    from streamgauge.ingest.transports import DEFAULT_RCVBUF_BYTES, parse_listen_spec
    from streamgauge.windows.checkpoints import JobPaths, all_checkpoints

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
            worker_nice=DEFAULT_WORKER_NICE if args.worker_nice is None else args.worker_nice,
            spool_quota_bytes=parse_byte_size(args.spool_quota, "--spool-quota"),
            sketches=config.sketches, kll_k=config.kll_k,
        )
        paths = JobPaths(settings.spool, settings.checkpoints)
        settings = dataclasses.replace(
            settings, query_checkpoints=tuple(all_checkpoints(paths, config)))
    except ValueError as error:
        print(f"streamgauge ingest: {error}", file=sys.stderr)
        return 2
    sockets = sockets_from_fds(args.inherit_fd) if args.inherit_fd else None
    run_ingest(settings, sock=sockets, listen=listen)
    return 0


def _window_job(args: argparse.Namespace, config: Any, data_dir: Path, url: str) -> WindowJob:
    from streamgauge.configs import parse_duration_ms
    from streamgauge.daemon import WindowJob
    from streamgauge.ingest.process import parse_byte_size

    return WindowJob(
        config, data_dir, url, master=args.master, trigger=args.trigger,
        retain_log_ms=parse_duration_ms(args.retain_log),
        retain_results_ms=parse_duration_ms(args.retain_results),
        spool_quota_bytes=parse_byte_size(getattr(args, "spool_quota", "0"), "--spool-quota"),
        spool=_spool_location(args),
    )  # fmt: skip


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
        job = _window_job(args, config, data_dir, url)
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
    from streamgauge.ingest.process import (
        IngestChildren,
        bind_receivers,
        parse_byte_size,
        udp_address,
    )
    from streamgauge.ingest.transports import parse_listen_spec
    from streamgauge.redaction import redact_url

    config = _load_config_or_exit(args.config)
    _check_retention_or_exit(args)
    data_dir = args.data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    run_file = data_dir / "run.json"
    run_file.unlink(missing_ok=True)
    stop = StopRequested()
    # bound here so a busy port fails before anything starts; one socket list per child
    try:
        parse_byte_size(args.spool_quota, "--spool-quota")  # the children get the flag as given
        spool = _spool_location(args)
        groups = bind_receivers(
            [parse_listen_spec(text) for text in args.listen or [DEFAULT_LISTEN]], args.receivers)
    except ValueError as error:
        print(f"streamgauge run: {error}", file=sys.stderr)
        return 2
    udp = udp_address(groups[0])
    url, server = _start_store(args, data_dir)
    ingest: Any = None  # IngestChildren: supervised like one Popen
    job: WindowJob | None = None
    failure: str | None = None
    try:
        ingest = IngestChildren([
            subprocess.Popen(
                [sys.executable, "-m", "streamgauge", "ingest", "--config", str(args.config),
                 "--data-dir", str(data_dir), "--spool", spool, "--receiver", f"udp-{index}",
                 "--spool-quota", args.spool_quota, *_receiver_args(args),
                 *[arg for sock in sockets for arg in ("--inherit-fd", str(sock.fileno()))]],
                pass_fds=[sock.fileno() for sock in sockets],
                preexec_fn=terminate_with_parent,
            )
            for index, sockets in enumerate(groups)
        ])
        for sockets in groups:
            for sock in sockets:
                sock.close()  # the children own them now (and remove Unix socket files)
        job = _window_job(args, config, data_dir, url)
        stop.install()
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
        }
        print(
            f"streamgauge {config.name}: udp {udp} | postgres {redact_url(url)} | "
            f"spark ui {job.ui_url} | data {data_dir}\n"
            f"  send:  streamgauge send 'api.requests:1|c' --to {udp}\n"
            f"  query: streamgauge query --data-dir {data_dir} 'select * from window_results'",
            flush=True,
        )
        # run.json last: whoever waits for it (scripts, the e2e tests) finds the banner
        # printed already (written after it, the banner lost that race in one CI run)
        write_private_json(run_file, info)
        failure = supervise(stop, job, ingest)
    finally:
        failure = shutdown(ingest, job, server, failure) or failure
        run_file.unlink(missing_ok=True)
    if failure:
        log.error("%s", failure)
        return 1
    return 0


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
            print(json.dumps(dict(zip(columns, row, strict=True)), default=_json_value))
        return 0
    if columns:
        print("\t".join(columns))
    for row in rows:
        print("\t".join("" if v is None else str(_json_value(v)) for v in row))
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    """Recompute final windows overlapping [--from, --to) with their late partials."""
    from streamgauge.sinks.store import ResultStore
    from streamgauge.windows.replay import parse_time_ms, replay
    from streamgauge.windows.session import build_spark_session

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
        spark = build_spark_session(args.master, app_name="streamgauge-replay")
        try:
            report = replay(
                spark, config, _spool_location(args), store, SystemClock(),
                from_ms=from_ms, to_ms=to_ms,
            )  # fmt: skip
        finally:
            spark.stop()
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


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


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


def _json_value(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return value.astimezone(dt.UTC).isoformat()
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, dict | list):
        return json.dumps(value, sort_keys=True) if not isinstance(value, dict) else value
    return value


def cmd_status(args: argparse.Namespace) -> int:
    from streamgauge.ingest.log import describe_spool
    from streamgauge.redaction import redact_url

    data_dir = args.data_dir.resolve()
    report: dict[str, Any] = {"data_dir": str(data_dir)}
    run_file = data_dir / "run.json"
    if run_file.exists():
        running = json.loads(run_file.read_text())
        report["windows"] = _window_status(running["postgres_url"])
        running["postgres_url"] = redact_url(running["postgres_url"])
        report["running"] = running
    report["spool"] = describe_spool(_spool_location(args))
    ingest_dir = data_dir / "ingest"
    if ingest_dir.exists():
        report["ingest"] = {
            p.stem: json.loads(p.read_text()) for p in sorted(ingest_dir.glob("*.json"))
        }
    print(json.dumps(report, indent=2, default=_json_value))
    return 0


_WINDOW_STATUS_SQL = """
WITH w AS (
    SELECT config_name, substr(key, length('watermark_ms:') + 1) AS window_name, value_ms
    FROM pipeline_state WHERE key LIKE 'watermark_ms:%'
)
SELECT w.config_name, w.window_name, w.value_ms AS watermark_ms,
       (extract(epoch from now()) * 1000)::bigint - w.value_ms AS watermark_lag_ms,
       (SELECT count(*) FROM window_results r
        WHERE (r.config_name, r.window_name) = (w.config_name, w.window_name)) AS windows_emitted,
       -- what the view shows as pending: window_pending's rows (and any the first design
       -- left in window_panes or window_held); windows the job holds in memory are not there
       (SELECT count(*) FROM window_latest p
        WHERE (p.config_name, p.window_name) = (w.config_name, w.window_name)
          AND p.status = 'pending') AS windows_pending,
       (SELECT coalesce(sum(count), 0)::bigint FROM late_events l
        WHERE (l.config_name, l.window_name) = (w.config_name, w.window_name)) AS late_samples
FROM w ORDER BY 1, 2
"""


def _window_status(url: str) -> list[dict[str, Any]] | str:
    """Per window: the watermark, how far it is behind now, and what is emitted or waiting."""
    import psycopg

    from streamgauge.sinks.store import run_sql

    try:
        columns, rows = run_sql(url, _WINDOW_STATUS_SQL, ())
    except psycopg.Error as error:
        return f"store unavailable: {_first_line(error)}"
    return [dict(zip(columns, row, strict=True)) for row in rows]


if __name__ == "__main__":
    raise SystemExit(main())
