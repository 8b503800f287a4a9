"""The broker-dependent paths again, on RabbitMQ (``amqp://`` broker, state in Redis).

The cases are those the Redis-broker tests run (tests/integration/*_cases.py), called with
the same arguments: only the broker differs.
Every test here points ``tests.integration.proj`` (this process) and the workers it starts at
the session's own RabbitMQ vhost (tests/rabbitmq.py), with ``jobbers_redis_url`` on the
session's private Redis; the test queues are deleted before and after each test.

Chosen because RabbitMQ behaves differently from Redis there:

- the lifecycle and retries: publish, immediate retries, delayed retries (they wait in Redis
  and the scheduler republishes them), retries and resubmits routed to another queue,
  duplicate deliveries of one id;
- stall recovery after SIGKILL of the whole worker, with and without ``acks_late``:
  RabbitMQ gives an unacknowledged message back the moment the connection drops (Redis
  only after its visibility timeout), so the survivor receives the killed attempt's message
  at once and must refuse it;
- every ``on_shutdown`` policy on prefork, early ack and ``acks_late``, warm, cold and
  SIGTERM to the process group: the interrupted messages of an ``acks_late`` worker are
  redelivered when its channel closes; each body must still run as its policy says (and
  on the threads pool, where a policy applies at the task's next heartbeat);
- cancellation (at a heartbeat; ``terminate=True`` through the broker's broadcast; a
  scheduled retry);
- messages the worker refuses before running them: their headers are AMQP table fields
  there, JSON in the envelope on Redis, and the body must never be read.

shutdown_cases' ``broker()`` reads Redis lists; here it is replaced by one that reads the
vhost's queues (:meth:`RabbitVhost.held`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration import (
    cancel_cases,
    lifecycle_cases,
    refusal_cases,
    shutdown_cases,
    stall_cases,
)
from tests.rabbitmq import RabbitVhost, use_broker

pytestmark = [pytest.mark.redis, pytest.mark.worker, pytest.mark.rabbitmq]


@pytest.fixture(autouse=True)
def on_rabbitmq(proj: Any, rabbitmq: RabbitVhost, monkeypatch: pytest.MonkeyPatch,
                tmp_path: Path) -> Iterator[None]:
    """This test's broker is the session's RabbitMQ vhost, emptied before and after."""
    rabbitmq.reset()
    monkeypatch.setattr(shutdown_cases, "broker", rabbitmq.held)
    with use_broker(proj.app, rabbitmq.url, monkeypatch):
        yield
    rabbitmq.reset()
    logs = sorted(tmp_path.glob("w-*.log"))
    assert logs, "no worker ran"
    for log in logs:  # every worker of the test was on RabbitMQ
        assert "transport:   amqp://" in log.read_text(errors="replace"), log.name


ACKS = pytest.mark.parametrize("acks_late", [False, True], ids=["early_ack", "acks_late"])


# ----------------------------------------------------------------------------- lifecycle


def test_started_then_completed(proj, worker_factory):
    lifecycle_cases.started_then_completed_with_timestamps(proj, worker_factory, "prefork")


def test_immediate_retries(proj, worker_factory):
    lifecycle_cases.expected_exception_without_delay_retries_immediately(
        proj, worker_factory, "prefork")


def test_delayed_retries_wait_in_redis_and_are_republished(proj, worker_factory):
    lifecycle_cases.expected_exception_with_delay_waits_in_scheduled(
        proj, worker_factory, "prefork")


def test_retries_and_resubmits_stay_on_the_tasks_queue(proj, worker_factory):
    lifecycle_cases.retries_and_resubmits_stay_on_the_tasks_queue(proj, worker_factory)


def test_duplicate_delivery_runs_the_body_once(proj, worker_factory):
    lifecycle_cases.duplicate_delivery_runs_the_body_once(proj, worker_factory, "prefork")


# ----------------------------------------------------------------------- stall recovery


@ACKS
def test_killed_worker_task_is_stalled_and_resumed_once(proj, worker_factory, monkeypatch,
                                                        tmp_path, acks_late):
    monkeypatch.setenv("PROJ_ACKS_LATE", "1" if acks_late else "0")
    stall_cases.killed_worker_task_is_stalled_and_resumed_once_on_another_worker(
        proj, worker_factory, "resumable", "prefork")
    if acks_late:
        # RabbitMQ handed the killed attempt's message to the survivor at once; the record
        # said started, so it was refused and the stall recovery ran it (once, checked above)
        logs = "".join(p.read_text(errors="replace") for p in tmp_path.glob("w-*.log"))
        assert "it is started (duplicate or stale delivery)" in logs


def test_a_frozen_task_is_ended_by_its_worker_and_its_slot_runs_the_next(proj, worker_factory,
                                                                          r, monkeypatch):
    # acks_late: the ended attempt's message is acknowledged, not left holding a prefetch slot
    monkeypatch.setenv("PROJ_ACKS_LATE", "1")
    stall_cases.frozen_task_is_ended_by_its_worker_and_its_slot_runs_the_next(
        proj, worker_factory, r)


# ------------------------------------------------------------------- on_shutdown, prefork


@ACKS
def test_prefork_sigterm_three_policies_at_once(proj, worker_factory, r, acks_late):
    # The resubmit task runs 3 s (INTERRUPTED_S): it is interrupted only if the worker
    # notices the SIGTERM soon enough. Without ShutdownStep's 1 s wake-up an idle amqp
    # event loop sleeps until its next timer, the prefork pool's maintain_pool every 5 s:
    # when that sleep outlasts the body, this fails (the loop's phase is random, so not every
    # time); tests/unit/test_shutdown_step.py checks the wake-up timer itself.
    shutdown_cases.prefork_sigterm_three_policies_at_once(proj, worker_factory, r, acks_late)


def test_prefork_cold_shutdown_acks_late(proj, worker_factory, r):
    shutdown_cases.prefork_cold_shutdown(proj, worker_factory, r, "remap", True)


def test_prefork_sigterm_to_the_process_group_acks_late(proj, worker_factory, r):
    shutdown_cases.prefork_sigterm_to_the_process_group(proj, worker_factory, r, True)


def test_threads_sigterm_applies_the_policy_at_the_next_heartbeat(proj, worker_factory,
                                                                 r):
    shutdown_cases.cooperative_pools_apply_the_policy_at_the_next_heartbeat(
        proj, worker_factory, r, "threads", ("stop", "continue", "silent"))


# --------------------------------------------------------------------------- cancellation


def test_started_task_ends_cancelled_at_its_next_heartbeat(proj, worker_factory):
    cancel_cases.started_task_ends_cancelled_at_its_next_heartbeat(
        proj, worker_factory, "prefork")


def test_terminate_interrupts_a_prefork_task(proj, worker_factory):
    cancel_cases.terminate_interrupts_a_prefork_task_that_never_heartbeats(
        proj, worker_factory)


def test_scheduled_task_cancelled_at_once_and_never_republished(proj, worker_factory):
    cancel_cases.scheduled_task_cancelled_at_once_and_never_republished(
        proj, worker_factory)


# ------------------------------------------------------------------------ refused messages


def test_refused_messages_end_dropped_without_reading_the_body(proj, worker_factory,
                                                               tmp_path):
    refusal_cases.refused_messages_end_dropped(proj, worker_factory, tmp_path)
