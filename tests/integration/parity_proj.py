"""The same Celery project twice, for the differential tests of test_celery_parity.py: once
with plain ``celery.Task`` tasks, once with ``JobbersTask`` (``install(app)``), task code
identical, only ``base=`` (or the app's ``task_cls=``) differs.

A worker runs one of them: ``celery -A tests.integration.parity_proj worker`` with
``PARITY_VARIANT`` (``plain`` or ``jobbers``), ``PARITY_REDIS`` (a server URL without a db)
and ``PARITY_STYLE`` (``base``: ``@app.task(base=...)``, the default; ``task_cls``: the app is
built with ``task_cls=`` and its tasks name no base). The test process builds both with
:func:`build`. Each variant has a database of its own (broker, results and, for jobbers, the
store); every task body leaves its traces in the effects database, in a list whose key the
test passes, so a test counts how often a body ran, in which process and when.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from typing import Any

from celery import Celery, Task, shared_task
from celery.exceptions import Ignore, Reject, Retry, SoftTimeLimitExceeded

from jobbers_celery import JobbersTask, install

VARIANTS = ("plain", "jobbers")
#: The databases of the private server: each variant's broker, results and store; the traces.
DB = {"plain": 2, "jobbers": 3}
EFFECTS_DB = 5


class Flaky(Exception):
    """The error the retrying tasks raise (importable: the client rebuilds it from the
    result backend by module and name)."""


_clients: dict[str, Any] = {}


def effects(redis: str) -> Any:
    """A client of the effects database, one per process (a prefork child makes its own)."""
    key = f"{os.getpid()}:{redis}"
    client = _clients.get(key)
    if client is None:
        import redis as redis_py

        client = _clients[key] = redis_py.Redis.from_url(f"{redis}/{EFFECTS_DB}",
                                                        decode_responses=True)
    return client


def trace_of(entry: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(entry)
    return data


def build(variant: str, redis: str, style: str = "base", eager: bool = False) -> Celery:
    """The project's app for ``variant`` on the server ``redis`` (``redis://host:port``)."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}")
    url = f"{redis}/{DB[variant]}"
    base: type[Task] = JobbersTask if variant == "jobbers" else Task
    kwargs: dict[str, Any] = {}
    if style == "task_cls":
        kwargs["task_cls"] = base
    app = Celery(f"parity_{variant}", broker=url, backend=url, set_as_current=False, **kwargs)
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        result_serializer="json",
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        worker_prefetch_multiplier=1,
        task_always_eager=eager,
        task_eager_propagates=False,
        result_expires=600,
    )
    if variant == "jobbers":
        app.conf.update(
            jobbers_redis_url=url,
            jobbers_scheduler_interval=0.1,
            jobbers_worker_lost_after=3,
            jobbers_cleaner_interval=1,
        )
        install(app)

    def task(name: str, **options: Any) -> Callable[[Callable[..., Any]], Task]:
        if style == "base":
            options["base"] = base
        return app.task(bind=True, name=f"parity.{name}", shared=False, **options)

    def mark(task: Task, key: str, **fields: Any) -> int:
        """One trace of this execution of the body; returns how many the key now has."""
        entry = {"id": task.request.id, "retries": task.request.retries, "pid": os.getpid(),
                 "at": time.time(), **fields}
        return int(effects(redis).rpush(key, json.dumps(entry)))

    # ----------------------------------------------------------------- plain outcomes
    @task("add")
    def add(self: Task, x: int, y: int) -> int:
        return x + y

    @task("tsum")
    def tsum(self: Task, values: list[int]) -> int:
        return sum(values)

    @task("traced")
    def traced(self: Task, key: str, value: Any = None) -> Any:
        mark(self, key, value=value)
        return value

    @task("keyed", **({"max_concurrent": 1, "concurrency_key": "tenant"}
                      if variant == "jobbers" else {}))
    def keyed(self: Task, key: str, tenant: str) -> str:
        """Holds its tenant's place a moment (jobbers: one at a time per tenant); its trace
        says when it started and when it ended."""
        started = time.time()
        time.sleep(0.3)
        mark(self, key, started=started)
        return tenant

    @task("note")
    def note(self: Task, value: Any, key: str) -> Any:
        """A callback: its first argument is the result of the task it follows."""
        mark(self, key, value=value)
        return value

    @task("on_error")
    def on_error(self: Task, task_id: str, key: str) -> str:
        """An errback (bound, so Celery publishes it with the failed task's id)."""
        mark(self, key, failed=task_id)
        return task_id

    @task("boom")
    def boom(self: Task, key: str, message: str = "boom") -> None:
        mark(self, key)
        raise ValueError(message)

    @task("pid")
    def pid(self: Task) -> int:
        return os.getpid()

    @task("ignored", ignore_result=True)
    def ignored(self: Task, key: str) -> int:
        return mark(self, key)

    @task("rated", rate_limit="5/s")
    def rated(self: Task, key: str) -> int:
        return mark(self, key)

    # ----------------------------------------------------------------- retries
    @task("retry_exc")
    def retry_exc(self: Task, key: str, times: int, countdown: float | None = None) -> int:
        """``self.retry(exc=..., countdown=...)`` ``times`` times, then returns its retries."""
        mark(self, key)
        if self.request.retries < times:
            raise self.retry(exc=Flaky(f"retry {self.request.retries}"), countdown=countdown)
        return int(self.request.retries)

    @task("retry_no_exc", max_retries=1)
    def retry_no_exc(self: Task, key: str) -> None:
        """``self.retry(countdown=...)`` without ``exc``, for ever: MaxRetriesExceededError."""
        mark(self, key)
        raise self.retry(countdown=0.2)

    @task("retry_default_delay", default_retry_delay=1)
    def retry_default_delay(self: Task, key: str) -> int:
        """``self.retry(exc=exc)``, no countdown: waits the task's ``default_retry_delay``."""
        mark(self, key)
        if self.request.retries < 1:
            raise self.retry(exc=Flaky("once"))
        return int(self.request.retries)

    @task("autoretry", autoretry_for=(Flaky,), retry_backoff=True, retry_backoff_max=1,
          retry_jitter=True, max_retries=2)
    def autoretry(self: Task, key: str, times: int) -> int:
        """Raises Flaky ``times`` times; Celery's autoretry waits 0 or 1 s (full jitter)."""
        mark(self, key)
        if self.request.retries < times:
            raise Flaky(f"attempt {self.request.retries}")
        return int(self.request.retries)

    @task("raise_retry")
    def raise_retry(self: Task, key: str) -> None:
        """A bare ``raise Retry()``: the tracer marks RETRY; no new message is sent."""
        mark(self, key)
        raise Retry()

    # ----------------------------------------------------------------- other endings
    def reject_body(self: Task, key: str, requeue: bool) -> int:
        """Rejects its first delivery (requeue or not); a second delivery returns."""
        n = mark(self, key, redelivered=bool((self.request.delivery_info or {}).get(
            "redelivered")))
        if n == 1:
            raise Reject(ValueError("not now") if not requeue else "later", requeue=requeue)
        return n

    task("reject", acks_late=True)(reject_body)
    # acknowledged when it started: a requeue finds nothing to hand back
    task("reject_early_ack", acks_late=False)(reject_body)

    @task("ignore")
    def ignore(self: Task, key: str) -> None:
        """Celery's way to end without a result, after reporting progress."""
        self.update_state(state="PROGRESS", meta={"done": 1})
        mark(self, key)
        raise Ignore()

    @task("replacer")
    def replacer(self: Task, key: str, x: int) -> None:
        mark(self, key)
        raise self.replace(add.s(x, 1))

    @task("soft_limit", soft_time_limit=0.3)
    def soft_limit(self: Task, key: str, catch: bool) -> str:
        mark(self, key)
        try:
            time.sleep(5)
        except SoftTimeLimitExceeded:
            if not catch:
                raise
            return "cleaned up"
        return "slept"

    @task("sleeper")
    def sleeper(self: Task, key: str, seconds: float) -> float:
        mark(self, key)
        time.sleep(seconds)
        return seconds

    @task("hard_limit", time_limit=0.5)
    def hard_limit(self: Task, key: str) -> str:
        mark(self, key)
        time.sleep(5)
        return "slept"

    @task("expected", **(
        {"expected_exceptions": (Flaky,)} if variant == "jobbers"
        else {"autoretry_for": (Flaky,), "retry_kwargs": {"countdown": 0}}))
    def expected(self: Task, key: str, times: int) -> int:
        """The same body; jobbers retries it through ``expected_exceptions`` (no retry_delay:
        at once), plain Celery through ``autoretry_for`` with a countdown of 0."""
        mark(self, key)
        if self.request.retries < times:
            raise Flaky(f"attempt {self.request.retries}")
        return int(self.request.retries)

    @task("unencodable_result")
    def unencodable_result(self: Task, key: str) -> Any:
        """Returns what the JSON result serializer cannot encode."""
        mark(self, key)
        return {"a set": {1, 2}}

    @task("boom_once", **({"dead_letter_policy": "save"} if variant == "jobbers" else {}))
    def boom_once(self: Task, key: str) -> int:
        """Fails its first run (jobbers: into the dead-letter queue), returns 10·n after."""
        n = mark(self, key)
        if n == 1:
            raise ValueError("first run fails")
        return 10 * n

    def lost_body(self: Task, key: str) -> int:
        """Its first run sleeps until the test SIGKILLs its pool child; the next returns."""
        n = mark(self, key)
        if n == 1:
            time.sleep(60)
        return n

    # acks_late, the message requeued when the pool process is lost (Celery's option)
    task("lost", acks_late=True, reject_on_worker_lost=True)(lost_body)
    # acks_late only: Celery stores FAILURE (WorkerLostError)
    task("lost_no_reject", acks_late=True)(lost_body)
    # jobbers' per-task choice: not requeued even with reject_on_worker_lost, dead-lettered
    # Celery 5.7's retry_on_worker_lost: a retry (default_retry_delay later), no acks_late
    task("lost_retried", retry_on_worker_lost=True, default_retry_delay=0.5)(lost_body)
    # (plain Celery's nearest: reject_on_worker_lost off)
    task("lost_refused", acks_late=True, **(
        {"reject_on_worker_lost": True, "on_worker_lost": "fail", "dead_letter_policy": "save"}
        if variant == "jobbers" else {"reject_on_worker_lost": False}))(lost_body)

    del tsum, traced, note, on_error, boom, pid, ignored, rated, retry_exc, retry_no_exc
    del retry_default_delay, autoretry, raise_retry, ignore, replacer, soft_limit
    del sleeper, hard_limit, expected, unencodable_result, boom_once
    return app


_shared_defined = False


def define_shared() -> None:
    """Django-less ``@shared_task``: registered on every app of the process (those that exist
    and those made later), the plain one and the one with ``base=JobbersTask``. Once per
    process (a second definition is another callable under the same name)."""
    global _shared_defined
    if _shared_defined:
        return
    _shared_defined = True

    @shared_task(bind=True, name="parity.shared_plain")
    def shared_plain(self: Task, x: int) -> int:
        return x * 2

    @shared_task(base=JobbersTask, bind=True, name="parity.shared_jobbers")
    def shared_jobbers(self: Task, x: int) -> int:
        return x * 2


if "PARITY_VARIANT" in os.environ:
    define_shared()
    app = build(os.environ["PARITY_VARIANT"], os.environ["PARITY_REDIS"],
                os.environ.get("PARITY_STYLE", "base"))
    if os.environ.get("PARITY_BEAT_KEY"):  # celery beat: a user's entry every 0.3 s
        app.conf.beat_schedule = {
            **(app.conf.beat_schedule or {}),
            "parity-traced": {"task": "parity.traced", "schedule": 0.3,
                              "args": (os.environ["PARITY_BEAT_KEY"], "beat")},
        }
