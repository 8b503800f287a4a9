"""Paced resubmits' Redis state (run_claim/run_settle/run_control.lua) against a real Redis,
no worker: the stop rule over the last N settled, and two scheduler passes racing over one
run never publishing an entry twice."""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime

import pytest

from jobbers_celery import ResubmitRunConflict, ResubmitVersion, TaskState
from jobbers_celery.core.records import DeadLetter
from jobbers_celery.resubmit.pace import ResubmitPace, RunStatus
from jobbers_celery.resubmit.pacer import Pacer, control, read, start
from jobbers_celery.store import RedisStore
from tests.conftest import wait_for
from tests.integration.store_helpers import put_in_state

pytestmark = pytest.mark.redis


def _entry(task_id: str, attempt: int = 1) -> DeadLetter:
    return DeadLetter(task_id=task_id, name="t", version=1, queue="q", reason="failed",
                      args=[], kwargs={}, exception_type="ValueError", exception_message="x",
                      traceback=None, attempt=attempt, retry_attempt=0, worker=None,
                      failed_at=datetime.now(UTC))


def _start(store: RedisStore, n: int, pace: ResubmitPace, first: str | None = None
           ) -> tuple[int, list[str]]:
    ids = [f"race-{i}" for i in range(n)]
    if first is not None:  # claimed alone: the first claim of a run takes one entry
        ids.remove(first)
        ids.insert(0, first)
    run_id = start(store, [_entry(i) for i in ids], pace, reset_retry_count=True,
                   version=ResubmitVersion.ENTRY, selection={"task_ids": ids},
                   source="test", username="")
    return run_id, ids


def test_two_scheduler_passes_racing_publish_each_entry_once(
        make_store: Callable[..., RedisStore]) -> None:
    """Two pacers (two workers: their own connections) drive one run of 300 entries at the
    fastest pace, each in its own thread, until it is done: every entry is published by
    exactly one of them, and the counters say so."""
    prefix = f"pace{time.monotonic_ns()}"
    run_id, ids = _start(make_store(prefix), 300, ResubmitPace(500))
    published: dict[int, list[str]] = collections.defaultdict(list)
    lock = threading.Lock()

    def racer(n: int) -> None:
        store = make_store(prefix)

        def publish(entries: list[DeadLetter], reset: bool, version: ResubmitVersion
                    ) -> list[str]:
            with lock:
                published[n].extend(e.task_id for e in entries)
            return [e.task_id for e in entries]

        pacer = Pacer(store, lambda task_id, attempt: _entry(task_id, attempt), publish, 30)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            pacer.pass_once()
            info = read(store, run_id)
            if info is not None and not info.active and info.in_flight == 0:
                return
        raise AssertionError("the run did not finish")

    threads = [threading.Thread(target=racer, args=(n,)) for n in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    everything = published[1] + published[2]
    print(f"race: pacer 1 published {len(published[1])}, pacer 2 {len(published[2])}, "
          f"duplicates {len(everything) - len(set(everything))}")
    assert sorted(everything) == sorted(ids)  # each once, none lost
    info = read(make_store(prefix), run_id)
    assert info is not None
    assert info.status == RunStatus.DONE
    # no record exists for these ids: each settles once as "ended otherwise"
    assert (info.total, info.published, info.ended_otherwise, info.remaining) == (300,) * 3 + (0,)


def test_stop_rule_pause_resume_cancel(make_store: Callable[..., RedisStore]) -> None:
    store = make_store(f"pace{time.monotonic_ns()}")
    run_id, ids = _start(store, 10, ResubmitPace(500, 1, 3))
    first = store.claim_run(run_id, 500)
    assert first == [f"{ids[0]}:1"]  # one at once, then the pace
    # two outcomes, one failed again: not more than 1 of the last 3
    store.settle_run(run_id, [(first[0], "f", "")], 1000)
    more = wait_for(lambda: store.claim_run(run_id, 2), timeout=10, interval=0.005)
    assert len(more) <= 2
    store.settle_run(run_id, [(more[0], "c", "")], 1000)
    info = read(store, run_id)
    assert info is not None
    assert info.status == RunStatus.RUNNING
    # settling the same member again counts nothing
    store.settle_run(run_id, [(first[0], "f", ""), (more[0], "f", "")], 1000)
    assert read(store, run_id).failed_again == 1  # type: ignore[union-attr]

    control(store, run_id, "pause", "ann")
    assert store.claim_run(run_id, 500) == []
    with pytest.raises(ResubmitRunConflict, match="paused"):
        control(store, run_id, "pause", "bob")
    control(store, run_id, "resume", "ann")
    again = wait_for(lambda: store.claim_run(run_id, 1), timeout=10, interval=0.005)

    # two more failures among the last 3 settled: halted, with why
    status, why = store.settle_run(run_id, [(again[0], "f", "")], 1000)
    assert status == "halted"
    assert why == ("2 of the last 3 resubmitted tasks failed again (the rule: halt when "
                   "more than 1 of the last 3)")
    assert store.claim_run(run_id, 500) == []
    info = read(store, run_id)
    assert info is not None
    assert (info.status, info.halt_reason, info.failed_again, info.completed) == (
        RunStatus.HALTED, why, 2, 1)
    assert info.remaining == 10 - 1 - len(more) - 1
    assert [e["action"] for e in info.events] == ["start", "pause", "resume", "halted"]
    with pytest.raises(ResubmitRunConflict):
        control(store, run_id, "cancel", "ann")
    with pytest.raises(LookupError):
        control(store, 10_000, "cancel", "ann")


def test_entries_not_published_are_recorded_with_why(
        make_store: Callable[..., RedisStore]) -> None:
    """An entry discarded meanwhile, a task no longer resubmittable, a publish call that
    raised: each settles once as skipped or publish failed, its reason kept (never lost)."""
    store = make_store(f"pace{time.monotonic_ns()}")
    put_in_state(store, "race-3", TaskState.FAILED)  # dead at attempt 1: not published
    run_id, _ = _start(store, 5, ResubmitPace(500), first="race-3")

    def publish(entries: list[DeadLetter], reset: bool, version: ResubmitVersion
                ) -> list[str]:
        if any(e.task_id == "race-3" for e in entries):
            raise ConnectionError("broker down: amqp://guest:s3cret-pw@rabbit//")
        return [e.task_id for e in entries if e.task_id != "race-1"]

    pacer = Pacer(store, lambda t, a: None if t == "race-0" else _entry(t, a), publish, 30)

    def finished() -> bool:
        pacer.pass_once()
        info = read(store, run_id)
        return info is not None and not info.active and info.in_flight == 0

    wait_for(finished, timeout=20, interval=0.01, message="the run to finish")
    info = read(store, run_id)
    assert info is not None
    assert (info.status, info.skipped, info.publish_failed) == (RunStatus.DONE, 2, 1)
    assert info.notes["race-0:1"] == "skipped: its dead-letter entry is gone (discarded)"
    assert info.notes["race-1:1"] == "skipped: not resubmittable: the task is gone"
    assert info.notes["race-3:1"].startswith("publish failed: ConnectionError: broker down")
    assert "s3cret-pw" not in info.notes["race-3:1"]
    # the other two had no record: published, then ended otherwise
    assert info.published == info.ended_otherwise == 2


@pytest.mark.parametrize(("outcomes", "halt_after", "of_last", "halts"), [
    ("fcfcf", 2, 5, "3 of the last 5"),   # more than 2 of the last 5
    ("fcfcf", 2, 4, ""),                  # the last 4 are c f c f: 2, not more than 2
    ("ff", 1, 10, "2 of the last 2"),     # a window not full yet counts what there is
    ("cccc", 0, 3, ""),
    ("cccf", 0, 3, "1 of the last 3"),    # halt_after 0: the first failure halts
    ("fffff", 5, 5, ""),                  # halt_after == of_last: never
    ("fooof", 1, 5, "2 of the last 5"),   # ended otherwise counts in the window, not as failed
])
def test_the_stop_rule_over_the_last_n_settled(make_store: Callable[..., RedisStore],
                                               outcomes: str, halt_after: int, of_last: int,
                                               halts: str) -> None:
    store = make_store(f"pace{time.monotonic_ns()}")
    run_id, _ = _start(store, len(outcomes) + 1, ResubmitPace(500, halt_after, of_last))
    claimed = wait_for(lambda: store.claim_run(run_id, 1), timeout=10, interval=0.002)
    status, why = "", ""
    for code in outcomes:  # settled one by one, oldest first
        status, why = store.settle_run(run_id, [(claimed[0], code, "")], 1000)
        if status == "halted":
            break
        claimed = wait_for(lambda: store.claim_run(run_id, 1), timeout=10, interval=0.002)
    if halts:
        assert status == "halted"
        assert why.startswith(halts + " resubmitted tasks failed again")
    else:
        assert (status, why) == ("running", "")


def test_a_run_deleted_by_hand_is_no_longer_driven(make_store: Callable[..., RedisStore]
                                                   ) -> None:
    store = make_store(f"pace{time.monotonic_ns()}")
    run_id, _ = _start(store, 2, ResubmitPace(1))
    assert store.active_runs(10) == [run_id]
    store.client.delete(store.keys.resubmit_run(run_id))
    assert store.settle_run(run_id, [], 1000) == ("", "")
    assert store.active_runs(10) == []
