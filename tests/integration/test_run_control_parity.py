"""The control table has two copies: ``run_control.lua`` (it runs in Redis) and
``jobbers_celery.resubmit.pace.CONTROL`` (the Django sink and the in-memory store go by it).
For every (status, action) pair, the Lua script on a real Redis and the in-memory store move
a run exactly as :func:`~jobbers_celery.resubmit.pace.control_transition` says."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable

import pytest

from jobbers_celery.resubmit.pace import RunAction, RunStatus, control_transition
from jobbers_celery.store import RedisStore
from jobbers_celery.testing.runs import MemoryRuns

pytestmark = pytest.mark.redis

PAIRS = list(itertools.product(RunStatus, RunAction))


def _expected(status: RunStatus, action: RunAction) -> tuple[bool, str]:
    target = control_transition(status, action)
    return (True, target.value) if target is not None else (False, status.value)


@pytest.mark.parametrize(("status", "action"), PAIRS, ids=lambda v: str(v))
def test_lua_control_agrees_with_the_table(make_store: Callable[..., RedisStore],
                                           status: RunStatus, action: RunAction) -> None:
    store = make_store(f"ctl{time.monotonic_ns()}")
    run_id = store.create_run({"status": status.value, "rate": "1", "claimed": "0"},
                              ["a:1"], "{}")
    assert store.control_run(run_id, action.value, "test") == _expected(status, action)
    fields, *_ = store.run(run_id) or ({},)
    assert fields["status"] == (control_transition(status, action) or status).value


@pytest.mark.parametrize(("status", "action"), PAIRS, ids=lambda v: str(v))
def test_memory_control_agrees_with_the_table(status: RunStatus, action: RunAction) -> None:
    store = MemoryRuns()
    run_id = store.create_run({"status": status.value, "rate": "1", "claimed": "0"},
                              ["a:1"], "{}")
    assert store.control_run(run_id, action.value, "test") == _expected(status, action)


def test_no_such_run_moves_nothing(make_store: Callable[..., RedisStore]) -> None:
    store = make_store(f"ctl{time.monotonic_ns()}")
    assert store.control_run(987654, RunAction.CANCEL.value, "test") == (False, "")
