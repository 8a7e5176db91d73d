"""``streamgauge``: run | ingest | process | validate | send | query | status.

``run`` is the whole daemon on one machine: an embedded PostgreSQL (unless ``--postgres-url``),
one UDP receiver process writing the segment log, and the Spark window job in this process.
``ingest`` and ``process`` run the two halves alone, for several hosts sharing one spool.
"""

from __future__ import annotations

import argparse
import datetime as dt
import decimal
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from streamgauge.clock import SystemClock

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
    run.set_defaults(handler=cmd_run)

    ingest = commands.add_parser("ingest", help="receiver only (UDP, TCP, Unix datagram), "
                                 "writing one stream of the segment log")
    common(ingest)
    ingest.add_argument("--listen", action="append", metavar="ADDR",
                        help="udp://HOST:PORT, tcp://HOST:PORT, unixgram:///PATH or HOST:PORT "
                        f"(UDP); repeatable, one process serves them all "
                        f"(default {DEFAULT_LISTEN})")
    ingest.add_argument("--receiver", default=RECEIVER_NAME, help="stream name in the spool")
    ingest.add_argument("--max-skew", type=float, default=600, metavar="SECONDS",
                        help="a DogStatsD |T timestamp is the event time only within this many "
                        "seconds of the receive clock (default %(default)s)")
    ingest.add_argument("--max-series", type=int, metavar="N",
                        help="active series per receiver before new ones fold into the "
                        "overflow series; 0 = no limit (default 100000)")
    ingest.add_argument("--max-series-per-metric", type=int, metavar="N",
                        help="active series per metric name; 0 = no limit (default 10000)")
    ingest.add_argument("--series-ttl", type=float, metavar="SECONDS",
                        help="a series stays active this long after its last sample (default 600)")
    ingest.add_argument("--max-line-bytes", type=int, metavar="N", help="(default 4096)")
    ingest.add_argument("--max-tags", type=int, metavar="N", help="tags per line (default 64)")
    ingest.add_argument("--rcvbuf", type=int, metavar="BYTES",
                        help="socket receive buffer (default 8 MiB)")
    ingest.add_argument("--unix-mode", default="0600", choices=["0600", "0660"],
                        help="permissions of unixgram sockets (default %(default)s)")
    ingest.add_argument("--inherit-fd", type=int, action="append", help=argparse.SUPPRESS)
    ingest.set_defaults(handler=cmd_ingest)

    process = commands.add_parser("process", help="Spark window job only, reading the spool")
    common(process)
    process.add_argument("--postgres-url")
    process.add_argument("--pg-port", type=int)
    process.add_argument("--master", default=DEFAULT_MASTER)
    process.add_argument("--trigger", default="0.5 seconds")
    retention_flags(process)
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
    replay.set_defaults(handler=cmd_replay)

    from streamgauge.grafana.commands import register as register_grafana

    register_grafana(commands)

    status = commands.add_parser("status", help="what a running daemon is doing")
    status.add_argument("--data-dir", type=Path, default=Path(DEFAULT_DATA_DIR))
    status.set_defaults(handler=cmd_status)
    return parser


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

    from streamgauge.configs import ConfigError, load_config

    try:
        config = load_config(args.file)
    except ConfigError as error:
        print(error, file=sys.stderr)
        print(f"{args.file}: {len(error.issues)} error(s)", file=sys.stderr)
        return 1
    print(yaml.safe_dump(config.to_canonical_dict(), sort_keys=False), end="")
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


class StopRequested:
    """Turns SIGINT/SIGTERM into a flag the supervising loop polls."""

    def __init__(self) -> None:
        self.signal: int | None = None
        self.install()

    def install(self) -> None:
        """(Re)install the handlers: creating a SparkContext replaces SIGINT's with its own."""
        signal.signal(signal.SIGINT, self._handle)
        signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        self.signal = signum

    def __bool__(self) -> bool:
        return self.signal is not None


def cmd_ingest(args: argparse.Namespace) -> int:
    import dataclasses

    from streamgauge.ingest.guard import CardinalityLimits
    from streamgauge.ingest.process import IngestSettings, run_ingest, sockets_from_fds
    from streamgauge.ingest.protocol import DEFAULT_LIMITS
    from streamgauge.ingest.transports import DEFAULT_RCVBUF_BYTES, parse_listen_spec

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
            max_skew_ms=round(args.max_skew * 1000), limits=limits, cardinality=cardinality,
            rcvbuf_bytes=args.rcvbuf or DEFAULT_RCVBUF_BYTES, unix_mode=int(args.unix_mode, 8),
        )
    except ValueError as error:
        print(f"streamgauge ingest: {error}", file=sys.stderr)
        return 2
    sockets = sockets_from_fds(args.inherit_fd) if args.inherit_fd else None
    run_ingest(settings, sock=sockets, listen=listen)
    return 0


def _start_store(args: argparse.Namespace, data_dir: Path) -> tuple[str, Any]:
    """The store URL, and the embedded server to stop afterwards (None if external)."""
    if args.postgres_url:
        return str(args.postgres_url), None
    from streamgauge.sinks.embedded import EmbeddedPostgres

    server = EmbeddedPostgres(data_dir, port=args.pg_port)
    return server.start(), server


class WindowJob:
    """The Spark half of the daemon: session, one query per window, clean shutdown."""

    def __init__(self, args: argparse.Namespace, config: Any, data_dir: Path, url: str) -> None:
        from streamgauge.sinks.store import ResultStore
        from streamgauge.windows.job import JobPaths, start_window_queries
        from streamgauge.windows.session import build_spark_session

        store = ResultStore(url)
        store.ensure_schema()
        store.close()
        from streamgauge.configs import parse_duration_ms

        self.spark = build_spark_session(args.master)
        paths = JobPaths(spool=data_dir / "spool", checkpoints=data_dir / "checkpoints")
        paths.spool.mkdir(parents=True, exist_ok=True)
        self._janitor = Janitor(
            paths, config, url, parse_duration_ms(args.retain_log),
            parse_duration_ms(args.retain_results),
        )  # fmt: skip
        self.queries = start_window_queries(
            self.spark, config, paths, lambda: ResultStore(url), SystemClock(),
            trigger_interval=args.trigger,
        )

    @property
    def ui_url(self) -> str | None:
        return self.spark.sparkContext.uiWebUrl

    def failure(self) -> str | None:
        self._janitor.maybe_run()
        for query in self.queries:
            if not query.isActive:
                error = query.exception()
                return f"query {query.name} stopped: {error or 'no error reported'}"
        return None

    def stop(self, *, drain: bool) -> None:
        """Process what is in the spool (if draining), then stop each query between batches.

        ``StreamingQuery.stop`` cancels a running micro-batch; that batch would be replayed at
        the next start (exactly-once), but stopping between batches keeps shutdown clean.
        """
        problems: list[str] = []
        for query in self.queries:
            try:
                if drain and query.isActive:
                    query.processAllAvailable()
                _wait_between_batches(query, timeout_s=30)
                query.stop()
            except Exception as error:  # noqa: BLE001 - stop the other queries regardless
                problems.append(f"{query.name}: {str(error).splitlines()[0]}")
        self.spark.stop()
        if problems:
            raise RuntimeError("; ".join(problems))


class Janitor:
    """Retention, run from the supervising loop at most once a minute (see retention.py)."""

    INTERVAL_S = 60.0

    def __init__(
        self, paths: Any, config: Any, url: str, retain_log_ms: int, retain_results_ms: int
    ) -> None:
        self._paths, self._config, self._url = paths, config, url
        self._retain_log_ms, self._retain_results_ms = retain_log_ms, retain_results_ms
        self._next = time.monotonic() + self.INTERVAL_S

    def maybe_run(self) -> None:
        if time.monotonic() < self._next:
            return
        self._next = time.monotonic() + self.INTERVAL_S
        from streamgauge.retention import prune_spool
        from streamgauge.sinks.store import ResultStore, RetryPolicy
        from streamgauge.windows.job import all_checkpoints

        clock = SystemClock()
        try:
            prune_spool(self._paths.spool, all_checkpoints(self._paths, self._config),
                        self._retain_log_ms, clock)  # fmt: skip
            with ResultStore(self._url, retry=RetryPolicy(max_attempts=1)) as store:
                store.prune(clock.now_ms() - self._retain_results_ms)
        except Exception as error:  # noqa: BLE001 - retention must never stop the daemon
            log.warning("retention skipped this round: %s", str(error).splitlines()[0])


def _wait_between_batches(query: Any, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while query.isActive and query.status["isTriggerActive"] and time.monotonic() < deadline:
        time.sleep(0.02)


def cmd_process(args: argparse.Namespace) -> int:
    config = _load_config_or_exit(args.config)
    _check_retention_or_exit(args)
    data_dir = args.data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    stop = StopRequested()
    url, server = _start_store(args, data_dir)
    try:
        job = WindowJob(args, config, data_dir, url)
        stop.install()
        print(f"spark ui: {job.ui_url}", flush=True)
        failure = _supervise(stop, job, ingest=None)
        job.stop(drain=failure is None)
        return 0 if failure is None else 1
    finally:
        if server is not None:
            server.stop()


def cmd_run(args: argparse.Namespace) -> int:
    from streamgauge.ingest.process import IngestChildren, bind_receivers, udp_address
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
                 "--data-dir", str(data_dir), "--receiver", f"udp-{index}",
                 *[arg for sock in sockets for arg in ("--inherit-fd", str(sock.fileno()))]],
                pass_fds=[sock.fileno() for sock in sockets],
                preexec_fn=_terminate_with_parent,
            )
            for index, sockets in enumerate(groups)
        ])
        for sockets in groups:
            for sock in sockets:
                sock.close()  # the children own them now (and remove Unix socket files)
        job = WindowJob(args, config, data_dir, url)
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
        _write_private_json(run_file, info)
        print(
            f"streamgauge {config.name}: udp {udp} | postgres {redact_url(url)} | "
            f"spark ui {job.ui_url} | data {data_dir}\n"
            f"  send:  streamgauge send 'api.requests:1|c' --to {udp}\n"
            f"  query: streamgauge query --data-dir {data_dir} 'select * from window_results'",
            flush=True,
        )
        failure = _supervise(stop, job, ingest)
    finally:
        failure = _shutdown(ingest, job, server, failure) or failure
        run_file.unlink(missing_ok=True)
    if failure:
        log.error("%s", failure)
        return 1
    return 0


def _terminate_with_parent() -> None:
    """In the ingest child, before exec: SIGTERM when `run` dies, even by SIGKILL (Linux).

    The receiver then drains its socket, writes its closing segment and frees the port for
    the restarted daemon, instead of living on as an orphan that holds the port.
    """
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def _supervise(
    stop: StopRequested, job: WindowJob, ingest: subprocess.Popen[bytes] | None
) -> str | None:
    while not stop:
        if ingest is not None and ingest.poll() is not None:
            return f"ingest process exited with status {ingest.returncode}"
        failure = job.failure()
        if failure:
            return failure
        time.sleep(0.2)
    log.info("signal %s: stopping", stop.signal)
    return None


def _shutdown(
    ingest: subprocess.Popen[bytes] | None, job: WindowJob | None, server: Any, failure: str | None
) -> str | None:
    """Stop in data-path order so what was received reaches the store: receivers flush their
    last segment, the job processes what is in the spool, then the store stops."""
    problem = None
    if ingest is not None and ingest.poll() is None:
        ingest.send_signal(signal.SIGTERM)
        try:
            ingest.wait(timeout=30)
        except subprocess.TimeoutExpired:
            ingest.kill()
            problem = "ingest did not stop within 30 s and was killed"
    if job is not None:
        try:
            job.stop(drain=failure is None)
        except Exception as error:  # noqa: BLE001 - report, then still stop the store
            problem = f"stopping the Spark job failed: {error}"
    if server is not None:
        server.stop()
    return problem


def _write_private_json(path: Path, payload: dict[str, Any]) -> None:
    """run.json holds the store password: create it readable by the owner only."""
    temporary = path.with_suffix(".tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(payload, handle, indent=2)
    os.replace(temporary, path)


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
                spark, config, args.data_dir.resolve() / "spool", store, SystemClock(),
                from_ms=from_ms, to_ms=to_ms,
            )  # fmt: skip
        finally:
            spark.stop()
            store.close()
    finally:
        if server is not None and not server.adopted:
            server.stop()
    for item in report:
        if item.watermark_ms is None:
            print(f"{config.name}.{item.window_name}: no watermark yet: nothing is final")
            continue
        print(
            f"{config.name}.{item.window_name}: {item.windows_recomputed} final window(s) "
            f"recomputed, {item.windows_corrected} corrected, "
            f"{item.late_partials_applied} late partial(s) applied"
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
        running["postgres_url"] = redact_url(running["postgres_url"])
        report["running"] = running
    report["spool"] = describe_spool(data_dir / "spool")
    ingest_dir = data_dir / "ingest"
    if ingest_dir.exists():
        report["ingest"] = {
            p.stem: json.loads(p.read_text()) for p in sorted(ingest_dir.glob("*.json"))
        }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
