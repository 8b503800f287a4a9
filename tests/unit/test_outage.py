"""A worker process and a state-store outage (docs/howto/redis-settings.md, "An outage or a
restart"): the outcome of a finished task is held and sent again until the store answers,
with a growing, bounded pause; the outage is logged once when it begins and once when it
ends, not once per task. A message that can neither start (the store is away) nor be given
back (the broker is away too) is held and published again until the broker takes it. End to
end in tests/integration/test_store_outage.py."""

from __future__ import annotations

import copy
import itertools
import logging
from types import SimpleNamespace
from typing import Any

import pytest
import redis
from celery import Celery
from celery.exceptions import Ignore
from kombu.exceptions import OperationalError

from jobbers_celery import JobbersTask
from jobbers_celery.core.states import TaskState
from jobbers_celery.lifecycle.publisher import Publisher
from jobbers_celery.lifecycle.recorder import Recorder
from jobbers_celery.store import StepResult
from jobbers_celery.testing import InMemoryStore
from jobbers_celery.worker import outage as outage_module
from jobbers_celery.worker.outage import (
    OUTAGE_RESEND_FIRST_PAUSE_S,
    OUTAGE_RESEND_MAX_PAUSE_S,
    WRITE_PROBE,
    Delivery,
    Ending,
    Handover,
    OutageLog,
    loop_outage_log,
    resend_until_recorded,
    write_probe,
)
from jobbers_celery.worker.runtime import Periodic


def _fresh(log: OutageLog) -> OutageLog:
    """The same outage log, not begun (a test's outage must not leak into the next)."""
    fresh = copy.copy(log)
    fresh.since = None
    return fresh


@pytest.fixture
def pauses(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    slept: list[float] = []
    monkeypatch.setattr(outage_module.time, "sleep", slept.append)
    monkeypatch.setattr(outage_module, "STORE_OUTAGE", _fresh(outage_module.STORE_OUTAGE))
    monkeypatch.setattr(outage_module, "HELD_MESSAGE", _fresh(outage_module.HELD_MESSAGE))
    return slept


def test_a_finished_tasks_outcome_is_sent_again_until_the_store_answers(
        pauses: list[float], caplog: pytest.LogCaptureFixture) -> None:
    tries = []

    def step() -> str:
        tries.append(1)
        if len(tries) <= 8:
            raise redis.ConnectionError("Connection refused")
        return "recorded"

    with caplog.at_level(logging.WARNING, logger="jobbers.task"):
        assert resend_until_recorded(step, outage_module.STORE_OUTAGE) == "recorded"
    assert len(tries) == 9
    assert pauses[0] == OUTAGE_RESEND_FIRST_PAUSE_S
    assert all(b == min(2 * a, OUTAGE_RESEND_MAX_PAUSE_S) for a, b in itertools.pairwise(pauses))
    assert max(pauses) == OUTAGE_RESEND_MAX_PAUSE_S
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert lines[0].startswith("the jobbers state store cannot be reached")
    assert lines[1].startswith("the jobbers state store answers again")


def test_the_outage_is_logged_once_however_many_tasks_meet_it(
        pauses: list[float], caplog: pytest.LogCaptureFixture) -> None:
    outage = outage_module.STORE_OUTAGE
    with caplog.at_level(logging.WARNING, logger="jobbers.task"):
        for _ in range(50):
            outage.began()
        outage.over()
        outage.over()  # a task that starts once it is over: nothing more to say
        outage.began()  # the next outage is logged again
    lines = [r.getMessage()[:40] for r in caplog.records]
    assert lines == ["the jobbers state store cannot be reache",
                     "the jobbers state store answers again (u",
                     "the jobbers state store cannot be reache"]


class _Signature:
    """What ``signature_from_request`` returns, its publishes refused ``refusals`` times."""

    def __init__(self, refusals: list[BaseException]) -> None:
        self.options: dict[str, Any] = {"headers": {"kept": "1"}}
        self.refusals = refusals
        self.published: list[dict[str, Any]] = []

    def apply_async(self) -> None:
        if self.refusals:
            raise self.refusals.pop(0)
        self.published.append(dict(self.options["headers"]))


def _delivery(sig: _Signature, retries: int = 2) -> Delivery:
    return Delivery("proj.add", "t1", retries, "w@h", SimpleNamespace(), lambda: sig)


def _handover(store: Any = None, recorder: Any = None) -> Handover:
    """A give-back uses the publisher's give-back only (no store call)."""
    return Handover(store, recorder, Publisher, 60.0)  # type: ignore[arg-type]


@pytest.mark.parametrize("refusal", [
    OperationalError("Error 111 connecting to 127.0.0.1:6379. Connection refused."),
    redis.exceptions.OutOfMemoryError("command not allowed when used memory > 'maxmemory'"),
], ids=["broker_unreachable", "broker_out_of_memory"])
def test_a_message_the_broker_cannot_take_back_is_held_until_it_can(
        pauses: list[float], caplog: pytest.LogCaptureFixture, refusal: Exception) -> None:
    sig = _Signature([refusal] * 6)
    with caplog.at_level(logging.WARNING, logger="jobbers.task"), pytest.raises(Ignore):
        _handover().give_back(_delivery(sig))
    [headers] = sig.published  # published once it could be, never dropped
    assert headers["kept"] == "1"
    assert headers[outage_module.HEADER_GIVEN_BACK].endswith("/2")
    assert len(pauses) == 6
    assert pauses[0] == OUTAGE_RESEND_FIRST_PAUSE_S
    assert max(pauses) == OUTAGE_RESEND_MAX_PAUSE_S
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3, lines  # the store's outage, the held message, its release
    assert lines[0].startswith("the jobbers state store cannot be reached")
    assert lines[1].startswith("the broker cannot take the message of proj.add[t1] back")
    assert lines[2].startswith("the broker took back the message")


def test_a_message_given_back_at_once_logs_only_the_outage(
        pauses: list[float], caplog: pytest.LogCaptureFixture) -> None:
    sig = _Signature([])
    with caplog.at_level(logging.WARNING, logger="jobbers.task"), pytest.raises(Ignore):
        _handover().give_back(_delivery(sig))
    assert len(sig.published) == 1
    assert pauses == []
    assert [r.getMessage()[:40] for r in caplog.records] == [
        "the jobbers state store cannot be reache"]


def test_a_publish_error_that_is_not_an_outage_is_raised(pauses: list[float]) -> None:
    sig = _Signature([TypeError("not serializable")])
    with pytest.raises(TypeError):
        _handover().give_back(_delivery(sig))
    assert pauses == []


def test_a_message_given_back_again_names_every_giver_of_that_delivery(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A message can bounce between workers while the store is away; the start applied with
    its reply lost may be the first giver's, so none is forgotten (up to GIVERS_KEPT)."""
    monkeypatch.setattr(outage_module.liveness, "worker_id", lambda: "w2@h:2:b")
    assert outage_module.givers_header(None, 0) == "w2@h:2:b/0"
    assert outage_module.givers_header("w1@h:1:a/1", 1) == "w1@h:1:a,w2@h:2:b/1"
    assert outage_module.givers_header("w2@h:2:b/1", 1) == "w2@h:2:b/1"
    # a retry's message copies the header of the delivery it retries: not this delivery's
    assert outage_module.givers_header("w1@h:1:a/0", 1) == "w2@h:2:b/1"
    full = ",".join(f"w{n}@h:{n}:x" for n in range(outage_module.GIVERS_KEPT))
    assert outage_module.givers_header(f"{full}/0", 0) == f"{full}/0"
    assert outage_module.givers("w1@h:1:a,w2@h:2:b/3", 3) == ["w1@h:1:a", "w2@h:2:b"]
    assert outage_module.givers("w1@h:1:a/3", 2) == []
    assert outage_module.givers(None, 0) == []


ORPHAN = ("stalled: worker w@h (g1@h:1:a) no longer runs it and its end was not recorded "
          "(lost by a Redis failover or restart); last heartbeat never")


def _stalled(wid: str, reason: str) -> InMemoryStore:
    """The record of a task whose attempt 1, started by ``wid`` (a giver), was stalled with
    ``reason`` (an orphan's verdict also marks that its worker said it does not run it)."""
    store = InMemoryStore()
    store.submit("t1", sources=(outage_module.S.UNSUBMITTED,), reason="published",
                 name="proj.add", create={"name": "proj.add", "queue": "celery"})
    store.start("t1", name="proj.add", worker="w@h", wid=wid, heartbeat_ms=None, cap=None,
                lease_cap_ms=60_000, defer_ms=1000, fields={})
    store.step("t1", outage_module.S.STALLED, sources=(outage_module.S.STARTED,),
               reason=reason, set_fields={"gone": "1"} if reason == ORPHAN else None)
    return store


def _stall_handover(store: InMemoryStore) -> Handover:
    """The store and the recorder's take-back (the recorder is the only caller of steps)."""
    return _handover(store, Recorder(store, SimpleNamespace()))


def _steps(store: InMemoryStore) -> list[tuple[Any, Any]]:
    return [(t.from_state, t.to_state) for t in store.history("t1")]


def _given_back(givers: str) -> Delivery:
    """A delivery of a message given back by ``givers``."""
    request = SimpleNamespace(headers={outage_module.HEADER_GIVEN_BACK: f"{givers}/0"})
    return Delivery("proj.add", "t1", 0, "w@h", request, lambda: None)  # type: ignore[arg-type, return-value]


def test_a_message_given_back_takes_back_its_givers_attempt_stalled_as_an_end_lost() -> None:
    store = _stalled("g1@h:1:a", ORPHAN)
    refused = SimpleNamespace(applied=False, previous="stalled", attempt=1)
    back = _stall_handover(store).take_back(_given_back("g0@h:0:z,g1@h:1:a"), refused)
    assert back is outage_module.S.SUBMITTED  # the caller starts it again
    # the one step, fenced by attempt 1, the giver g1@h:1:a and the orphan's mark
    assert _steps(store)[-1] == (outage_module.S.STALLED, outage_module.S.SUBMITTED)
    assert store.refused_counts() == {}


@pytest.mark.parametrize(("wid", "reason"), [
    ("other@h:9:q", ORPHAN),  # stalled while another worker held it: it may have run there
    ("g1@h:1:a", "stalled: no heartbeat for 9.0s (max_heartbeat_interval 2.0s); ..."),
], ids=["another_worker", "another_verdict"])
def test_a_stall_the_givers_did_not_cause_so_stands(wid: str, reason: str) -> None:
    store = _stalled(wid, reason)
    before = _steps(store)
    refused = SimpleNamespace(applied=False, previous="stalled", attempt=1)
    assert _stall_handover(store).take_back(_given_back("g1@h:1:a"), refused) is None
    assert _steps(store) == before  # no step


def test_one_outage_log_says_an_outage_once_for_every_place_that_meets_it(
        caplog: pytest.LogCaptureFixture) -> None:
    """The task's outage, the held message and the main process's loops share one logger:
    a warning when it begins (debug lines between, where asked), one when it is over."""
    loop = loop_outage_log(logging.getLogger("jobbers.scheduler"), "jobbers scheduler pass")
    with caplog.at_level(logging.DEBUG, logger="jobbers.scheduler"):
        loop.began(ConnectionError("refused"))
        loop.began(ConnectionError("refused"))
        loop.over()
        loop.over()
    lines = [(r.levelno, r.getMessage()) for r in caplog.records]
    began = ("jobbers scheduler pass: the jobbers state store cannot be reached (refused); "
             "retrying until it answers")
    still = "jobbers scheduler pass: the jobbers state store still cannot be reached (refused)"
    assert lines[:2] == [(logging.WARNING, began), (logging.DEBUG, still)]
    [(level, over)] = lines[2:]
    assert level == logging.WARNING
    assert over.startswith("jobbers scheduler pass: the jobbers state store answers again "
                           "(unreachable for ")


def test_a_loop_whose_passes_only_read_says_a_refusal_of_writes_once(
        caplog: pytest.LogCaptureFixture) -> None:
    """A store out of memory refuses writes but serves reads: a scheduler pass that only
    reads (most of them) goes through between those that write. The outage is said once
    (began, then over once the write probe is taken), not over and begun again at every
    pass that writes; a pass going through ends it only when writes are taken again."""
    oom = redis.exceptions.OutOfMemoryError(
        "command not allowed when used memory > 'maxmemory'.")
    full = [True]
    # each pass: whether it writes; the store stops refusing before the fifth
    passes = [True, False, False, True, False, False]
    probes: list[bool] = []

    def tick() -> float:
        writes = passes.pop(0)
        if len(passes) == 1:
            full[0] = False
        if not passes:
            loop._stop.set()
        if writes and full[0]:
            raise oom
        return 0.0

    def probe() -> None:
        probes.append(full[0])
        if full[0]:
            raise oom

    loop = Periodic("t", "jobbers scheduler pass", logging.getLogger("jobbers.scheduler"),
                    tick, 0.0, probe=probe)
    with caplog.at_level(logging.WARNING, logger="jobbers.scheduler"):
        loop._loop()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert "cannot be reached (command not allowed" in lines[0]
    assert "answers again" in lines[1]
    assert probes == [True, True, False]  # only in the outage, after a pass that went through


def test_the_write_probe_is_a_lock_of_a_millisecond() -> None:
    taken: list[tuple[str, int]] = []

    class Store(InMemoryStore):
        def try_lock(self, name: str, ttl_ms: int) -> bool:
            taken.append((name, ttl_ms))
            return super().try_lock(name, ttl_ms)

    write_probe(Store())()
    assert taken == [(WRITE_PROBE, 1)]


def test_a_lost_start_is_recorded_again_and_the_outcome_sent_once_more(
        pauses: list[float]) -> None:
    """The outage policy (``Ending``): held through the outage, then, the store having lost
    the attempt's start (back at ``submitted`` with the attempt before), the start is
    recorded again and the step sent once more."""
    replies: list[Any] = [
        redis.ConnectionError("Connection refused"),
        StepResult(applied=False, previous=TaskState.SUBMITTED, now_ms=1, attempt=2),
        StepResult(applied=True, previous=TaskState.STARTED, now_ms=2, attempt=3,
                   state=TaskState.COMPLETED),
    ]

    def step() -> StepResult:
        reply = replies.pop(0)
        if isinstance(reply, Exception):
            raise reply
        return reply

    restarts: list[int] = []

    def restart() -> StepResult:
        restarts.append(1)
        return StepResult(applied=True, previous=TaskState.SUBMITTED, now_ms=1, attempt=3,
                          state=TaskState.STARTED)

    res = Ending("proj.add", "t1", 3, restart)(step)
    assert res.state is TaskState.COMPLETED
    assert restarts == [1]
    assert replies == []


class _Recorder:
    """A recorder whose ``cancel`` finds the start lost by the store at its first call (a
    failover), and applies at its second; it logs every call it gets."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def cancel(self, run: Any, *, reason: str) -> StepResult:
        self.calls.append("cancel")
        if self.calls.count("cancel") == 1:
            return StepResult(applied=False, previous=TaskState.SUBMITTED, now_ms=1,
                              attempt=0, state=TaskState.SUBMITTED)
        return StepResult(applied=True, previous=TaskState.STARTED, now_ms=1, attempt=1,
                          state=TaskState.CANCELLED)

    def start(self, task_id: str, name: str, **kwargs: Any) -> StepResult:
        self.calls.append("start")
        assert self.calls[-2:] == ["cancel", "start"]  # after cancel returned, not inside it
        return StepResult(applied=True, previous=TaskState.SUBMITTED, now_ms=1, attempt=1,
                          state=TaskState.STARTED)


def test_the_task_runs_the_recorder_call_under_its_outage_policy() -> None:
    """The recorder only calls down: the task runs the whole ending call under its outage
    policy (no ``guard`` handed in), which records a lost start again between two calls of
    the recorder, never inside one (it was a ``guard`` the recorder ran its step through,
    whose restart called back into ``recorder.start``)."""
    app = Celery("outage-unit", broker="memory://", set_as_current=False)
    recorder = _Recorder()
    app._jobbers = SimpleNamespace(  # type: ignore[attr-defined]
        store=None, recorder=recorder, publisher=None,
        config=SimpleNamespace(worker_lost_after=60.0))

    @app.task(base=JobbersTask, bind=True, name="outage.cancelled", shared=False)
    def cancelled(self: JobbersTask) -> None:  # pragma: no cover - not run
        pass

    task: Any = app.tasks["outage.cancelled"]
    task.push_request(id="t1", called_directly=False, is_eager=False, hostname="w@h",
                      jobbers_attempt=1, jobbers_run=object())
    try:
        assert task._cancelled()
    finally:
        task.pop_request()
    assert recorder.calls == ["cancel", "start", "cancel"]


def test_the_write_probe_writes_to_every_shard_where_the_store_has_shards() -> None:
    """On a Redis Cluster, a node holding shards may refuse writes while the global slot's
    node takes them: the probe writes every shard's epoch too."""
    calls: list[str] = []
    refused = [redis.exceptions.OutOfMemoryError("OOM command not allowed")]

    class Store:
        def try_lock(self, name: str, ttl_ms: int) -> bool:
            calls.append(f"lock {name}")
            return True

        def epochs(self) -> list[str]:
            calls.append("epochs")
            if refused:
                raise refused.pop()
            return ["e0", "e1"]

    probe = write_probe(Store())  # type: ignore[arg-type]
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        probe()
    probe()
    assert calls == ["lock write-probe", "epochs"] * 2
    plain = InMemoryStore()  # no shards: the lock only
    assert write_probe(plain)() in (True, False)
