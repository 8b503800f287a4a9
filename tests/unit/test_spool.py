"""The dead-letter spool on local disk: durable files, private modes, drained and settled
without losing or duplicating entries, unreadable lines set aside."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import stat
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from jobbers_celery.core.records import DeadLetter
from jobbers_celery.deadletter.spool import DeadLetterSpool, default_spool_root, spool_directory

SECRET = "tok-51d0e2a9"


def _entry(task_id: str = "sp-1", attempt: int = 1, **over: Any) -> DeadLetter:
    values: dict[str, Any] = {
        "task_id": task_id, "name": "proj.charge", "version": 1, "queue": "billing",
        "reason": "failed", "args": [SECRET, 42], "kwargs": {"card": {"token": SECRET}},
        "exception_type": "builtins.ValueError", "exception_message": "declined",
        "traceback": "Traceback ...", "attempt": attempt, "retry_attempt": 0,
        "worker": "w1@host", "failed_at": datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
        "checkpoint": {"step": 3}, "options": {"queue": "billing"},
    }
    values.update(over)
    return DeadLetter(**values)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_write_keeps_entries_in_a_private_file(tmp_path: Path) -> None:
    spool = DeadLetterSpool(tmp_path / "a" / "spool")
    assert spool.paths() == []  # no directory yet: nothing waits, nothing is created
    assert not (tmp_path / "a").exists()
    old = os.umask(0)  # even a permissive umask gives private files
    try:
        path = spool.write([_entry("sp-1"), _entry("sp-2", attempt=3)])
    finally:
        os.umask(old)
    assert path.parent == spool.directory
    assert _mode(spool.directory) == 0o700
    assert _mode(path) == 0o600
    lines = path.read_text().splitlines()
    assert [json.loads(line)["task_id"] for line in lines] == ["sp-1", "sp-2"]
    assert spool.paths() == [path]
    assert spool.has_entries()
    assert spool.count() == 2
    assert [p.name for p in spool.directory.iterdir()] == [path.name]  # no temporary left


def test_an_existing_shared_directory_is_made_private(tmp_path: Path) -> None:
    directory = tmp_path / "spool"
    directory.mkdir(mode=0o777)
    os.chmod(directory, 0o777)
    DeadLetterSpool(directory).write([_entry()])
    assert _mode(directory) == 0o700


def test_claim_reads_back_every_entry_and_done_removes_the_file(tmp_path: Path) -> None:
    spool = DeadLetterSpool(tmp_path)
    entries = [_entry(f"sp-{i}", failed_at=datetime(2026, 1, 2, 3, 4, i, tzinfo=UTC))
               for i in range(5)]
    path = spool.write(entries)
    with spool.claim(path) as claimed:
        assert claimed is not None
        assert claimed.entries == entries  # every field, datetimes included
        spool.done(claimed)
    assert spool.paths() == []
    with spool.claim(path) as gone:
        assert gone is None


def test_done_with_entries_left_keeps_them_in_a_new_file(tmp_path: Path) -> None:
    spool = DeadLetterSpool(tmp_path)
    entries = [_entry(f"sp-{i}") for i in range(4)]
    first = spool.write(entries)
    with spool.claim(first) as claimed:
        assert claimed is not None
        spool.done(claimed, entries[2:])
    [second] = spool.paths()
    assert second != first
    assert _mode(second) == 0o600
    with spool.claim(second) as claimed:
        assert claimed is not None
        assert claimed.entries == entries[2:]


def test_files_are_drained_oldest_first(tmp_path: Path) -> None:
    spool = DeadLetterSpool(tmp_path)
    written = [spool.write([_entry(f"sp-{i}")]) for i in range(3)]
    assert spool.paths() == written


def test_a_claimed_file_is_skipped_by_another_drainer(tmp_path: Path) -> None:
    spool = DeadLetterSpool(tmp_path)
    other = DeadLetterSpool(tmp_path)  # another process (flock: one per open file)
    path = spool.write([_entry()])
    with spool.claim(path) as mine:
        assert mine is not None
        with other.claim(path) as theirs:
            assert theirs is None
        spool.done(mine)
    with other.claim(path) as late:  # drained and removed meanwhile
        assert late is None


def test_a_drainer_that_opened_a_file_just_drained_skips_it(tmp_path: Path,
                                                            monkeypatch) -> None:
    spool = DeadLetterSpool(tmp_path)
    path = spool.write([_entry()])
    real_flock = fcntl.flock

    def flock_after_another_drained(fd: int, operation: int) -> None:
        # another drainer took the lock first, wrote the entries and removed the file
        # between this one's open() and flock()
        path.unlink()
        real_flock(fd, operation)

    monkeypatch.setattr("jobbers_celery.deadletter.spool.fcntl.flock", flock_after_another_drained)
    with spool.claim(path) as claimed:
        assert claimed is None


def test_unreadable_lines_are_set_aside_and_the_good_ones_drained(tmp_path: Path,
                                                                   caplog) -> None:
    spool = DeadLetterSpool(tmp_path)
    good = [_entry("sp-a"), _entry("sp-b")]
    path = spool.write(good)
    with path.open("ab") as f:  # a hand edit, a truncated write, a future format
        f.write(b'{"task_id": "sp-c", "args": ["' + SECRET.encode() + b'"\n')
        f.write(b'{"not": "an entry"}\n')
        f.write(b"\n")
    with caplog.at_level(logging.ERROR, logger="jobbers.deadletter"), \
            spool.claim(path) as claimed:
        assert claimed is not None
        assert claimed.entries == good
        spool.done(claimed)
    assert "2 unreadable line(s)" in caplog.text
    assert SECRET not in caplog.text
    [corrupt] = [p for p in tmp_path.iterdir()]
    assert corrupt.name.startswith("corrupt-")
    assert _mode(corrupt) == 0o600
    assert SECRET in corrupt.read_text()  # kept for a person, never drained
    assert len(corrupt.read_text().splitlines()) == 2
    assert spool.paths() == []


def test_a_writer_that_died_mid_write_leaves_a_temporary_drained_once_stale(
        tmp_path: Path) -> None:
    spool = DeadLetterSpool(tmp_path)
    spool.write([_entry("sp-x")])
    [done] = spool.paths()
    tmp = tmp_path / f".tmp-{done.name.replace('.jsonl', '')}9.jsonl"
    tmp.write_bytes(done.read_bytes() + b'{"task_id": "sp-cut", "na')  # cut mid-line
    assert spool.paths() == [done]  # a writer may still be at it
    stale = time.time() - 3600
    os.utime(tmp, (stale, stale))
    assert spool.paths() == [done, tmp]
    with spool.claim(tmp) as claimed:
        assert claimed is not None
        assert [e.task_id for e in claimed.entries] == ["sp-x"]
        spool.done(claimed)
    assert not tmp.exists()
    assert any(p.name.startswith("corrupt-") for p in tmp_path.iterdir())


def test_a_refused_write_raises(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(NotADirectoryError):
        DeadLetterSpool(tmp_path / "file" / "spool").write([_entry()])


def test_spool_directory_per_prefix_and_redis_server_without_credentials(
        tmp_path: Path) -> None:
    one = spool_directory(str(tmp_path), "jobbers", "redis://:pw@cache:6379/0")
    assert one.parent == tmp_path
    assert one.name.startswith("jobbers-")
    assert "pw" not in str(one)
    # a new password keeps the directory; another server, db or prefix does not
    assert spool_directory(str(tmp_path), "jobbers", "redis://u:other@cache:6379/0") == one
    assert spool_directory(str(tmp_path), "jobbers", "redis://cache:6379/1") != one
    assert spool_directory(str(tmp_path), "jobbers", "redis://other:6379/0") != one
    assert spool_directory(str(tmp_path), "billing", "redis://cache:6379/0") != one
    assert spool_directory("", "jobbers", "redis://cache:6379/0").parent \
        == default_spool_root()
    assert default_spool_root() == Path.home() / ".local/state/jobbers/dead-letters"
