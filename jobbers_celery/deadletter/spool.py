"""The dead-letter spool: a local directory where entries wait that neither the sink nor the
Redis outbox took (both unreachable), so that they outlive the process that made them.

Each parking writes one new file of JSON lines (one entry a line): written under a temporary
name, flushed to disk (``fsync``), renamed into place and the directory flushed too, so a
file is either complete or not there, also after ``kill -9`` or a power cut. Files and
directories are private to the user (0600 and 0700): entries hold the tasks' arguments.

Any process of the same application on the same machine drains the spool (the workers'
housekeeping, the retry thread of the process that parked an entry): a file is locked
(``flock``) while it is drained and removed only once every entry in it was written to the
sink or moved to the outbox; a file cut short is replaced by one holding the entries left.
Two drainers may write one entry twice; sinks are idempotent per ``(task_id, attempt)``.

A line that cannot be read back (edited by hand, or a disk error) is set aside, never
retried and never logged (it may hold secrets): handed to :attr:`DeadLetterSpool.on_unreadable`
(the dispatcher's Redis set-aside list, which operators read), or, when that is unset or
refuses, appended to a ``corrupt-*`` file in the same directory; the good lines of its file
are drained as usual.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from jobbers_celery.core.printable import escaped_logger
from jobbers_celery.core.records import DeadLetter
from jobbers_celery.core.storable import parked_json

__all__ = ["DeadLetterSpool", "SpoolFile", "default_spool_root", "spool_directory"]

log = escaped_logger("jobbers.deadletter")

_SUFFIX = ".jsonl"
_TMP_PREFIX = ".tmp-"
_CORRUPT_PREFIX = "corrupt-"
#: A temporary file older than this was left by a writer that died mid-write: its complete
#: lines are drained like a spool file's (the writer never reported them kept).
_STALE_TMP_S = 600.0


def default_spool_root() -> Path:
    """``~/.local/state/jobbers/dead-letters`` of the user running the process (a
    ``jobbers-dead-letters-<uid>`` directory in the system's temporary directory when that
    user has no home directory)."""
    try:
        return Path.home() / ".local" / "state" / "jobbers" / "dead-letters"
    except (RuntimeError, KeyError):
        return Path(tempfile.gettempdir()) / f"jobbers-dead-letters-{os.getuid()}"


def spool_directory(root: str | os.PathLike[str] | None, key_prefix: str,
                    redis_url: str) -> Path:
    """The spool of one application: ``<root>/<key_prefix>-<hash>``, where the hash names the
    Redis server (its URL without credentials), so applications that share a machine but not
    a Redis never deliver each other's entries."""
    base = Path(root) if root else default_spool_root()
    parts = urlsplit(redis_url)
    where = f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}{parts.path}"
    digest = hashlib.sha256(where.encode()).hexdigest()[:12]
    return base.expanduser() / f"{key_prefix}-{digest}"


@dataclass(frozen=True, slots=True)
class SpoolFile:
    """One spool file, read and locked by :meth:`DeadLetterSpool.claim`."""

    path: Path
    entries: list[DeadLetter]


class DeadLetterSpool:
    """A directory of dead-letter entries waiting for their sink (see the module docstring)."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self._checked = False
        #: Takes unreadable lines and the file's path; whether it kept them (else they go
        #: to a ``corrupt-*`` file).
        self.on_unreadable: Callable[[Sequence[bytes], Path], bool] | None = None

    # ------------------------------------------------------------------ writing
    def write(self, entries: Sequence[DeadLetter]) -> Path:
        """Keep ``entries`` durably in one new file; its path. Raises ``OSError`` when the
        disk refuses (the caller keeps them some other way)."""
        self._ensure_directory()
        lines = "".join(parked_json(e) + "\n" for e in entries)
        return self._write_file(lines.encode())

    def _write_file(self, data: bytes) -> Path:
        name = f"{time.time_ns():020d}-{os.getpid()}-{uuid.uuid4().hex[:8]}{_SUFFIX}"
        tmp = self.directory / f"{_TMP_PREFIX}{name}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            try:
                os.fchmod(fd, 0o600)
                _write_all(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            final = self.directory / name
            os.rename(tmp, final)
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        self._sync_directory()
        return final

    def _ensure_directory(self) -> None:
        if self._checked and self.directory.is_dir():
            return
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        mode = self.directory.stat().st_mode & 0o777
        if mode & 0o077:
            try:
                os.chmod(self.directory, 0o700)
            except OSError:
                log.warning("dead-letter spool %s is readable by other users (mode %o) and "
                            "cannot be made private", self.directory, mode)
        self._checked = True

    def _sync_directory(self) -> None:
        fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    # ------------------------------------------------------------------ reading
    def paths(self) -> list[Path]:
        """The files waiting, oldest first (``[]`` when the directory does not exist)."""
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        now = time.time()
        found = []
        for name in names:
            if name.endswith(_SUFFIX) and not name.startswith((_TMP_PREFIX, _CORRUPT_PREFIX)):
                found.append((name, self.directory / name))
            elif name.startswith(_TMP_PREFIX):
                path = self.directory / name
                with contextlib.suppress(OSError):
                    if now - path.stat().st_mtime > _STALE_TMP_S:
                        found.append((name[len(_TMP_PREFIX):], path))
        return [path for _, path in sorted(found)]

    def has_entries(self) -> bool:
        """Whether any file waits (one directory listing)."""
        return bool(self.paths())

    def count(self) -> int:
        """Entries waiting (reads every file: for tests and diagnostics)."""
        total = 0
        for path in self.paths():
            with contextlib.suppress(OSError), path.open("rb") as f:
                total += sum(1 for line in f if line.strip())
        return total

    @contextlib.contextmanager
    def claim(self, path: Path) -> Iterator[SpoolFile | None]:
        """Lock ``path`` and read its entries; ``None`` when another drainer holds it or it
        is gone. Lines that cannot be read are moved to a ``corrupt-*`` file first."""
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            yield None
            return
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    yield None
                    return
                raise
            try:
                same = os.stat(path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if not same:  # drained and removed by another process meanwhile
                yield None
                return
            with os.fdopen(os.dup(fd), "rb") as f:
                raw = f.read()
            yield SpoolFile(path, self._parse(path, raw))
        finally:
            os.close(fd)  # releases the lock

    def _parse(self, path: Path, raw: bytes) -> list[DeadLetter]:
        entries: list[DeadLetter] = []
        bad: list[bytes] = []
        for line in raw.split(b"\n"):
            if not line.strip():
                continue
            try:
                entries.append(DeadLetter.from_json(json.loads(line)))
            except Exception:  # noqa: BLE001 - any unreadable line is set aside, not lost
                bad.append(line)
        if bad and self.on_unreadable is not None and self.on_unreadable(bad, path):
            return entries
        if bad:
            target = self.set_aside(bad, path.name.removeprefix(_TMP_PREFIX))
            log.error("%d unreadable line(s) of dead-letter spool file %s set aside in %s "
                      "(not retried)", len(bad), path, target)
        return entries

    def set_aside(self, lines: Sequence[bytes], name: str) -> Path:
        """Append unreadable ``lines`` to ``corrupt-<name>`` (kept for a person to look at,
        never drained); its path. Raises ``OSError`` when the disk refuses."""
        self._ensure_directory()
        target = self.directory / f"{_CORRUPT_PREFIX}{name}"
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        try:
            _write_all(fd, b"".join(line.rstrip(b"\n") + b"\n" for line in lines))
            os.fsync(fd)
        finally:
            os.close(fd)
        self._sync_directory()
        return target

    # ------------------------------------------------------------------ settling a claim
    def done(self, claimed: SpoolFile, left: Sequence[DeadLetter] = ()) -> None:
        """``claimed`` was drained but for ``left``: keep those in a new file (first, so a
        crash in between keeps an entry twice, never zero times), then remove the old one."""
        if left:
            self.write(left)
        with contextlib.suppress(FileNotFoundError):
            claimed.path.unlink()
        self._sync_directory()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
