"""Where the segment log lives: a local directory, or a prefix on an object store.

A spool location is what the user names with ``--spool``: a local path (``/var/lib/sg/spool``)
or a URI that ``pyarrow.fs.FileSystem.from_uri`` understands (``s3://bucket/prefix?region=…``,
``gs://…``, ``file:///…``). ``resolve_spool`` turns it into a ``Spool``: the few file operations
the log needs (list, open, write a whole file, delete), so ``log.py`` says *what* a segment
is and this module says *how* it reaches storage.

Two ways to make a segment appear whole, one per kind of storage:

- **A file system** (a local path, NFS, ``file://``): written under a temporary name,
  fsynced by policy, renamed to its final name, and the directory fsynced, because a POSIX
  file is visible while it is written and only a rename is atomic.
- **An object store**: written to its final key in one request. An object becomes visible
  only once its upload has completed, whole (a PUT, or for a large object the final
  CompleteMultipartUpload), and a failed upload leaves nothing; S3 has been strongly
  read-after-write consistent for reads and listings since 2020. A rename would be a copy
  plus a delete there (two more requests, and not atomic), so none is made. The segment is
  encoded in memory first and written in one call, and S3 is opened with
  ``allow_delayed_open`` so a segment below the part size is one PutObject, not three
  multipart requests.

A URI may hold credentials (``s3://KEY:SECRET@bucket/…`` or ``?secret_key=…``); ``str(spool)``
is the location with them masked (``redaction.redact_location``): log that, never the URI.
"""

from __future__ import annotations

import functools
import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import pyarrow as pa
import pyarrow.fs as pafs

from streamgauge.redaction import redact_location, redact_secrets_in

#: What names a spool: a local path, or a URI string (``scheme://…``).
SpoolLike = str | os.PathLike[str]
#: Where one file of the spool is: a ``Path`` on a local spool, a key on an object store.
SpoolPath = Path | str


class Spool(ABC):
    """The spool's file operations, whatever the storage. Paths are the ones ``path`` builds."""

    #: The location as the user gave it: pass it on (Spark options, child processes), but
    #: never log it (it may hold credentials); ``str(spool)`` is the redacted form.
    location: str
    #: Whether ``write`` renames into place (and fsyncs): False on an object store.
    renames: bool

    def __str__(self) -> str:
        return redact_location(self.location)

    @abstractmethod
    def path(self, *names: str) -> SpoolPath:
        """The file or directory ``names`` below the spool's root."""

    @abstractmethod
    def list_dirs(self) -> list[str]:
        """Names of the directories directly below the root ([] if the root does not exist)."""

    @abstractmethod
    def list_files(self, directory: str) -> list[tuple[str, SpoolPath]]:
        """(name, path) of the files in ``directory`` below the root, [] if it is missing."""

    def list_names(self, directory: str) -> list[str]:
        """The names ``list_files`` gives, without building a path for each."""
        return [name for name, _ in self.list_files(directory)]

    @abstractmethod
    def size(self, path: SpoolPath) -> int:
        """Size of a file in bytes; raises ``FileNotFoundError`` if it is gone."""

    @abstractmethod
    def directory_bytes(self, directory: str) -> int:
        """Total size of the files in ``directory`` below the root (0 if it is missing)."""

    @abstractmethod
    def exists(self, path: SpoolPath) -> bool: ...

    @abstractmethod
    def open(self, path: SpoolPath) -> pa.NativeFile:
        """A random-access reader (the IPC footer is read first, then the batches)."""

    @abstractmethod
    def create(self) -> None:
        """Make the root exist (a directory; nothing on an object store)."""

    @abstractmethod
    def prepare(self, directory: str) -> None:
        """Before the first write to ``directory``: create it and remove temporaries a crash
        left (they were never part of the log)."""

    @abstractmethod
    def write(self, directory: str, name: str, data: pa.Buffer, *, fsync: bool) -> SpoolPath:
        """Make ``data`` the file ``directory/name`` atomically: no reader sees part of it.
        On failure nothing of it is left under the final name."""

    @abstractmethod
    def delete(self, path: SpoolPath) -> int:
        """Delete a file; its size in bytes (0 if someone else deleted it first)."""

    def write_with(
        self, directory: str, name: str, encode: Callable[[pa.NativeFile], None], *, fsync: bool
    ) -> tuple[SpoolPath, int]:
        """Encode a file in memory with ``encode`` and ``write`` it; (path, size in bytes)."""
        sink = pa.BufferOutputStream()
        encode(sink)
        data = sink.getvalue()
        return self.write(directory, name, data, fsync=fsync), data.size


class LocalSpool(Spool):
    """A directory: temporary name, fsync, rename, fsync of the directory (POSIX atomicity)."""

    renames = True

    def __init__(self, root: Path, location: str | None = None) -> None:
        self.root = root
        self.location = location if location is not None else str(root)

    def path(self, *names: str) -> Path:
        return self.root.joinpath(*names)

    def list_dirs(self) -> list[str]:
        if not self.root.exists():
            return []
        return [p.name for p in self.root.iterdir() if p.is_dir()]

    def list_files(self, directory: str) -> list[tuple[str, SpoolPath]]:
        try:
            entries = list(os.scandir(self.root / directory))
        except FileNotFoundError:
            return []
        return [(entry.name, Path(entry.path)) for entry in entries]

    def list_names(self, directory: str) -> list[str]:
        # A Path per entry was 85 % of listing a stream of 100k segments (1.2 of 1.45 s).
        try:
            return os.listdir(self.root / directory)
        except FileNotFoundError:
            return []

    def size(self, path: SpoolPath) -> int:
        return os.stat(path, follow_symlinks=False).st_size

    def directory_bytes(self, directory: str) -> int:
        total = 0
        try:
            entries = list(os.scandir(self.root / directory))
        except FileNotFoundError:
            return 0
        for entry in entries:  # no Path per entry (see list_names)
            try:
                total += entry.stat(follow_symlinks=False).st_size
            except FileNotFoundError:  # deleted by the janitor meanwhile
                continue
        return total

    def exists(self, path: SpoolPath) -> bool:
        return os.path.exists(path)

    def open(self, path: SpoolPath) -> pa.NativeFile:
        return pa.memory_map(str(path))

    def create(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)

    def prepare(self, directory: str) -> None:
        folder = self.root / directory
        folder.mkdir(parents=True, exist_ok=True)
        for leftover in folder.glob("*.tmp"):
            leftover.unlink()

    def write(self, directory: str, name: str, data: pa.Buffer, *, fsync: bool) -> Path:
        folder = self.root / directory
        final = folder / name
        temporary = folder / f".{name}.tmp"
        try:
            with open(temporary, "wb") as sink:
                sink.write(memoryview(data))
                sink.flush()
                if fsync:
                    os.fsync(sink.fileno())
            os.rename(temporary, final)
        except BaseException:
            # A full disk mid-write: the temporary was never part of the log.
            temporary.unlink(missing_ok=True)
            raise
        if fsync:
            _fsync_directory(folder)
        return final

    def delete(self, path: SpoolPath) -> int:
        try:
            size = self.size(path)
            os.unlink(path)
        except FileNotFoundError:
            return 0
        return size


def _fsync_directory(path: Path) -> None:
    """Make the rename itself durable (POSIX: a rename is persisted by syncing the directory)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class ObjectSpool(Spool):
    """A prefix on an object store (``pyarrow.fs``): one whole-object write per segment."""

    renames = False

    def __init__(self, filesystem: pafs.FileSystem, root: str, location: str) -> None:
        self.filesystem = filesystem
        self.root = root.rstrip("/")
        self.location = location

    def path(self, *names: str) -> str:
        return "/".join((self.root, *names))

    def list_dirs(self) -> list[str]:
        infos = self._list(self.root)
        return [info.base_name for info in infos if info.type == pafs.FileType.Directory]

    def list_files(self, directory: str) -> list[tuple[str, SpoolPath]]:
        infos = self._list(self.path(directory))
        return [(info.base_name, info.path) for info in infos if info.type == pafs.FileType.File]

    def _list(self, prefix: str) -> list[pafs.FileInfo]:
        selector = pafs.FileSelector(prefix, allow_not_found=True, recursive=False)
        infos: list[pafs.FileInfo] = self.filesystem.get_file_info(selector)
        return infos

    def size(self, path: SpoolPath) -> int:
        info = self.filesystem.get_file_info(str(path))
        if info.type != pafs.FileType.File or info.size is None:
            raise FileNotFoundError(f"{self}: {path} not found")
        return int(info.size)

    def directory_bytes(self, directory: str) -> int:
        """From one listing: an object store lists sizes with the keys."""
        infos = self._list(self.path(directory))
        return sum(info.size or 0 for info in infos if info.type == pafs.FileType.File)

    def exists(self, path: SpoolPath) -> bool:
        return bool(self.filesystem.get_file_info(str(path)).type == pafs.FileType.File)

    def open(self, path: SpoolPath) -> pa.NativeFile:
        """The whole object, fetched in one GET (after the HEAD pyarrow makes for its size).
        A segment is small (250 ms of partials), and reading it through a random-access
        file costs a ranged GET per IPC read (footer, schema, each batch): 3-4 requests."""
        with self.filesystem.open_input_stream(str(path)) as stream:
            return pa.BufferReader(stream.read_buffer())

    def create(self) -> None:
        """Nothing to create: a prefix exists once an object is under it. (The bucket must
        exist: creating buckets is the operator's decision, not the daemon's.)"""

    def prepare(self, directory: str) -> None:
        """Nothing to create: a prefix exists once an object is under it, and no temporary
        is ever written."""

    def write(self, directory: str, name: str, data: pa.Buffer, *, fsync: bool) -> str:
        """One upload to the final key (see the module docstring: an object appears whole or
        not at all). ``fsync`` does not apply: the store acknowledges a durable object."""
        final = self.path(directory, name)
        with self.filesystem.open_output_stream(final) as sink:
            sink.write(data)
        return final

    def delete(self, path: SpoolPath) -> int:
        try:
            size = self.size(path)
            self.filesystem.delete_file(str(path))
        except FileNotFoundError:
            return 0
        return size


def resolve_spool(location: SpoolLike | Spool) -> Spool:
    """The ``Spool`` a location names. A path (or a string without ``://``) is a local
    directory; ``file://`` too; any other URI goes through ``pyarrow.fs``.

    Resolved once per process and location (``functools.cache``): a Spark worker reading
    many partitions builds one S3 client, not one per segment.
    """
    if isinstance(location, Spool):
        return location
    if isinstance(location, os.PathLike):
        return LocalSpool(Path(location))
    return _resolve_text(location)


@functools.cache
def _resolve_text(location: str) -> Spool:
    if "://" not in location:
        return LocalSpool(Path(location))
    try:
        filesystem, root = pafs.FileSystem.from_uri(_with_store_defaults(location))
    except (pa.ArrowInvalid, OSError) as error:
        # pyarrow's message may quote the URI, credentials and all.
        raise ValueError(
            f"spool {redact_location(location)!r} is not a location pyarrow.fs can open: "
            f"{redact_secrets_in(str(error), location)}"
        ) from None
    if isinstance(filesystem, pafs.LocalFileSystem):
        return LocalSpool(Path(root), location)
    return ObjectSpool(filesystem, root, location)


def _with_store_defaults(location: str) -> str:
    """``allow_delayed_open=true`` on S3 unless the URI says otherwise: with it a small
    object is written with one PutObject when the stream closes, instead of creating,
    uploading and completing a multipart upload (three requests)."""
    parts = urlsplit(location)
    if parts.scheme != "s3":
        return location
    query = parse_qsl(parts.query, keep_blank_values=True)
    if any(key == "allow_delayed_open" for key, _ in query):
        return location
    query.append(("allow_delayed_open", "true"))
    return urlunsplit(parts._replace(query=urlencode(query)))
