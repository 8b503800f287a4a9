"""The liveness refresh ends the attempts the cleaner declared stalled while this worker runs
them (see ``jobbers_celery.lifecycle.liveness``): SIGTERM to the pool child, SIGKILL after the grace,
a note on the stall once the request has ended, nothing for a later attempt of the same task;
a pool that cannot stop a task warns once per attempt. End to end (real workers, Redis):
tests/integration/test_stalls.py."""

from __future__ import annotations

import logging
import signal
import threading
import time
import weakref
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import pytest
from celery.worker import state

from jobbers_celery.core.config import JobbersConfig
from jobbers_celery.lifecycle import liveness
from jobbers_celery.lifecycle.liveness import HALT_GRACE_S, Liveness
from jobbers_celery.store import Alive, Halt
from jobbers_celery.testing import InMemoryStore


class _Store(InMemoryStore):
    """The in-memory store whose liveness refresh answers with the halts given (the
    cleaner's verdicts, which no worker of one process reaches); keeps the notes sent."""

    def __init__(self) -> None:
        super().__init__()
        self.halts: tuple[Halt, ...] = ()
        self.notes: list[tuple[str, int, str]] = []
        self.running: list[str] | None = None

    def alive(self, wid: str, gaps: tuple[int, int], leases: Sequence[tuple[str, str]],
              lease_cap_ms: int, running: Sequence[str] | None = None, orphan_ms: int = 0,
              orphan_grace_ms: int | None = None,
              notes: Sequence[tuple[str, int, str]] = ()) -> Alive:
        self.notes += list(notes)
        self.running = None if running is None else list(running)
        return Alive([], [], self.halts, self.now_ms())


class _Pool:
    def __init__(self, can: bool = True) -> None:
        self.can = can
        self.signalled: list[tuple[int, int]] = []

    def terminate_job(self, pid: int, sig: int) -> None:
        if not self.can:
            raise NotImplementedError("threads")
        self.signalled.append((pid, sig))


class _Request:
    _already_cancelled = False

    def __init__(self, task_id: str, pid: int, accepted_ago_s: float) -> None:
        self.id = task_id
        self.name = "proj.freezes"
        self.worker_pid = pid
        self.time_start = time.time() - accepted_ago_s
        self.task = SimpleNamespace(name=self.name)
        self._context = SimpleNamespace()


@pytest.fixture
def active(monkeypatch: pytest.MonkeyPatch) -> weakref.WeakSet[Any]:
    requests: weakref.WeakSet[Any] = weakref.WeakSet()
    monkeypatch.setattr(state, "active_requests", requests)
    return requests


def _liveness(store: _Store, pool: _Pool) -> Liveness:
    config = JobbersConfig(redis_url="redis://unused", worker_lost_after=3)
    return Liveness(store, config, "w@h:1:abc", pool)


def test_the_stalled_attempt_is_terminated_then_killed_and_noted(
        active: weakref.WeakSet[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    store, pool = _Store(), _Pool()
    live = _liveness(store, pool)
    frozen = _Request("t1", 101, accepted_ago_s=60)
    later = _Request("t1", 102, accepted_ago_s=0.5)  # the recovered attempt, same worker
    active.add(frozen)
    active.add(later)
    store.halts = (Halt("t1", store.now_ms() - 2000, 1),)  # declared stalled 2 s ago
    live.refresh()
    assert pool.signalled == [(101, signal.SIGTERM)]
    assert frozen._already_cancelled
    assert frozen._context.jobbers_outcome_recorded
    assert not later._already_cancelled
    live.refresh()  # handed back again while it runs: not signalled twice
    assert pool.signalled == [(101, signal.SIGTERM)]
    due = live.wake_in()
    assert due is not None
    assert 0 < due <= HALT_GRACE_S
    # past the grace, still running: SIGKILL
    clock = time.monotonic() + HALT_GRACE_S + 0.1
    monkeypatch.setattr(liveness, "time", SimpleNamespace(time=time.time,
                                                          monotonic=lambda: clock))
    live.refresh()
    assert pool.signalled == [(101, signal.SIGTERM), (101, signal.SIGKILL)]
    assert live.wake_in() is None
    assert store.notes == []
    active.discard(frozen)  # billiard replaced the child: the request ended
    store.halts = ()
    live.refresh()
    [(task_id, attempt, text)] = store.notes
    assert (task_id, attempt) == ("t1", 1)
    assert text.startswith("ended by its worker (SIGTERM 2.")
    assert ", SIGKILL " in text
    assert text.endswith("s after the verdict)")
    assert pool.signalled[-1] == (101, signal.SIGKILL)  # the later attempt never signalled


def test_a_request_accepted_after_the_verdict_is_left_alone(
        active: weakref.WeakSet[Any]) -> None:
    store, pool = _Store(), _Pool()
    live = _liveness(store, pool)
    later = _Request("t2", 201, accepted_ago_s=0.2)
    active.add(later)
    store.halts = (Halt("t2", store.now_ms() - 1000, 1),)
    live.refresh()
    live.refresh()
    assert pool.signalled == []
    assert store.notes == []


def test_a_pool_that_cannot_stop_a_task_warns_once_per_attempt(
        active: weakref.WeakSet[Any], caplog: pytest.LogCaptureFixture) -> None:
    store, pool = _Store(), _Pool(can=False)
    live = _liveness(store, pool)
    frozen = _Request("t3", 301, accepted_ago_s=60)
    active.add(frozen)
    store.halts = (Halt("t3", store.now_ms() - 1000, 2),)
    with caplog.at_level(logging.WARNING, logger="jobbers.liveness"):
        for _ in range(4):
            live.refresh()
    warnings = [r for r in caplog.records if "cannot stop a running task" in r.getMessage()]
    assert len(warnings) == 1
    assert "proj.freezes[t3] attempt 2" in warnings[0].getMessage()
    [(task_id, attempt, text)] = store.notes
    assert (task_id, attempt) == ("t3", 2)
    assert "cannot stop it" in text
    assert not frozen._already_cancelled


def test_a_task_whose_end_is_being_recorded_still_counts_as_run_here(
        active: weakref.WeakSet[Any]) -> None:
    """Celery's on_failure takes a lost task out of the active requests before its end is
    recorded: a refresh in between must not report it as not run (it was then stalled and
    dead-lettered instead of failed; once in CI's test_worker_lost)."""
    store = _Store()
    keep = _Request("running-1", 11, 1)
    active.add(keep)
    live = _liveness(store, _Pool())
    with liveness.ending("ending-1"):
        live.refresh()
        assert sorted(store.running or ()) == ["ending-1", "running-1"]
        with liveness.ending("ending-1"):  # nested: counted
            pass
        live.refresh()
        assert sorted(store.running or ()) == ["ending-1", "running-1"]
    live.refresh()
    assert store.running == ["running-1"]


def test_an_end_entered_while_the_refresh_runs_is_still_counted(
        active: weakref.WeakSet[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """The interleaving the order of reads must survive: the main thread enters ending()
    and takes the request out of the active ones just before the refresh's snapshot (found
    by review: the refresh read ending() first, and sent the task in neither)."""
    store = _Store()
    request = _Request("ending-2", 12, 1)
    active.add(request)
    live = _liveness(store, _Pool())
    real = liveness._snapshot
    entered, release = threading.Event(), threading.Event()

    def on_failure() -> None:  # JobbersRequest.on_failure, on the main thread
        with liveness.ending("ending-2"):
            active.discard(request)  # Celery's task_ready
            entered.set()
            release.wait(5)  # ... the end being recorded ...

    def snapshot(requests: Any) -> list[Any]:
        threading.Thread(target=on_failure, daemon=True).start()
        assert entered.wait(5)
        return real(requests)

    monkeypatch.setattr(liveness, "_snapshot", snapshot)
    try:
        live.refresh()
    finally:
        release.set()
    assert store.running == ["ending-2"]
