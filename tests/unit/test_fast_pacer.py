"""A paced resubmit driven in memory (the pacer over the kit's run records, no Redis): the
pace lets one member go at once and then ``rate`` per second, each member once; a pause
publishes nothing and a resume counts the pace from then; the one settle rule settles the
resubmitted tasks (completed; failed or cancelled -> failed again) and the stop rule halts
the run; a run whose members all settled is done and no longer driven; a member whose task
someone else resubmitted is skipped."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from jobbers_celery import DeadLetter, TaskState
from jobbers_celery.core.options import ResubmitVersion
from jobbers_celery.resubmit import pacer
from jobbers_celery.resubmit.pace import ResubmitPace, RunStatus
from jobbers_celery.testing import InMemoryDeadLetterSink, InMemoryStore

S = TaskState
IDS = ("t1", "t2", "t3", "t4")


def _failed(store: InMemoryStore, task_id: str) -> DeadLetter:
    store.submit(task_id, sources=(S.UNSUBMITTED,), reason="published", name="app.add",
                 create={"name": "app.add", "queue": "q", "msg": "{}"})
    started = store.start(task_id, name="app.add", worker=None, wid="w:1", heartbeat_ms=None,
                          cap=None, lease_cap_ms=60_000, defer_ms=1000, fields={})
    store.end(task_id, S.FAILED, fence=started.attempt, wid="w:1", name="app.add",
              worker=None, reason="boom")
    return DeadLetter(task_id=task_id, name="app.add", version=None, queue="q",
                      reason="failed", args=[], kwargs={}, exception_type=None,
                      exception_message=None, traceback=None, attempt=started.attempt,
                      retry_attempt=0, worker=None, failed_at=datetime.now(UTC))


class Driven:
    """A run over four dead tasks, its pacer, and what the resubmit path published."""

    def __init__(self, pace: ResubmitPace) -> None:
        self.store = InMemoryStore()
        self.sink = InMemoryDeadLetterSink()
        self.sink.write_many([_failed(self.store, i) for i in IDS])
        self.published: list[str] = []
        self.run_id = pacer.start(self.store, self.sink.entries, pace, reset_retry_count=False,
                                  version=ResubmitVersion.ENTRY, selection=None,
                                  source="test", username="")
        self.pacer = pacer.Pacer(self.store, self.sink.entry, self._publish,
                                 claim_timeout_s=30.0)

    def _publish(self, entries: list[DeadLetter], reset: bool,
                 version: ResubmitVersion) -> list[str]:
        """The resubmit path's compare-and-set: only a task still dead goes out."""
        went = [e.task_id for e in entries
                if self.store.step(e.task_id, S.SUBMITTED, sources=(S.FAILED,),
                                   reason="resubmitted").applied]
        self.published += went
        return went

    def ends(self, task_id: str, to: TaskState) -> None:
        started = self.store.start(task_id, name="app.add", worker=None, wid="w:2",
                                   heartbeat_ms=None, cap=None, lease_cap_ms=60_000,
                                   defer_ms=1000, fields={})
        if to is S.CANCELLED:
            self.store.cancel(task_id, "by test")
        self.store.end(task_id, S.FAILED if to is S.CANCELLED else to, fence=started.attempt,
                       wid="w:2", name="app.add", worker=None, reason="end",
                       cancellable=True)

    def info(self) -> pacer.ResubmitRunInfo:
        found = pacer.read(self.store, self.run_id)
        assert found is not None
        return found


def test_the_pace_lets_one_go_at_once_then_rate_per_second_each_once() -> None:
    run = Driven(ResubmitPace(rate=0.5))
    assert run.pacer.pass_once() == 1
    assert run.pacer.pass_once() == 0  # the pace allows nothing more yet
    run.store.advance(2)
    assert run.pacer.pass_once() == 1
    run.store.advance(60)
    assert run.pacer.pass_once() == 2
    assert sorted(run.published) == list(IDS)  # each member once
    assert (run.info().status, run.info().remaining) == (RunStatus.RUNNING, 0)


def test_a_paused_run_publishes_nothing_and_resumes_at_the_pace_from_then() -> None:
    run = Driven(ResubmitPace(rate=1.0))
    assert run.pacer.pass_once() == 1
    pacer.control(run.store, run.run_id, "pause", "op")
    run.store.advance(60)
    assert run.pacer.pass_once() == 0
    pacer.control(run.store, run.run_id, "resume", "op")
    assert run.pacer.pass_once() == 1  # no burst saved up while paused
    with pytest.raises(pacer.ResubmitRunConflict):
        pacer.control(run.store, run.run_id, "resume", "op")


def test_cancelled_resubmitted_tasks_fail_again_and_the_stop_rule_halts_the_run() -> None:
    run = Driven(ResubmitPace(rate=500, halt_after=1, of_last=3))
    assert run.pacer.pass_once() == 1  # one at once
    run.store.advance(0.01)
    assert run.pacer.pass_once() == 3
    run.ends("t1", S.CANCELLED)
    run.ends("t2", S.FAILED)
    run.ends("t3", S.COMPLETED)
    run.pacer.pass_once()
    info = run.info()
    assert info.status is RunStatus.HALTED
    assert (info.failed_again, info.completed) == (2, 1)
    assert info.halt_reason.startswith("2 of the last 3")
    assert (info.remaining, info.in_flight) == (0, 1)  # t4 is still followed
    assert run.store.active_runs(10) == [run.run_id]
    run.ends("t4", S.COMPLETED)
    run.pacer.pass_once()
    assert (run.info().status, run.info().completed) == (RunStatus.HALTED, 2)
    assert run.store.active_runs(10) == []


def test_a_run_whose_members_all_settled_is_done_and_no_longer_driven() -> None:
    run = Driven(ResubmitPace(rate=500))
    run.pacer.pass_once()
    run.store.advance(1)
    run.pacer.pass_once()
    for task_id in IDS:
        run.ends(task_id, S.COMPLETED)
    run.pacer.pass_once()
    assert (run.info().status, run.info().completed) == (RunStatus.DONE, 4)
    assert run.store.active_runs(10) == []


def test_a_member_someone_else_resubmitted_is_skipped() -> None:
    run = Driven(ResubmitPace(rate=500))
    run.store.step("t1", S.SUBMITTED, sources=(S.FAILED,), reason="by hand")
    run.pacer.pass_once()
    info = run.info()
    assert (info.skipped, run.published) == (1, [])
    assert "not resubmittable: the task is submitted" in info.notes["t1:1"]
