"""A unique task's publish answered ``duplicate`` (lifecycle/submits.py), on a fake store:
on Redis Sentinel the answer may come from a master a failover just demoted, which still
sees a holder the new master knows ended; the publish is asked once more after every
connection checked the master, so its message is not dropped for a copy that ended (a
first publish with or without a delay).
Elsewhere a duplicate is final, at no extra call; on Sentinel a stream of duplicates is
asked again at most every ``DUPLICATE_RECHECK_S``."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from jobbers_celery.core.states import TaskState
from jobbers_celery.core.unique import HeldElsewhere
from jobbers_celery.lifecycle import submits
from jobbers_celery.lifecycle.submits import SubmitRecorder
from jobbers_celery.store import StepResult, steps

DUPLICATE = StepResult(applied=False, previous="missing", now_ms=5, attempt=0,
                       why="duplicate:holder-1")
APPLIED = StepResult(applied=True, previous="missing", now_ms=5, attempt=0, epoch="e1")


class _Store:
    """The two calls a publish's submit makes: the step and, on a duplicate, the check."""

    def __init__(self, on_sentinel: bool, replies: list[StepResult]) -> None:
        self.on_sentinel = on_sentinel
        self.replies = replies
        self.submits = 0
        self.rechecks = 0

    def submit(self, *args: Any, **kwargs: Any) -> StepResult:
        self.submits += 1
        return self.replies.pop(0)

    def recheck_master(self) -> bool:
        self.rechecks += 1
        return self.on_sentinel


def _publish(store: _Store, recorder: SubmitRecorder | None = None) -> str | None:
    """The holder a publish was told of (``None``: its message goes)."""
    recorder = recorder or SubmitRecorder(store)  # type: ignore[arg-type]
    try:
        recorder._submit_published("t1", "t.unique", {"name": "t.unique"}, {}, None, "{}")
    except HeldElsewhere as held:
        return str(held.holder)
    return None


@pytest.mark.parametrize(("on_sentinel", "second", "holder", "submits"), [
    (True, APPLIED, None, 2),            # the old master answered: the new one records it
    (True, DUPLICATE, "holder-1", 2),    # a duplicate again after the check: one indeed
    (False, APPLIED, "holder-1", 1),     # no Sentinel: final at once
])
def test_a_duplicate_publish_is_asked_again_after_a_master_check_on_sentinel(
        on_sentinel: bool, second: StepResult, holder: str | None, submits: int) -> None:
    store = _Store(on_sentinel, [DUPLICATE, second])
    assert _publish(store) == holder
    assert (store.submits, store.rechecks) == (submits, 1)


def test_an_applied_publish_asks_nothing_more() -> None:
    store = _Store(True, [APPLIED])
    assert _publish(store) is None
    assert (store.submits, store.rechecks) == (1, 0)


def test_a_stream_of_duplicates_is_asked_again_at_most_every_recheck_period(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Dedup-heavy traffic keeps the connections' own pace (a check every 0.5 s), not a
    sentinel round trip and a resubmit per duplicate."""
    now = [100.0]
    monkeypatch.setattr(submits.time, "monotonic", lambda: now[0])
    store = _Store(True, [DUPLICATE] * 5)
    recorder = SubmitRecorder(store)  # type: ignore[arg-type]
    assert _publish(store, recorder) == "holder-1"  # asked again: 2 submits
    now[0] += 0.1
    assert _publish(store, recorder) == "holder-1"  # within the period: final at once
    now[0] += submits.DUPLICATE_RECHECK_S
    assert _publish(store, recorder) == "holder-1"  # past it: asked again
    assert (store.submits, store.rechecks) == (5, 2)


def test_a_delayed_or_fair_first_publish_is_asked_again_too() -> None:
    """``countdown``/``eta`` and fair-share publishes record through ``publish_later``:
    the same re-ask, and the step's own arguments both times."""
    store = _Store(True, [DUPLICATE, APPLIED])
    seen: list[dict[str, Any]] = []
    submit = store.submit

    def recording(*args: Any, **kwargs: Any) -> StepResult:
        seen.append(kwargs)
        return submit(*args, **kwargs)

    store.submit = recording  # type: ignore[method-assign]
    recorder = SubmitRecorder(store)  # type: ignore[arg-type]
    payload = {"args": [1], "kwargs": {}, "options": {"queue": "q", "headers": {}}}
    res = recorder.publish_later("t2", "t.unique", payload, version=None, dead_letter=False,
                                 delay_ms=1000, reason="countdown")
    assert res is APPLIED
    assert (store.submits, store.rechecks) == (2, 1)
    assert seen[0] == seen[1]
    assert seen[0]["later"] == (1000, "countdown")


def test_a_duplicate_refusal_is_not_logged_as_a_warning(
        caplog: pytest.LogCaptureFixture) -> None:
    """A unique task's duplicate is the feature at work (the caller gets the holder): one
    Redis's step logs it at DEBUG, not as a refused transition warning per duplicate."""
    caplog.set_level(logging.DEBUG, logger="jobbers.store")
    res = steps._step_result("t1", TaskState.SUBMITTED, [0, "missing", 5, 0, "duplicate:h"],
                             (), None)
    assert res.why == "duplicate:h"
    refused = [r for r in caplog.records if "refused transition" in r.getMessage()]
    assert [r.levelno for r in refused] == [logging.DEBUG]
    caplog.clear()
    steps._step_result("t1", TaskState.STARTED, [0, "completed", 5, 1, "state"], (), None)
    assert [r.levelno for r in caplog.records] == [logging.WARNING]  # others still warn
