"""Plain Celery and jobbers side by side: each of Celery's behaviours runs once with a plain
``celery.Task`` and once with ``JobbersTask`` (the same task code, only the base differs:
tests/integration/parity_proj.py), on real ``celery worker`` subprocesses and a redis-server
of the module's own, and the test asserts

* the same observable result for the caller: the value or the exception (type and message,
  task ids and keys masked) of ``AsyncResult.get()``, the final ``AsyncResult.state``, how
  many times the body ran and, where it matters, the order or the timing of its effects;
* that the jobbers record tells what happened: its state, the reasons in its history, its
  attempt count, its error.

Where jobbers differs on purpose the test asserts the difference and names it in
:data:`DELIBERATE`, with its reason (the docs cite that table). Every scenario is written to
``test-artifacts/parity.json`` (name, pool, plain outcome, jobbers outcome, the records,
same or deliberate) for the "Coming from plain Celery" table.

One worker per (variant, pool), shared by the module's tests (each scenario uses keys and
task ids of its own); both variants of a scenario run at the same time, each against its own
worker. Prefork runs every scenario; solo, threads (its apps built with ``task_cls=``),
gevent and eventlet a representative set; max_tasks_per_child has a prefork pair of its
own, and celery beat a beat process per variant. Eager mode and ``apply()`` run in this
process; Celery's pytest fixtures in a pytest of their own. At the end every record left is
read again against the state Celery's result backend stored.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from jobbers_celery import JobbersTask
from tests.conftest import ROOT, RedisServer, Worker, start_worker, subprocess_env
from tests.integration import parity_proj
from tests.integration.parity_cases import (
    TERMINAL,
    Outcome,
    Record,
    Side,
    applied,
    autoretry,
    chained,
    chord_failed_member,
    chord_member_dead_lettered,
    chorded,
    chunked,
    delayed,
    eager_chain,
    eager_failure,
    eager_retry,
    eager_success,
    ended_without_result,
    expected_exceptions,
    expected_exceptions_exhausted,
    expired,
    expired_before_countdown,
    failure,
    grouped,
    hard_limit,
    linked,
    linked_error,
    lost_after_revoke,
    mapped,
    rate_limited,
    rejected,
    replaced,
    replaced_in_chain,
    result_ignored,
    retry_countdown,
    retry_default_delay,
    retry_no_exc,
    revoked_running,
    revoked_waiting,
    sent_by_name,
    shared,
    soft_limit,
    starmapped,
    success,
    tasks_per_child,
    unencodable_argument,
    unencodable_result,
    worker_lost,
)

pytestmark = [pytest.mark.redis, pytest.mark.worker]

MODULE = "tests.integration.parity_proj"
REPORT = ROOT / "test-artifacts" / "parity.json"

#: Where jobbers differs from plain Celery on purpose: scenario -> why (the docs cite this
#: table). The test of each asserts the difference itself (``Outcome.apart``). The caller's
#: result is the same in each, but for the chord's callback in chord_member_dead_lettered.
DELIBERATE: dict[str, str] = {
    "countdown": (
        "apply_async(countdown=...) on a JobbersTask publishes no ETA message: the task is "
        "recorded submitted -> scheduled ('delayed first run (countdown)', run_at set) and "
        "waits in Redis until a worker's scheduler publishes it. Plain Celery publishes at "
        "once and a worker holds the ETA message unacknowledged until it is due, which a Redis "
        "broker delivers again once its visibility timeout passes (a second run) and a worker "
        "restart can lose. The caller gets the same result, no earlier than asked."),
    "eta": "apply_async(eta=...): as countdown ('delayed first run (eta)').",
    "retry_countdown": (
        "self.retry(countdown=...) on a JobbersTask waits in Redis (started -> scheduled, "
        "'retry n of m'), not in an ETA message a worker holds; same result, same timing."),
    "expected_exceptions_exhausted": (
        "As expected_exceptions (compared with autoretry_for, countdown 0), until the retries "
        "run out: the same FAILURE for the caller, failed in the record. What Celery's result "
        "backend keeps differs: jobbers publishes an immediate retry only once Celery's "
        "tracer has stored RETRY (task_postrun), so the last attempt's FAILURE is what stays. "
        "Plain Celery publishes first and stores RETRY after; the next attempt can end in the "
        "other pool process in between, and the late RETRY then replaces its FAILURE for "
        "good (Celery keeps only a stored SUCCESS): seen here for some of 20 tasks in most "
        "runs, and a later get() waits for ever."),
    "expected_exceptions": (
        "expected_exceptions is jobbers' own retry rule, with no plain Celery counterpart: "
        "without retry_delay the task is re-queued at once (started -> unsubmitted); the "
        "nearest plain option, autoretry_for, waits default_retry_delay (180 s) unless given "
        "a countdown. Compared here with autoretry_for and retry_kwargs={'countdown': 0}: "
        "same result, same runs."),
    "eager": (
        "A task run eagerly (task_always_eager) runs in the caller's process with no message "
        "and no worker: jobbers records nothing for it (no submission to track), the caller "
        "gets Celery's EagerResult."),
    "apply": "Task.apply() runs in the caller's process, as eager: no record.",
    "revoke_waiting": (
        "Celery's revoke (Flower's) of a task waiting for its countdown: plain Celery's worker "
        "holds the ETA message and marks it REVOKED at once; a JobbersTask waits in Redis, "
        "where no worker holds it, so the workers' revoked list stops it when it comes due "
        "(REVOKED then, the record cancelled 'revoked: the worker did not run it'). The "
        "same for the caller, up to the countdown later. jobbers.cancel(id) cancels it at "
        "once, and durably (a revoke lives in the workers' memory)."),
    "on_worker_lost_fail": (
        "on_worker_lost='fail' is jobbers' per-task choice for an acks_late task whose pool "
        "process was lost: the message is not requeued even with reject_on_worker_lost, the "
        "record says failed (WorkerLostError) and the task is dead-lettered, to be "
        "resubmitted deliberately (a task that kills its worker does not loop). The caller "
        "sees what plain Celery shows without reject_on_worker_lost (FAILURE, "
        "WorkerLostError). The default follows Celery (rerun when reject_on_worker_lost)."),
    "send_task_fair_key": (
        "app.send_task by the name of a JobbersTask with max_concurrent and concurrency_key "
        "takes its key's turn as delay() does: past the key's cap it is parked at its publish "
        "(submitted -> scheduled, no message) and published when the key has room. Plain "
        "Celery has no cap per key and runs the calls side by side. The same results for "
        "the caller."),
    "chord_member_dead_lettered": (
        "A chord header member that fails into the dead-letter queue (dead_letter_policy="
        "save) holds its chord part: the callback stays PENDING instead of failing with "
        "ChordError for good, and resubmitting the member runs the callback with every "
        "result. The member's own AsyncResult raises as in Celery."),
}

#: Fixes other helpers are making right now: scenario -> what is pending. Each marks that
#: scenario xfail(strict=True) until the fix lands.
PENDING: dict[str, str] = {}


_entries: dict[str, dict[str, Any]] = {}
_entries_lock = threading.Lock()


def report(name: str, pool: str, plain: Outcome, jobbers: Outcome) -> None:
    with _entries_lock:
        _entries[f"{name}[{pool}]"] = {
            "scenario": name,
            "pool": pool,
            "plain": {**plain.caller(), **({"apart": plain.apart} if plain.apart else {}),
                      "took_s": plain.took},
            "jobbers": {**jobbers.caller(),
                        **({"apart": jobbers.apart} if jobbers.apart else {}),
                        "took_s": jobbers.took},
            "records": {k: asdict(v) for k, v in jobbers.records.items()},
            "caller_same": plain.caller() == jobbers.caller(),
            "deliberate": DELIBERATE.get("eager" if name.startswith("eager_") else name),
            "pending": PENDING.get(name),
        }


def keep_log(worker: Worker, name: str) -> None:
    """A copy of a worker's log beside the report (pytest's temporary directories rotate)."""
    keep_log_text(worker.log, name)


def keep_log_text(text: str, name: str) -> None:
    logs = REPORT.parent / "parity-workers"
    logs.mkdir(parents=True, exist_ok=True)
    (logs / f"{name}.log").write_text(text)


def write_report() -> None:
    with _entries_lock:
        if not _entries:
            return
        entries = [_entries[k] for k in sorted(_entries)]
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    REPORT.write_text(json.dumps({"deliberate": DELIBERATE, "pending": PENDING,
                                  "backend_differs": {k: {"record": v[0], "celery": v[1],
                                                          "why": v[2]}
                                                      for k, v in BACKEND_DIFFERS.items()},
                                  "scenarios": entries}, indent=2, default=str) + "\n")


@dataclass
class Pair:
    """Both variants on one pool."""

    pool: str
    plain: Side
    jobbers: Side

    def run(self, name: str, scenario: Callable[[Side], Outcome], *,
            together: bool = True) -> tuple[Outcome, Outcome]:
        """Run ``scenario`` on both sides at once (``together``; else one after the
        other); report it; return (plain, jobbers)."""
        def timed(side: Side) -> Outcome:
            start = time.monotonic()
            out = scenario(side)
            out.took = round(time.monotonic() - start, 2)
            return out

        if together:
            futures = [_RUNNERS[side.variant].submit(timed, side)
                       for side in (self.plain, self.jobbers)]
            plain, jobbers = (f.result() for f in futures)
        else:
            plain, jobbers = (_RUNNERS[side.variant].submit(timed, side).result()
                              for side in (self.plain, self.jobbers))
        report(name, self.pool, plain, jobbers)
        return plain, jobbers


#: One thread per variant runs its side of every scenario: Celery keeps an app's result
#: backend (and its connections) per thread, so each app gets one, not one per scenario.
_RUNNERS = {v: ThreadPoolExecutor(1, thread_name_prefix=f"parity-{v}")
            for v in parity_proj.VARIANTS}


# --------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    """The module's own redis-server: broker, results, store and traces of both variants."""
    srv = RedisServer()
    yield srv
    srv.stop()
    write_report()


@pytest.fixture(scope="module")
def redis_base(server: RedisServer) -> str:
    return f"redis://127.0.0.1:{server.port}"


@pytest.fixture(scope="module")
def apps(redis_base: str) -> Iterator[dict[tuple[str, str], Celery]]:
    """The client apps, by (variant, style): ``base``, ``task_cls`` or ``eager``. The
    ``shared_task`` scenario's tasks are given to every app made in this process later: no
    longer once the module is done."""
    from celery import _state

    finalizers = set(_state._on_app_finalizers)
    built = {(v, style): parity_proj.build(v, redis_base, "base" if style == "eager" else style,
                                          eager=style == "eager")
             for v in parity_proj.VARIANTS for style in ("base", "task_cls", "eager")}
    yield built
    for runner in _RUNNERS.values():  # their results' __del__ unsubscribe while Redis answers
        runner.submit(gc.collect).result()
    gc.collect()
    for app in built.values():
        app.close()
    _state._on_app_finalizers.intersection_update(finalizers)
    parity_proj._shared_defined = False


#: The workers of a pair: pool, concurrency, extra arguments. "recycling" is a prefork
#: worker of its own for max_tasks_per_child: a task sent to a prefork worker just after it
#: replaced a child can wait about 5 s (plain Celery as jobbers, billiard's start of the new
#: child), which every scenario sharing the worker would pay.
POOL_OPTIONS: dict[str, tuple[str, int, tuple[str, ...]]] = {
    "prefork": ("prefork", 2, ()),
    "recycling": ("prefork", 2, ("--max-tasks-per-child", "3")),
    "solo": ("solo", 1, ()),
    "threads": ("threads", 4, ()),
    "gevent": ("gevent", 8, ()),
    "eventlet": ("eventlet", 8, ()),
}
OTHER_POOLS = ["solo", "threads", "gevent", "eventlet"]
#: The threads workers run the apps built with task_cls= (their tasks name no base).
STYLE = {"threads": "task_cls"}


@contextlib.contextmanager
def pair_of(pool: str, apps: dict[tuple[str, str], Celery], redis_base: str,
            log_dir: Path) -> Iterator[Pair]:
    """Both variants' workers on ``pool``, started at the same time."""
    kind, concurrency, extra = POOL_OPTIONS[pool]
    style = STYLE.get(pool, "base")

    def start(variant: str) -> Side:
        app = apps[(variant, style)]
        env = {"PARITY_VARIANT": variant, "PARITY_REDIS": redis_base, "PARITY_STYLE": style}
        worker = start_worker(app, MODULE, log_dir, pool=kind, concurrency=concurrency,
                              env=env, options=("--without-mingle", "--without-gossip",
                                                "--without-heartbeat", *extra),
                              timeout=60)
        return Side(variant, app, redis_base, worker)

    sides: list[Side] = []
    with ThreadPoolExecutor(2) as ex:
        futures = [ex.submit(start, v) for v in parity_proj.VARIANTS]
        errors = []
        for f in futures:
            try:
                sides.append(f.result())
            except BaseException as exc:  # noqa: BLE001 - raised below, once both ended
                errors.append(exc)
    try:
        if errors:
            raise errors[0]
        yield Pair(pool, sides[0], sides[1])
    finally:
        for side in sides:
            if side.worker is not None:
                side.worker.kill()
                keep_log(side.worker, f"{pool}-{side.variant}")


@pytest.fixture(scope="module")
def prefork(apps: dict[tuple[str, str], Celery], redis_base: str,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    with pair_of("prefork", apps, redis_base, tmp_path_factory.mktemp("parity-prefork")
                 ) as pair:
        yield pair


@pytest.fixture(scope="module")
def recycling(apps: dict[tuple[str, str], Celery], redis_base: str,
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    with pair_of("recycling", apps, redis_base, tmp_path_factory.mktemp("parity-recycling")
                 ) as pair:
        yield pair


@pytest.fixture(scope="module")
def pools(apps: dict[tuple[str, str], Celery], redis_base: str,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], Pair]]:
    """The pair of a pool of OTHER_POOLS, started when first asked for; the previous pool's
    pair is stopped then (the tests come pool by pool), so one pair runs at a time."""
    running: dict[str, tuple[contextlib.ExitStack, Pair]] = {}

    def pair(pool: str) -> Pair:
        if pool not in running:
            for stack, _ in running.values():
                stack.close()
            running.clear()
            stack = contextlib.ExitStack()
            started = stack.enter_context(pair_of(
                pool, apps, redis_base, tmp_path_factory.mktemp(f"parity-{pool}")))
            running[pool] = (stack, started)
        return running[pool][1]

    yield pair
    for stack, _ in running.values():
        stack.close()


# =========================================================================== the checks
# What the jobbers record must say, per scenario (and the deliberate differences).

def all_completed(plain: Outcome, jobbers: Outcome) -> None:
    for label, rec in jobbers.records.items():
        assert rec.state == "completed", (label, rec)
        assert rec.attempt == 1, (label, rec)
        assert rec.last == "started -> completed: ", (label, rec)


def failed_with(reason: str, error: str | None = None, attempt: int = 1,
                label: str = "task") -> Callable[[Outcome, Outcome], None]:
    def check(plain: Outcome, jobbers: Outcome) -> None:
        rec = jobbers.records[label]
        assert rec.state == "failed", rec
        assert rec.attempt == attempt, rec
        assert rec.last == f"started -> failed: {reason}", rec
        if error is not None:
            assert rec.error is not None
            assert rec.error.startswith(error), rec
    return check


def check_failure(plain: Outcome, jobbers: Outcome) -> None:
    failed_with("unexpected exception", "ValueError: boom")(plain, jobbers)


def check_retry_countdown(plain: Outcome, jobbers: Outcome) -> None:
    rec = jobbers.records["task"]
    assert (rec.state, rec.attempt) == ("completed", 3), rec
    assert rec.moved("started", "scheduled") == ["retry 1 of 3", "retry 2 of 3"], rec
    assert rec.moved("scheduled", "submitted") == ["run_at reached"] * 2, rec


def check_link(plain: Outcome, jobbers: Outcome) -> None:
    all_completed(plain, jobbers)
    assert set(jobbers.records) == {"task", "callback"}


def check_link_error(plain: Outcome, jobbers: Outcome) -> None:
    failed_with("unexpected exception", "ValueError: boom")(plain, jobbers)
    errback = jobbers.records["errback"]
    assert (errback.state, errback.attempt) == ("completed", 1), errback


def check_chord_failed_member(plain: Outcome, jobbers: Outcome) -> None:
    ok, bad = jobbers.records["ok member"], jobbers.records["failed member"]
    assert (ok.state, bad.state) == ("completed", "failed"), (ok, bad)
    assert bad.last == "started -> failed: unexpected exception", bad
    callback = jobbers.records["callback"]
    assert callback.attempt == 0, callback  # never started, as in plain Celery
    assert callback.state in (None, "submitted", "failed", "cancelled"), callback


def check_retry_no_exc(plain: Outcome, jobbers: Outcome) -> None:
    failed_with("retries exhausted", "celery.exceptions.MaxRetriesExceededError: Can't retry",
                attempt=2)(plain, jobbers)
    assert jobbers.records["task"].moved("started", "scheduled") == ["retry 1 of 1"]


def check_retry_default_delay(plain: Outcome, jobbers: Outcome) -> None:
    rec = jobbers.records["task"]
    assert (rec.state, rec.attempt) == ("completed", 2), rec
    assert rec.moved("started", "scheduled") == ["retry 1 of 3"], rec


def check_autoretry(plain: Outcome, jobbers: Outcome) -> None:
    rec = jobbers.records["task"]
    assert (rec.state, rec.attempt) == ("completed", 3), rec
    # full jitter: each wait 0 s (re-queued at once) or 1 s (scheduled)
    assert [*rec.moved("started", "scheduled"), *rec.moved("started", "unsubmitted")
            ] in (["retry 1 of 2", "retry 2 of 2"], ["retry 2 of 2", "retry 1 of 2"]), rec


def check_autoretry_exhausted(plain: Outcome, jobbers: Outcome) -> None:
    failed_with("retries exhausted", "tests.integration.parity_proj.Flaky: attempt 2", attempt=3)(
        plain, jobbers)


def check_expected_exceptions(plain: Outcome, jobbers: Outcome) -> None:
    rec = jobbers.records["task"]
    assert (rec.state, rec.attempt) == ("completed", 3), rec
    assert rec.moved("started", "unsubmitted") == ["retry 1 of 3", "retry 2 of 3"], rec
    assert rec.moved("started", "scheduled") == [], rec


def check_expected_exhausted(plain: Outcome, jobbers: Outcome) -> None:
    assert jobbers.apart["stored last"] == ["FAILURE"]  # never a late RETRY
    assert set(plain.apart["stored last"]) <= {"FAILURE", "RETRY"}
    for label, rec in jobbers.records.items():
        assert (rec.state, rec.attempt) == ("failed", 4), (label, rec)
        assert rec.last == "started -> failed: retries exhausted", (label, rec)


def no_false_stall(plain: Outcome, jobbers: Outcome) -> Record:
    """A body that ended (a bare Retry, Ignore) ends its attempt: the record is never left
    started, and a cleaner pass finds no stall later."""
    rec, later = jobbers.records["task"], jobbers.records["task, after a cleaner pass"]
    assert rec.state in TERMINAL - {"stalled"}, rec
    assert later.path == rec.path, later
    assert rec.attempt == 1, rec
    return rec


def check_raise_retry(plain: Outcome, jobbers: Outcome) -> None:
    rec = no_false_stall(plain, jobbers)
    assert rec.state == "failed", rec
    assert rec.last == ("started -> failed: raised Retry without sending a new message: "
                        "nothing runs it again"), rec
    assert rec.error is not None
    assert rec.error.startswith("celery.exceptions.Retry"), rec


def check_ignore(plain: Outcome, jobbers: Outcome) -> None:
    rec = no_false_stall(plain, jobbers)
    assert rec.state == "completed", rec
    assert rec.last == "started -> completed: ended by Ignore (Celery stores no result)", rec


def check_reject_requeue(plain: Outcome, jobbers: Outcome) -> None:
    rec = jobbers.records["task"]
    assert (rec.state, rec.attempt) == ("completed", 2), rec
    assert rec.moved("started", "unsubmitted") == ["rejected with requeue"], rec


def check_reject_requeue_early_ack(plain: Outcome, jobbers: Outcome) -> None:
    """Reject(requeue=True) of a message acknowledged when the task started (no acks_late):
    Celery has nothing to hand back, nothing runs the task again: its attempt ended."""
    rec = jobbers.records["task"]
    assert (rec.state, rec.attempt) == ("failed", 1), rec
    assert rec.last == ("started -> failed: rejected with requeue, but its message was "
                        "acknowledged when it started (no acks_late): nothing runs it again"), rec
    assert rec.error is not None
    assert rec.error.startswith("celery.exceptions.Reject"), rec


def check_replace(plain: Outcome, jobbers: Outcome) -> None:
    """The replacement takes the replaced task's id (Celery's rule): one record, the
    replaced attempt handed over to it, then the replacement's run."""
    label = "task" if "task" in jobbers.records else "replaced"
    rec = jobbers.records[label]
    assert (rec.state, rec.attempt) == ("completed", 2), rec
    assert rec.moved("started", "unsubmitted") == ["replaced by parity.add"], rec
    assert rec.last == "started -> completed: ", rec
    if "next link" in jobbers.records:
        nxt = jobbers.records["next link"]
        assert (nxt.state, nxt.attempt, nxt.last) == ("completed", 1,
                                                      "started -> completed: "), nxt


def check_expired(plain: Outcome, jobbers: Outcome) -> None:
    rec = jobbers.records["task"]
    assert (rec.state, rec.attempt) == ("cancelled", 0), rec
    assert rec.last == ("submitted -> cancelled: expired: the worker did not run it "
                        "(its expires had passed)"), rec


def check_expired_before_countdown(plain: Outcome, jobbers: Outcome) -> None:
    check_expired(plain, jobbers)
    assert jobbers.records["task"].moved("submitted", "scheduled") == [
        "delayed first run (countdown)"]


def check_revoked_waiting(plain: Outcome, jobbers: Outcome) -> None:
    check_revoked(plain, jobbers)
    rec = jobbers.records["task"]
    assert rec.moved("submitted", "scheduled") == ["delayed first run (countdown)"], rec
    assert rec.last == "submitted -> cancelled: revoked: the worker did not run it", rec


def check_revoked(plain: Outcome, jobbers: Outcome) -> None:
    rec = jobbers.records["task"]
    assert rec.state == "cancelled", rec
    assert "revoke" in rec.last, rec
    assert not any("stalled" in p or "failed" in p for p in rec.path), rec


def check_lost_after_revoke(plain: Outcome, jobbers: Outcome) -> None:
    assert plain.seen["the lost tasks"] == ["value 2", "value 2"]
    check_revoked(plain, Outcome(records={"task": jobbers.records["revoked"]}))
    for label in ("lost 0", "lost 1"):
        rec = jobbers.records[label]
        assert (rec.state, rec.attempt) == ("completed", 2), (label, rec)
        assert any("its worker process was lost" in p for p in rec.path), (label, rec)


def check_delayed(how: str) -> Callable[[Outcome, Outcome], None]:
    def check(plain: Outcome, jobbers: Outcome) -> None:
        all_completed(plain, jobbers)
        rec = jobbers.records["task"]
        assert rec.moved("submitted", "scheduled") == [f"delayed first run ({how})"], rec
        assert rec.moved("scheduled", "submitted") == ["run_at reached"], rec
        # the deliberate difference: where the task waits
        assert plain.apart == {"while it waits": {"broker holds a message": True}}
        assert jobbers.apart == {"while it waits": {"record": "scheduled",
                                                    "broker holds a message": False}}
    return check


def check_unencodable_result(plain: Outcome, jobbers: Outcome) -> None:
    failed_with("its result could not be stored", "kombu.exceptions.EncodeError")(
        plain, jobbers)


def check_unencodable_argument(plain: Outcome, jobbers: Outcome) -> None:
    rec = jobbers.records["task"]
    assert (rec.state, rec.attempt) == ("dropped", 0), rec
    assert rec.last.startswith("submitted -> dropped: never sent: publishing raised "
                               "EncodeError"), rec


def check_worker_lost(plain: Outcome, jobbers: Outcome) -> None:
    rec = jobbers.records["task"]
    # Celery runs the requeued copy again: so does jobbers, recording the lost attempt
    assert (rec.state, rec.attempt) == ("completed", 2), rec
    assert any("WorkerLostError" in p for p in rec.path), rec
    assert not any("stalled" in p for p in rec.path), rec


def check_worker_lost_failed(plain: Outcome, jobbers: Outcome) -> None:
    check_worker_lost_failed_reason(jobbers.records["task"])


def check_worker_lost_failed_reason(rec: Record) -> None:
    assert (rec.state, rec.attempt) == ("failed", 1), rec
    assert rec.error is not None
    assert rec.error.startswith("billiard.exceptions.WorkerLostError"), rec
    assert not any("stalled" in p for p in rec.path), rec


def check_retry_on_worker_lost(plain: Outcome, jobbers: Outcome) -> None:
    """Celery 5.7's retry_on_worker_lost: the lost attempt ended, the retry recorded (it
    waits default_retry_delay in Redis, as any countdown), then run."""
    rec = jobbers.records["task"]
    assert (rec.state, rec.attempt) == ("completed", 2), rec
    assert len(moved := rec.moved("started", "unsubmitted")) == 1, rec
    assert moved[0].startswith("its worker process was lost (WorkerLostError"), rec
    assert moved[0].endswith("Celery retries it (retry_on_worker_lost)"), rec
    assert not any("stalled" in p for p in rec.path), rec


def check_worker_lost_refused(plain: Outcome, jobbers: Outcome) -> None:
    """on_worker_lost=fail (jobbers' choice per task): failed and dead-lettered although
    the task sets reject_on_worker_lost; the caller sees what plain Celery shows without
    reject_on_worker_lost."""
    check_worker_lost_failed_reason(jobbers.records["task"])
    assert jobbers.apart["dead letters"] == 1


def check_chord_member_dead_lettered(plain: Outcome, jobbers: Outcome) -> None:
    assert plain.apart == {"callback": "FAILURE"}  # ChordError, for good
    assert jobbers.apart == {"callback": "PENDING",  # held by the dead-lettered member
                             "after resubmitting the member": "value 22"}
    member = jobbers.records["member, resubmitted"]
    assert (member.state, member.attempt) == ("completed", 2), member
    callback = jobbers.records["callback"]
    assert (callback.state, callback.attempt) == ("completed", 1), callback


def check_sent_by_name(plain: Outcome, jobbers: Outcome) -> None:
    """send_task by name of a keyed task: the same results; jobbers ran one at a time and
    parked the calls past the key's place at their publish (a run takes 0.3 s, the three
    publishes a few milliseconds: at least the third, usually the second too)."""
    all_completed(plain, jobbers)
    assert jobbers.apart["overlapping runs"] == 0, jobbers.apart
    assert jobbers.apart["parked at their publish"] >= 1, jobbers.apart
    parked = [label for label, rec in jobbers.records.items()
              if rec.moved("submitted", "scheduled")]
    assert len(parked) >= 1, jobbers.records
    for label in parked:
        [reason] = jobbers.records[label].moved("submitted", "scheduled")
        assert reason.endswith("at max_concurrent=1: parked, no retry used"), (label, reason)


def no_record(plain: Outcome, jobbers: Outcome) -> None:
    """Eager and apply(): nothing recorded (DELIBERATE)."""
    for label, rec in jobbers.records.items():
        assert (rec.state, rec.path) == (None, []), (label, rec)


@dataclass(frozen=True)
class Case:
    run: Callable[[Side], Outcome]
    check: Callable[[Outcome, Outcome], None]
    pools: tuple[str, ...] = ("prefork",)


EVERY_POOL = ("prefork", *OTHER_POOLS)

CASES: dict[str, Case] = {
    # canvas
    "success": Case(success, all_completed, EVERY_POOL),
    "failure": Case(failure, check_failure, EVERY_POOL),
    "chain": Case(chained, all_completed, EVERY_POOL),
    "group": Case(grouped, all_completed, EVERY_POOL),
    "chord": Case(chorded, all_completed, EVERY_POOL),
    "starmap": Case(starmapped, all_completed),
    "map": Case(mapped, all_completed),
    "chunks": Case(chunked, all_completed, ("prefork", "threads")),
    "link": Case(linked, check_link),
    "link_error": Case(linked_error, check_link_error),
    "chord_failed_member": Case(chord_failed_member, check_chord_failed_member),
    # retries
    "retry_countdown": Case(retry_countdown, check_retry_countdown, EVERY_POOL),
    "retry_no_exc": Case(retry_no_exc, check_retry_no_exc),
    "retry_default_delay": Case(retry_default_delay, check_retry_default_delay),
    "autoretry_backoff_jitter": Case(autoretry(2), check_autoretry, ("prefork", "gevent")),
    "autoretry_exhausted": Case(autoretry(5), check_autoretry_exhausted),
    "expected_exceptions": Case(expected_exceptions, check_expected_exceptions),
    "expected_exceptions_exhausted": Case(expected_exceptions_exhausted,
                                          check_expected_exhausted),
    "raise_retry": Case(ended_without_result("raise_retry"), check_raise_retry,
                        ("prefork", "eventlet")),
    # other endings
    "reject_requeue": Case(rejected(True), check_reject_requeue, ("prefork", "gevent")),
    "reject_requeue_early_ack": Case(rejected(True, "reject_early_ack"),
                                     check_reject_requeue_early_ack),
    "reject_no_requeue": Case(rejected(False), failed_with("rejected", "ValueError: not now")),
    "ignore_after_update_state": Case(ended_without_result("ignore"), check_ignore,
                                      ("prefork", "threads")),
    "replace": Case(replaced, check_replace, ("prefork", "solo")),
    "replace_in_chain": Case(replaced_in_chain, check_replace),
    "unencodable_result": Case(unencodable_result, check_unencodable_result),
    "unencodable_argument": Case(unencodable_argument, check_unencodable_argument),
    # limits, timing
    "soft_time_limit": Case(soft_limit(False), failed_with(
        "unexpected exception", "billiard.exceptions.SoftTimeLimitExceeded")),
    "soft_time_limit_caught": Case(soft_limit(True), all_completed),
    "hard_time_limit": Case(hard_limit, failed_with(
        "TimeLimitExceeded reported by the worker", "billiard.exceptions.TimeLimitExceeded")),
    "rate_limit": Case(rate_limited, all_completed),
    "expires": Case(expired, check_expired),
    "expires_before_countdown": Case(expired_before_countdown, check_expired_before_countdown),
    "countdown": Case(delayed("countdown"), check_delayed("countdown")),
    "eta": Case(delayed("eta"), check_delayed("eta")),
    "ignore_result": Case(result_ignored, all_completed),
    "revoke_waiting": Case(revoked_waiting, check_revoked_waiting),
    "revoke_terminate_running": Case(revoked_running, check_revoked),
    "worker_lost_after_revoke_terminate": Case(lost_after_revoke, check_lost_after_revoke),
    # the worker
    "acks_late_worker_lost": Case(worker_lost("lost"), check_worker_lost),
    "acks_late_worker_lost_no_reject": Case(worker_lost("lost_no_reject"),
                                            check_worker_lost_failed),
    "on_worker_lost_fail": Case(worker_lost("lost_refused"), check_worker_lost_refused),
    "retry_on_worker_lost": Case(worker_lost("lost_retried"), check_retry_on_worker_lost),
    "chord_member_dead_lettered": Case(chord_member_dead_lettered,
                                       check_chord_member_dead_lettered),
    "max_tasks_per_child": Case(tasks_per_child, all_completed, ("recycling",)),
    "shared_task": Case(shared, all_completed, ("prefork", "eventlet")),
    "send_task_fair_key": Case(sent_by_name, check_sent_by_name),
}

EAGER: dict[str, Callable[[Side], Outcome]] = {
    "eager_success": eager_success,
    "eager_failure": eager_failure,
    "eager_retry": eager_retry,
    "eager_chain": eager_chain,
    "apply": applied,
}


def params(names: list[str]) -> list[Any]:
    """``names`` as parameters, each xfail(strict) while its fix is pending."""
    return [pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=f"pending: {PENDING[n]}"))
            if n in PENDING else n for n in names]


# =========================================================================== the tests
@pytest.mark.parametrize("name", params([n for n, c in CASES.items() if "prefork" in c.pools]))
def test_prefork(prefork: Pair, name: str) -> None:
    case = CASES[name]
    plain, jobbers = prefork.run(name, case.run)
    assert jobbers.caller() == plain.caller()
    case.check(plain, jobbers)


def on_other_pools() -> list[Any]:
    """(pool, scenario) of the representative set, xfail(strict) while a fix is pending."""
    return [pytest.param(pool, name, marks=[pytest.mark.xfail(
                strict=True, reason=f"pending: {PENDING[name]}")] if name in PENDING else [],
                         id=f"{pool}-{name}")
            for pool in OTHER_POOLS for name, case in CASES.items() if pool in case.pools]


@pytest.mark.parametrize(("pool", "name"), on_other_pools())
def test_other_pools(pools: Callable[[str], Pair], pool: str, name: str) -> None:
    case = CASES[name]
    other_pool = pools(pool)
    plain, jobbers = other_pool.run(name, case.run)
    assert jobbers.caller() == plain.caller()
    case.check(plain, jobbers)
    if other_pool.pool == "threads":  # the app's task_cls= made every task a JobbersTask
        assert isinstance(other_pool.jobbers.task("add"), JobbersTask)
        assert not isinstance(other_pool.plain.task("add"), JobbersTask)


def test_max_tasks_per_child(recycling: Pair) -> None:
    """``--max-tasks-per-child 3``: children replaced, every task run and recorded once."""
    case = CASES["max_tasks_per_child"]
    plain, jobbers = recycling.run("max_tasks_per_child", case.run)
    assert jobbers.caller() == plain.caller()
    case.check(plain, jobbers)


@pytest.mark.parametrize("name", list(EAGER))
def test_eager(apps: dict[tuple[str, str], Celery], redis_base: str, name: str) -> None:
    """``task_always_eager`` and ``apply()``: Celery's result, nothing recorded."""
    style = "base" if name == "apply" else "eager"
    pair = Pair("in the caller", *(Side(v, apps[(v, style)], redis_base)
                                   for v in parity_proj.VARIANTS))
    # one after the other: an eager call sets Celery's process-wide "a join would block"
    # flag and puts back what it found, so two at once can leave it set for the process
    # (every later AsyncResult.get() here would raise "Never call result.get() within a task")
    plain, jobbers = pair.run(name, EAGER[name], together=False)
    assert jobbers.caller() == plain.caller()
    no_record(plain, jobbers)


#: Scenarios whose jobbers worker logs a refused transition today: scenario -> the pending
#: fix (an xfail(strict) each, as PENDING).
REFUSALS_PENDING: dict[str, str] = {}


@pytest.mark.parametrize("name", [
    pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=f"pending: {REFUSALS_PENDING[n]}"))
    if n in REFUSALS_PENDING else n for n, c in CASES.items() if "prefork" in c.pools])
def test_no_refused_transition_logged(prefork: Pair, name: str) -> None:
    """The scenario ``name`` (run above on prefork) made the jobbers worker log no refused
    transition: a step the record refused is a sign that two parts of jobbers disagreed on
    how the task ended (the worker logs it as a warning)."""
    with _entries_lock:
        entry = _entries.get(f"{name}[prefork]")
    if entry is None:
        _not_run(f"{name} did not run in this session")
    ids = {rec["task_id"] for rec in entry["records"].values()}
    assert prefork.jobbers.worker is not None
    lines = [line.split("] ", 1)[-1] for line in prefork.jobbers.worker.log.splitlines()
             if "refused transition" in line
             and (m := re.search(r"of task (\S+)", line)) and m.group(1) in ids]
    assert lines == []


def _not_run(why: str) -> None:
    """A check of scenarios that did not run: skipped in a selection (``-k``), a failure
    in CI, where the whole module runs on one pytest worker (its xdist group)."""
    if os.environ.get("CI") == "true":
        pytest.fail(why)
    pytest.skip(why)


#: How the record's final state and Celery's stored state pair up: agreement, or where the
#: result backend tells a different story on purpose (scenario -> (record, Celery, why)).
AGREE = {("completed", "SUCCESS"), ("failed", "FAILURE"), ("cancelled", "REVOKED")}
BACKEND_DIFFERS: dict[str, tuple[str, str, str]] = {
    "ignore_result": ("completed", "PENDING", "ignore_result: Celery stores nothing"),
    "ignore_after_update_state": (
        "completed", "PROGRESS", "Ignore: Celery keeps what the task stored last"),
    "raise_retry": ("failed", "RETRY", "Celery stores RETRY and nothing runs the task again"),
    "reject_requeue_early_ack": (
        "failed", "PENDING", "Celery stores nothing and nothing runs the task again"),
    "unencodable_argument": ("dropped", "PENDING", "never sent: the publish raised"),
}


def test_record_agrees_with_the_result_backend(apps: dict[tuple[str, str], Celery]) -> None:
    """Every record the scenarios above left, read again now that all have settled, agrees
    with what Celery's result backend stored for the task (AGREE), or differs as
    BACKEND_DIFFERS says. The pairs go into the report ("backend" of each record)."""
    app = apps[("jobbers", "base")]
    side = Side("jobbers", app, "")
    with _entries_lock:
        entries = list(_entries.values())
    if not entries:
        _not_run("no scenario ran in this session")
    wrong = []
    for entry in entries:
        for label, seen in entry["records"].items():
            rec = side.read(seen["task_id"])
            if rec.state is None:  # eager, apply(), a chord callback never published
                continue
            stored = str(app.AsyncResult(seen["task_id"]).state)
            seen["backend"] = f"record {rec.state}, Celery {stored}"
            expected = BACKEND_DIFFERS.get(entry["scenario"])
            if (rec.state, stored) not in AGREE and (
                    expected is None or (rec.state, stored) != expected[:2]):
                wrong.append(f"{entry['scenario']}[{entry['pool']}] {label}: record "
                             f"{rec.state}, Celery {stored}")
    assert wrong == []


def test_beat(prefork: Pair, redis_base: str, tmp_path: Path) -> None:
    """``celery beat`` sends a user's schedule entry (every 0.3 s) to each variant's prefork
    worker: the entry runs on both; on jobbers each run is a recorded task, completed (and
    beat also sends the cleaner's entry, which install() adds)."""

    def beat(side: Side) -> Outcome:
        key = side.key("beat")
        env = {"PARITY_VARIANT": side.variant, "PARITY_REDIS": redis_base,
               "PARITY_BEAT_KEY": key}
        log = tmp_path / f"beat-{side.variant}.log"
        with log.open("w") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", MODULE, "beat", "-l", "INFO",
                 "-s", str(tmp_path / f"schedule-{side.variant}"), "--pidfile="],
                cwd=ROOT, env=subprocess_env(env), stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True)
        try:
            traces = side.wait_traces(key, 2, timeout=30)
        finally:
            proc.terminate()
            proc.wait(20)
            keep_log_text(log.read_text(errors="replace"), f"beat-{side.variant}")
        result = Outcome("entry sent and run", "", len(traces[:2]))
        if side.tracked:
            for i, trace in enumerate(traces[:2]):
                result.records[f"run {i}"] = side.record(trace["id"])
        return result

    plain, jobbers = prefork.run("beat", beat)
    assert jobbers.caller() == plain.caller()
    all_completed(plain, jobbers)


# =========================================================================== Celery's fixtures
FIXTURE_CONFTEST = '''
import os

import pytest

from jobbers_celery import install

pytest_plugins = ()  # celery.contrib.pytest comes with -p, as the docs of Celery say


@pytest.fixture(scope="session")
def celery_config():
    return {
        "broker_url": os.environ["FX_BROKER"],
        "result_backend": os.environ["FX_BACKEND"],
        "jobbers_redis_url": os.environ["FX_STORE"],
        "jobbers_scheduler_interval": 0.1,
        # the memory transport polls every second by default: each test would wait for it
        "broker_transport_options": {"polling_interval": 0.05},
    }


if os.environ["FX_VARIANT"] == "jobbers":
    @pytest.fixture
    def celery_app(celery_app):
        install(celery_app)
        return celery_app
'''

FIXTURE_TESTS = '''
import os
import time

from celery import Task

from jobbers_celery import JobbersTask, TaskState, get_jobbers

BASE = JobbersTask if os.environ["FX_VARIANT"] == "jobbers" else Task


def recorded(app, task_id, state):
    if BASE is Task:
        return
    deadline = time.monotonic() + 10
    while get_jobbers(app).get(task_id).state is not state:
        assert time.monotonic() < deadline, get_jobbers(app).history(task_id)
        time.sleep(0.05)


def test_first(celery_app, celery_worker):
    @celery_app.task(base=BASE, bind=True)
    def mul(self, x, y):
        return x * y

    celery_worker.reload()
    res = mul.delay(4, 4)
    assert res.get(timeout=10) == 16
    recorded(celery_app, res.id, TaskState.COMPLETED)


def test_second(celery_app, celery_worker):
    @celery_app.task(base=BASE, bind=True)
    def flaky(self, n):
        if self.request.retries < n:
            raise self.retry(countdown=0.2)
        return self.request.retries

    celery_worker.reload()
    res = flaky.delay(1)
    assert res.get(timeout=10) == 1
    recorded(celery_app, res.id, TaskState.COMPLETED)
'''


def fixtures_run(tmp: Path, variant: str, env: dict[str, str]) -> Outcome:
    """Celery's pytest fixtures in a pytest of their own, as in a user's suite: two tests in
    a row, each with its embedded worker."""
    (tmp / "conftest.py").write_text(FIXTURE_CONFTEST)
    (tmp / "test_two_in_a_row.py").write_text(FIXTURE_TESTS)
    (tmp / "pytest.ini").write_text("[pytest]\n")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "celery.contrib.pytest", "-p", "no:cacheprovider",
         "-p", "no:django", "-q", "--timeout", "30", "--durations", "4",
         "-c", str(tmp / "pytest.ini"), "--rootdir", str(tmp), str(tmp)],
        cwd=tmp, env=subprocess_env({**env, "FX_VARIANT": variant}), capture_output=True,
        text=True, timeout=120, check=False)
    logs = REPORT.parent / "parity-workers"
    logs.mkdir(parents=True, exist_ok=True)
    (logs / f"pytest-fixtures-{tmp.parent.name}-{variant}.log").write_text(
        proc.stdout + proc.stderr)
    summary = re.findall(r"^=*\s*(\d+ (?:passed|failed|error).*?) in [\d.]+s", proc.stdout,
                         re.MULTILINE)
    result = (re.sub(r"\s*=+$", "", summary[-1]) if summary
              else f"pytest crashed (exit {proc.returncode})")
    return Outcome(result, f"exit {proc.returncode}", 2)


def test_celery_pytest_fixtures(redis_base: str, tmp_path: Path) -> None:
    """``celery.contrib.pytest``'s ``celery_app`` and ``celery_worker``, two tests in a row, on
    a Redis broker and on ``memory://`` (results in ``cache+memory://``), each variant in a
    pytest of its own, all four at once: the same for both (jobbers: records completed)."""
    runs = [(broker, variant) for broker in ("redis", "memory") for variant in parity_proj.VARIANTS]

    def run(broker: str, variant: str) -> Outcome:
        url = f"{redis_base}/{7 + runs.index((broker, variant))}"  # dbs 7 to 10
        env = ({"FX_BROKER": url, "FX_BACKEND": url} if broker == "redis"
               else {"FX_BROKER": "memory://", "FX_BACKEND": "cache+memory://"})
        work = tmp_path / broker / variant
        work.mkdir(parents=True)
        return fixtures_run(work, variant, {**env, "FX_STORE": url})

    with ThreadPoolExecutor(len(runs)) as ex:
        outcomes = dict(zip(runs, ex.map(lambda r: run(*r), runs), strict=True))
    for broker in ("redis", "memory"):
        plain, jobbers = outcomes[(broker, "plain")], outcomes[(broker, "jobbers")]
        report(f"pytest_fixtures_{broker}", "embedded", plain, jobbers)
    for broker in ("redis", "memory"):
        plain, jobbers = outcomes[(broker, "plain")], outcomes[(broker, "jobbers")]
        assert plain.caller() == {"result": "2 passed", "state": "exit 0", "runs": 2}, broker
        assert jobbers.caller() == plain.caller(), broker
