"""The start step a delivery sends (worker/start.py), on a fake recorder:

- on Redis Sentinel, a refused start (which would drop the delivery) is asked once more after
  every connection checked the master, since a master a failover just demoted may have
  answered it; elsewhere a refusal is final, at no extra call;
- the flow-control keys are worked out each on its own: a call giving its concurrency key
  but not its rate-limit key still starts under its fair share (its publish counted it
  there), only to fail; one without its concurrency key starts outside any cap."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from jobbers_celery.core.options import TaskOptions
from jobbers_celery.store import StepResult
from jobbers_celery.worker.outage import Delivery
from jobbers_celery.worker.start import Starter

REFUSED = StepResult(applied=False, previous="completed", now_ms=0, attempt=1, why="state")
STARTED = StepResult(applied=True, previous="submitted", now_ms=0, attempt=2)


def _start(on_sentinel: bool, replies: list[StepResult], opts: TaskOptions | None = None,
           kwargs: dict[str, Any] | None = None,
           seen: list[dict[str, Any]] | None = None) -> tuple[StepResult, int, int]:
    calls = {"start": 0, "recheck": 0}

    class Recorder:
        def start(self, *args: Any, **kw: Any) -> StepResult:
            calls["start"] += 1
            if seen is not None:
                seen.append(kw)
            return replies.pop(0)

    def recheck() -> bool:
        calls["recheck"] += 1
        return on_sentinel

    store = SimpleNamespace(epoch=lambda _id: None, recheck_master=recheck)
    starter = Starter(store=store, recorder=Recorder(), publisher=None,  # type: ignore[arg-type]
                      handover=None, lost_after=10.0)  # type: ignore[arg-type]
    d = Delivery(name="t.x", task_id="k1", retries=0, worker="w",
                 request=SimpleNamespace(args=(), kwargs=kwargs or {}, headers={}),
                 signature=lambda: None)  # type: ignore[arg-type,return-value]
    res = starter.start(d, opts or TaskOptions())
    return res, calls["start"], calls["recheck"]


@pytest.mark.parametrize(("on_sentinel", "second", "want", "starts"), [
    (True, STARTED, STARTED, 2),   # the old master answered: the new one starts it
    (True, REFUSED, REFUSED, 2),   # refused again after the check: a duplicate indeed
    (False, STARTED, REFUSED, 1),  # no Sentinel: final at once
])
def test_a_refused_start_is_asked_again_after_a_master_check_on_sentinel(
        on_sentinel: bool, second: StepResult, want: StepResult, starts: int) -> None:
    res, n, rechecks = _start(on_sentinel, [REFUSED, second])
    assert (res, n, rechecks) == (want, starts, 1)


def test_a_start_refused_as_running_elsewhere_is_not_asked_again() -> None:
    """A duplicate delivery of a task another worker runs (``started``) is routine: no
    master check for it."""
    running = StepResult(applied=False, previous="started", now_ms=0, attempt=1, why="state")
    res, n, rechecks = _start(True, [running])
    assert (res, n, rechecks) == (running, 1, 0)


def test_a_start_refused_as_missing_is_asked_again_before_it_is_recorded_late() -> None:
    """``missing`` from a demoted master (the task was published to the new one) is asked
    again before the delivery is judged removed or recorded late there."""
    missing = StepResult(applied=False, previous="missing", now_ms=0, attempt=0, why="missing")
    res, n, rechecks = _start(True, [missing, STARTED])
    assert (res, n, rechecks) == (STARTED, 2, 1)


def test_an_applied_start_asks_nothing_more() -> None:
    res, n, rechecks = _start(True, [STARTED])
    assert (res.applied, n, rechecks) == (True, 1, 0)


def test_the_keys_are_worked_out_each_on_its_own() -> None:
    from jobbers_celery.core.fairshare import ConcurrencyKey
    from jobbers_celery.core.ratelimit import RateLimit, RateLimitKeyError

    opts = TaskOptions(max_concurrent=2, concurrency_key=ConcurrencyKey("tenant"),
                       rate_limit_by=RateLimit("5/s", on="account"))
    seen: list[dict[str, Any]] = []
    _start(False, [STARTED], opts, {"tenant": "t1"}, seen)  # no account: no rate key
    [kw] = seen
    assert kw["rate"] is None
    assert kw["fair"] is not None
    assert kw["cap"] == 2  # under its fair share, as its publish counted it
    seen.clear()
    _start(False, [STARTED], opts, {"account": "a1"}, seen)  # no tenant: no fair key
    [kw] = seen
    assert kw["fair"] is None
    assert kw["cap"] is None  # outside any cap: it only fails
    assert kw["rate"] is not None

    from jobbers_celery.worker.start import start_keys

    d = Delivery(name="t.x", task_id="k1", retries=0, worker="w",
                 request=SimpleNamespace(args=(), kwargs={"tenant": "t1"}, headers={}),
                 signature=lambda: None)  # type: ignore[arg-type,return-value]
    assert isinstance(start_keys(d, opts).error, RateLimitKeyError)
