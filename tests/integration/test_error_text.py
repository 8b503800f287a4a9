"""A task failing with a huge exception message (issue 24) is recorded and dead-lettered with
the text cut (message head, traceback tail), and its worker goes on at once: the whole
message used to be redacted and stored in full in the dead letter."""

from __future__ import annotations

import time
from typing import Any

import pytest

from jobbers_celery import TaskState
from jobbers_celery.core.errortext import MESSAGE_MAX_CHARS, TRACEBACK_MAX_CHARS
from jobbers_celery.lifecycle.recorder import ERROR_MESSAGE_MAX_CHARS
from tests.conftest import wait_for
from tests.integration.lifecycle_helpers import dead_letters, wait_state

pytestmark = [pytest.mark.redis, pytest.mark.worker]

S = TaskState
MB = 1 << 20
MARK = 80


def test_a_huge_message_is_cut_and_the_worker_goes_on(proj: Any, worker_factory: Any) -> None:
    jobbers = proj.jobbers
    worker = worker_factory(pool="prefork", concurrency=1)
    assert proj.add.delay(1, 1).get(timeout=20) == 2  # the worker is up
    for unit in ("a.", "1.", " ", "\n"):
        began = time.monotonic()
        failed = proj.fails_with.delay(unit, MB)
        record = wait_state(jobbers, failed.id, S.FAILED, worker=worker)
        [entry] = wait_for(lambda t=failed.id: dead_letters(jobbers, t), timeout=10,
                           message="the dead letter")
        took = time.monotonic() - began
        assert record.error is not None
        assert len(record.error.message) <= ERROR_MESSAGE_MAX_CHARS + MARK
        assert entry.exception_message is not None
        assert entry.exception_message.endswith(f"[cut: {MB} characters in all]")
        assert len(entry.exception_message) <= MESSAGE_MAX_CHARS + MARK
        assert entry.traceback is not None
        assert len(entry.traceback) <= TRACEBACK_MAX_CHARS + MARK
        assert "in fails_with" in entry.traceback  # the innermost frame kept
        assert proj.add.delay(2, 3).get(timeout=20) == 5
        print(f"{unit!r} x 1 MB: failed and dead-lettered in {took:.2f}s")
