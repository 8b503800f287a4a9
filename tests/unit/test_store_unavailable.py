"""``Jobbers`` methods raise ``StoreUnavailable`` when Redis fails them, and the instance is
still the redis-py error it stands for (same class, message, pickling), so handlers written
for redis-py's errors keep working. ``Jobbers.now()`` reads the Redis clock."""

from __future__ import annotations

import pickle
from datetime import UTC, datetime
from typing import Any

import pytest
import redis
from celery import Celery
from redis.backoff import NoBackoff
from redis.retry import Retry

from jobbers_celery import Jobbers, StoreUnavailable, install
from tests.conftest import free_port


@pytest.fixture
def jobbers() -> Jobbers:
    app = Celery("unavailable", broker=f"redis://127.0.0.1:{free_port()}/0",
                 set_as_current=False)
    installed = install(app)
    # a port nothing listens on, failing at once
    installed.store.client = redis.Redis(port=free_port(), retry=Retry(NoBackoff(), 0))
    return installed


@pytest.mark.parametrize("call", [
    lambda j: j.counts(), lambda j: j.get("t-1"), lambda j: j.history("t-1"),
    lambda j: j.tasks(), lambda j: j.scheduled(), lambda j: j.now(),
    lambda j: j.cancel("t-1"), lambda j: j.resubmit(["t-1"]),
])
def test_an_unreachable_store_raises_store_unavailable(jobbers: Jobbers, call: Any) -> None:
    with pytest.raises(StoreUnavailable) as info:
        call(jobbers)
    exc = info.value
    assert isinstance(exc, redis.ConnectionError)
    assert type(exc).__name__ == "ConnectionError"
    assert type(exc).__module__ == "redis.exceptions"
    assert "Connection refused" in str(exc) or "connecting to" in str(exc)
    again = pickle.loads(pickle.dumps(exc))
    assert type(again) is redis.ConnectionError
    assert again.args == exc.args


def test_a_refused_call_keeps_its_redis_class_and_attributes(
        jobbers: Jobbers, monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(*_: Any) -> Any:
        raise redis.exceptions.NoPermissionError("NOPERM no permissions", status_code="NOPERM")

    monkeypatch.setattr(jobbers.store, "counts", refused)
    with pytest.raises(redis.exceptions.NoPermissionError) as info:
        jobbers.counts()
    assert isinstance(info.value, StoreUnavailable)
    assert info.value.status_code == "NOPERM"  # type: ignore[attr-defined]
    assert str(info.value) == "NOPERM no permissions"
    assert info.value.__traceback__ is not None


def test_other_errors_are_left_alone(jobbers: Jobbers) -> None:
    with pytest.raises(ValueError, match="at least one of") as info:
        jobbers.purge()
    assert not isinstance(info.value, StoreUnavailable)


def test_now_is_the_redis_clock(jobbers: Jobbers, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jobbers.store, "now_ms", lambda: 1_700_000_000_123)
    assert jobbers.now() == datetime(2023, 11, 14, 22, 13, 20, 123000, tzinfo=UTC)
