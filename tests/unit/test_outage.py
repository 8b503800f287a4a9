"""A worker process and a state-store outage (docs/howto/redis-settings.md, "An outage or a
restart"): the outcome of a finished task is held and sent again until the store answers,
with a growing, bounded pause; the outage is logged once when it begins and once when it
ends, not once per task. A message that can neither start (the store is away) nor be given
back (the broker is away too) is held and published again until the broker takes it. End to
end in tests/integration/test_store_outage.py."""

from __future__ import annotations

import functools
import itertools
import logging
from types import SimpleNamespace
from typing import Any

import pytest
import redis
from celery.exceptions import Ignore
from kombu.exceptions import OperationalError

from jobbers_celery.lifecycle.publisher import Publisher
from jobbers_celery.lifecycle.recorder import Recorder
from jobbers_celery.worker import task as task_module
from jobbers_celery.worker.task import (
    OUTAGE_RESEND_FIRST_PAUSE_S,
    OUTAGE_RESEND_MAX_PAUSE_S,
    JobbersTask,
)


@pytest.fixture
def pauses(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    slept: list[float] = []
    monkeypatch.setattr(task_module.time, "sleep", slept.append)
    monkeypatch.setattr(task_module, "_outage", task_module._Outage())
    monkeypatch.setattr(task_module, "_held", task_module._HeldMessage())
    return slept


def test_a_finished_tasks_outcome_is_sent_again_until_the_store_answers(
        pauses: list[float], caplog: pytest.LogCaptureFixture) -> None:
    tries = []

    def step() -> str:
        tries.append(1)
        if len(tries) <= 8:
            raise redis.ConnectionError("Connection refused")
        return "recorded"

    self: Any = None  # the method uses nothing of the task
    with caplog.at_level(logging.WARNING, logger="jobbers.task"):
        assert JobbersTask._resend_after_outage(self, step) == "recorded"
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
    outage = task_module._outage
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


def _delivery(sig: _Signature) -> Any:
    return SimpleNamespace(request=SimpleNamespace(id="t1", retries=2), name="proj.add",
                           signature_from_request=lambda req: sig)


#: What ``_give_back`` uses of the service: the publisher's give-back (no store call).
_SERVICE = SimpleNamespace(publisher=Publisher)


@pytest.mark.parametrize("refusal", [
    OperationalError("Error 111 connecting to 127.0.0.1:6379. Connection refused."),
    redis.exceptions.OutOfMemoryError("command not allowed when used memory > 'maxmemory'"),
], ids=["broker_unreachable", "broker_out_of_memory"])
def test_a_message_the_broker_cannot_take_back_is_held_until_it_can(
        pauses: list[float], caplog: pytest.LogCaptureFixture, refusal: Exception) -> None:
    sig = _Signature([refusal] * 6)
    with caplog.at_level(logging.WARNING, logger="jobbers.task"), pytest.raises(Ignore):
        JobbersTask._give_back(_delivery(sig), _SERVICE)
    [headers] = sig.published  # published once it could be, never dropped
    assert headers["kept"] == "1"
    assert headers[task_module.HEADER_GIVEN_BACK].endswith("/2")
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
        JobbersTask._give_back(_delivery(sig), _SERVICE)
    assert len(sig.published) == 1
    assert pauses == []
    assert [r.getMessage()[:40] for r in caplog.records] == [
        "the jobbers state store cannot be reache"]


def test_a_publish_error_that_is_not_an_outage_is_raised(pauses: list[float]) -> None:
    sig = _Signature([TypeError("not serializable")])
    with pytest.raises(TypeError):
        JobbersTask._give_back(_delivery(sig), _SERVICE)
    assert pauses == []


def test_a_message_given_back_again_names_every_giver_of_that_delivery(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A message can bounce between workers while the store is away; the start applied with
    its reply lost may be the first giver's, so none is forgotten (up to GIVERS_KEPT)."""
    monkeypatch.setattr(task_module.liveness, "worker_id", lambda: "w2@h:2:b")
    assert task_module._givers_header(None, 0) == "w2@h:2:b/0"
    assert task_module._givers_header("w1@h:1:a/1", 1) == "w1@h:1:a,w2@h:2:b/1"
    assert task_module._givers_header("w2@h:2:b/1", 1) == "w2@h:2:b/1"
    # a retry's message copies the header of the delivery it retries: not this delivery's
    assert task_module._givers_header("w1@h:1:a/0", 1) == "w2@h:2:b/1"
    full = ",".join(f"w{n}@h:{n}:x" for n in range(task_module.GIVERS_KEPT))
    assert task_module._givers_header(f"{full}/0", 0) == f"{full}/0"
    assert task_module._givers("w1@h:1:a,w2@h:2:b/3", 3) == ["w1@h:1:a", "w2@h:2:b"]
    assert task_module._givers("w1@h:1:a/3", 2) == []
    assert task_module._givers(None, 0) == []


class _Store:
    """The record of a task whose attempt 1, started by ``wid`` (a giver), was stalled."""

    def __init__(self, wid: str, reason: str) -> None:
        self.raw = {"state": "stalled", "wid": wid, "attempt": "1"}
        self.reason = reason
        self.steps: list[dict[str, Any]] = []

    def get_raw(self, task_id: str) -> dict[str, str]:
        return self.raw

    def history(self, task_id: str) -> list[Any]:
        return [SimpleNamespace(reason="published"), SimpleNamespace(reason=self.reason)]

    def step(self, task_id: str, to: Any, **kwargs: Any) -> Any:
        self.steps.append({"to": to, **kwargs})
        return SimpleNamespace(applied=True, state=to)


def _service(store: _Store) -> Any:
    """The store and the recorder's take-back (the recorder is the only caller of steps)."""
    recorder = SimpleNamespace(store=store)
    take_back = functools.partial(Recorder.take_back_stall, recorder)  # type: ignore[arg-type]
    return SimpleNamespace(store=store, recorder=SimpleNamespace(take_back_stall=take_back))


def _taker(store: _Store) -> Any:
    started = SimpleNamespace(applied=True, state="started", attempt=2)
    return SimpleNamespace(request=SimpleNamespace(id="t1", retries=0), name="proj.add",
                           _worker=lambda: "w@h", _start_once=lambda jobbers: started)


ORPHAN = ("stalled: worker w@h (g1@h:1:a) no longer runs it and its end was not recorded "
          "(lost by a Redis failover or restart); last heartbeat never")


def test_a_message_given_back_takes_back_its_givers_attempt_stalled_as_an_end_lost() -> None:
    store = _Store("g1@h:1:a", ORPHAN)
    refused = SimpleNamespace(applied=False, previous="stalled", attempt=1)
    res = JobbersTask._take_back_stall(_taker(store), _service(store), refused,
                                       ["g0@h:0:z", "g1@h:1:a"])
    assert res.applied  # started again
    assert res.attempt == 2
    [step] = store.steps
    assert step["to"] == task_module.S.SUBMITTED
    assert step["sources"] == (task_module.S.STALLED,)
    assert (step["fence"], step["wid_fence"]) == (1, "g1@h:1:a")


@pytest.mark.parametrize(("wid", "reason"), [
    ("other@h:9:q", ORPHAN),  # stalled while another worker held it: it may have run there
    ("g1@h:1:a", "stalled: no heartbeat for 9.0s (max_heartbeat_interval 2.0s); ..."),
], ids=["another_worker", "another_verdict"])
def test_a_stall_the_givers_did_not_cause_so_stands(wid: str, reason: str) -> None:
    store = _Store(wid, reason)
    refused = SimpleNamespace(applied=False, previous="stalled", attempt=1)
    res = JobbersTask._take_back_stall(_taker(store), _service(store), refused,
                                       ["g1@h:1:a"])
    assert res is refused
    assert store.steps == []
