"""A task's exception is recorded and dead-lettered whole and redacted whatever it is: an
OSError's secret (in ``strerror`` and ``filename``, which ``str()`` reads, not its args)
shows nowhere; an exception whose ``__str__`` raises is still recorded ``failed`` with its
type and traceback (the recording used to raise: the record stayed ``started``)."""

from __future__ import annotations

from typing import Any

import pytest

from jobbers_celery import TaskState
from tests.conftest import wait_for
from tests.integration.lifecycle_helpers import dead_letters, wait_state

pytestmark = [pytest.mark.redis, pytest.mark.worker]

S = TaskState
SECRET = "pw-oserr-Zq7hunter9"


def test_an_oserrors_secret_and_an_unprintable_exception(proj: Any,
                                                         worker_factory: Any) -> None:
    jobbers = proj.jobbers
    worker = worker_factory(pool="prefork", concurrency=1)
    failed = proj.oserror_with.delay("db.example", SECRET)
    record = wait_state(jobbers, failed.id, S.FAILED, worker=worker)
    [entry] = wait_for(lambda: dead_letters(jobbers, failed.id), timeout=10,
                       message="the dead letter")
    assert record.error is not None
    assert "login to db.example refused" in record.error.message
    assert entry.exception_type == "PermissionError"
    wait_for(lambda: failed.id in worker.log and "PermissionError" in worker.log,
             timeout=20, message="the failure in the worker's log")
    with pytest.raises(PermissionError) as raised:
        failed.get(timeout=10, propagate=True)
    shown = {"record": record.error.message, "dead letter": entry.exception_message or "",
             "dead letter traceback": entry.traceback or "", "worker log": worker.log,
             "result": str(raised.value), "result traceback": failed.traceback or ""}
    assert [place for place, text in shown.items() if SECRET in text] == []

    unprintable = proj.bad_str.delay()
    record = wait_state(jobbers, unprintable.id, S.FAILED, worker=worker)
    [entry] = wait_for(lambda: dead_letters(jobbers, unprintable.id), timeout=10,
                       message="the dead letter")
    assert record.error is not None
    assert record.error.type.endswith("BadStr")
    assert entry.exception_message == "<exception str() failed>"
    assert "raise BadStr" in (entry.traceback or "")
