"""The Celery app that integration-test workers run (``celery -A tests.integration.proj``)."""

from __future__ import annotations

import os
import signal
import time

from jobbers_celery import BackoffStrategy, DeadLetterPolicy, JobbersTask, install
from tests.integration.plain_fault_proj import restore_options
from tests.testapp import SHARDS, make_app

REDIS_URL = os.environ["JOBBERS_TEST_REDIS_URL"]
# JOBBERS_TEST_STORE_URL: the state store elsewhere (a Redis Cluster: test_on_cluster.py).
STORE_URL = os.environ.get("JOBBERS_TEST_STORE_URL") or REDIS_URL
# JOBBERS_TEST_BROKER_URL: another broker (RabbitMQ, tests/rabbitmq.py); state stays in Redis.
BROKER_URL = os.environ.get("JOBBERS_TEST_BROKER_URL") or REDIS_URL

# PROJ_RESULT_BACKEND: a worker storing results elsewhere (tests of the unfolded result path).
app = make_app(
    "proj", STORE_URL, broker=BROKER_URL,
    backend=os.environ.get("PROJ_RESULT_BACKEND") or REDIS_URL,
    # PROJ_SHARDS: another number (test_shards: a worker that disagrees does not start)
    jobbers_store_shards=int(os.environ.get("PROJ_SHARDS", str(SHARDS))),
    # short enough for the stall and recovery tests to run in seconds
    jobbers_worker_lost_after=3,
    jobbers_cleaner_interval=1,
    jobbers_cancel_grace=1,
    task_acks_late=os.environ.get("PROJ_ACKS_LATE") == "1",
    # the metric gauges' lease (test_metrics shortens it to see another process take over)
    jobbers_metrics_gauge_lease=float(os.environ.get("PROJ_METRICS_LEASE", "120")),
    # PROJ_VISIBILITY (seconds): a short Redis-broker visibility timeout, swept every second
    broker_transport_options=restore_options(float(os.environ["PROJ_VISIBILITY"]))
    if os.environ.get("PROJ_VISIBILITY") else {},
)
jobbers = install(app)

# Versions this process registers; a test can start a worker that runs "older" code.
VERSION = int(os.environ.get("PROJ_VERSION", "1"))


class Flaky(Exception):
    pass


@app.task(base=JobbersTask, bind=True, name="proj.add")
def add(self: JobbersTask, x: int, y: int) -> int:
    return x + y


@app.task(base=JobbersTask, bind=True, name="proj.tsum")
def tsum(self: JobbersTask, xs: list[int]) -> int:
    """A chord's callback (tests/integration/workflow_cases.py)."""
    return sum(xs)


@app.task(base=JobbersTask, bind=True, name="proj.flaky", max_retries=3,
          expected_exceptions=(Flaky,), dead_letter_policy=DeadLetterPolicy.SAVE)
def flaky(self: JobbersTask, fail_times: int, delay: float | None = None) -> int:
    """Fails ``fail_times`` times with an expected exception, then succeeds."""
    if self.request.retries < fail_times:
        if delay is not None:
            raise self.retry(exc=Flaky(f"attempt {self.attempt}"), countdown=delay)
        raise Flaky(f"attempt {self.attempt}")
    return self.request.retries


@app.task(base=JobbersTask, bind=True, name="proj.backoff", max_retries=2, retry_delay=0.5,
          backoff_strategy=BackoffStrategy.CONSTANT, expected_exceptions=(Flaky,),
          dead_letter_policy=DeadLetterPolicy.SAVE)
def backoff(self: JobbersTask) -> None:
    raise Flaky(f"always, attempt {self.attempt}")


@app.task(base=JobbersTask, bind=True, name="proj.boom", dead_letter_policy="save")
def boom(self: JobbersTask, secret: str = "") -> None:
    raise ValueError("boom")


@app.task(base=JobbersTask, bind=True, name="proj.versioned", version=VERSION,
          dead_letter_policy="save")
def versioned(self: JobbersTask) -> int:
    return VERSION


@app.task(base=JobbersTask, bind=True, name="proj.sleepy")
def sleepy(self: JobbersTask, seconds: float) -> float:
    time.sleep(seconds)
    return seconds


@app.task(base=JobbersTask, bind=True, name="proj.timeout", timeout=0.5, max_retries=1,
          dead_letter_policy="save")
def timeout(self: JobbersTask) -> None:
    time.sleep(5)


@app.task(base=JobbersTask, bind=True, name="proj.by_attempt")
def by_attempt(self: JobbersTask, sleeps: list[float]) -> int:
    """Sleeps ``sleeps[attempt - 1]`` seconds (none past the list); returns its attempt."""
    time.sleep(sleeps[self.attempt - 1] if self.attempt <= len(sleeps) else 0.0)
    return self.attempt


@app.task(base=JobbersTask, bind=True, name="proj.ignored", ignore_result=True)
def ignored(self: JobbersTask, x: int) -> int:
    return x


@app.task(bind=True, name="proj.plain")
def plain(self, x: int) -> int:  # type: ignore[no-untyped-def]
    return x


@app.task(base=JobbersTask, bind=True, name="proj.headers")
def headers(self: JobbersTask) -> dict[str, object]:
    return {k: v for k, v in (self.request.headers or {}).items() if k.startswith("jobbers_")}


# ---------------------------------------------------------------------------------------
# Tasks for tests/integration/test_lifecycle.py and test_worker_failures.py.
# They leave traces in Redis (lists under "proj:") so a test can count executions.

_client = None


def _redis():  # type: ignore[no-untyped-def]
    """A Redis client of this process (created lazily, so prefork children get their own)."""
    global _client
    if _client is None:
        import redis

        _client = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    return _client


def _jobbers_headers(task: JobbersTask) -> dict[str, object]:
    return {k: v for k, v in (task.request.headers or {}).items() if k.startswith("jobbers_")}


@app.task(base=JobbersTask, bind=True, name="proj.record_run")
def record_run(self: JobbersTask, key: str, seconds: float = 0.0) -> int:
    """Appends one entry per execution of its body to the list ``key``, then sleeps."""
    n = _redis().rpush(key, f"{self.request.id}:{self.attempt}")
    time.sleep(seconds)
    return int(n)


@app.task(base=JobbersTask, bind=True, name="proj.fail_once", dead_letter_policy="save")
def fail_once(self: JobbersTask, key: str) -> int:
    """Fails (unexpected exception) on its first execution, succeeds afterwards."""
    n = int(_redis().rpush(key, self.attempt))
    if n == 1:
        raise ValueError("first run fails")
    return n


@app.task(base=JobbersTask, bind=True, name="proj.until_fixed", dead_letter_policy="save")
def until_fixed(self: JobbersTask, key: str) -> str:
    """Fails (unexpected exception: dead-lettered) until the Redis key ``key`` is set: a
    cause an operator fixes (tests/integration/test_paced_redis.py)."""
    if not _redis().get(key):
        raise ValueError("not fixed yet")
    return "ok"


@app.task(base=JobbersTask, bind=True, name="proj.big_payload", dead_letter_policy="save")
def big_payload(self: JobbersTask, data: str, key: str, hold: float = 0.0) -> int:
    """Logs its attempt to ``key`` and waits ``hold`` seconds; fails (unexpected exception) on
    its first execution, and afterwards returns the length of ``data`` (not ``data``: the
    result must not be another copy of a big argument)."""
    n = int(_redis().rpush(key, self.attempt))
    time.sleep(hold)
    if n == 1:
        raise ValueError("first run fails")
    return len(data)


@app.task(base=JobbersTask, bind=True, name="proj.sleepy_save", dead_letter_policy="save")
def sleepy_save(self: JobbersTask, seconds: float, key: str) -> float:
    """Publishes the pid running it under ``key``, then sleeps."""
    _redis().set(key, os.getpid())
    time.sleep(seconds)
    return seconds


@app.task(base=JobbersTask, bind=True, name="proj.headers_retry", max_retries=2,
          expected_exceptions=(Flaky,))
def headers_retry(self: JobbersTask, key: str, delay: float | None = None) -> dict[str, object]:
    """Records its jobbers_* headers on every run; retries once (after ``delay`` if given)."""
    import json

    _redis().rpush(key, json.dumps(_jobbers_headers(self)))
    if self.request.retries < 1:
        if delay is not None:
            raise self.retry(exc=Flaky("retry with a delay"), countdown=delay)
        raise Flaky("retry at once")
    return _jobbers_headers(self)


@app.task(base=JobbersTask, bind=True, name="proj.flaky_delay", max_retries=3,
          retry_delay=0.3, backoff_strategy=BackoffStrategy.CONSTANT,
          expected_exceptions=(Flaky,))
def flaky_delay(self: JobbersTask, fail_times: int) -> int:
    """Like ``flaky`` but its delay comes from the retry_delay option."""
    if self.request.retries < fail_times:
        raise Flaky(f"attempt {self.attempt}")
    return self.request.retries


# A worker started with PROJ_LEGACY=1 runs "older code": it lacks proj.optional, and
# proj.sometimes_plain is a plain Celery task there (no jobbers tracking).
LEGACY = os.environ.get("PROJ_LEGACY") == "1"

if not LEGACY:

    @app.task(base=JobbersTask, bind=True, name="proj.optional", dead_letter_policy="save")
    def optional(self: JobbersTask, x: int) -> int:
        return x


if LEGACY:

    @app.task(bind=True, name="proj.sometimes_plain")
    def sometimes_plain(self, key: str) -> int:  # type: ignore[no-untyped-def]
        return int(_redis().rpush(key, "plain"))

else:

    @app.task(base=JobbersTask, bind=True, name="proj.sometimes_plain")
    def sometimes_plain(self: JobbersTask, key: str) -> int:
        return int(_redis().rpush(key, "tracked"))


# ---------------------------------------------------------------------------------------
# Tasks for the heartbeat, stall, cancellation and concurrency tests.


@app.task(base=JobbersTask, bind=True, name="proj.resumable", max_heartbeat_interval=2,
          max_stall_recoveries=1, dead_letter_policy="save")
def resumable(self: JobbersTask, key: str, steps: int, step_seconds: float) -> int:
    """Does ``steps`` steps, resuming after the last checkpoint; logs "attempt:step" to key."""
    first = int(self.checkpoint or 0)
    for i in range(first, steps):
        _redis().rpush(key, f"{self.attempt}:{i}")
        time.sleep(step_seconds)
        self.heartbeat(progress={"done": i + 1, "of": steps}, checkpoint=i + 1)
    return steps


@app.task(base=JobbersTask, bind=True, name="proj.silent", max_stall_recoveries=1,
          dead_letter_policy="save")
def silent(self: JobbersTask, key: str, seconds: float) -> str:
    """Never heartbeats: only worker liveness can tell whether it is alive."""
    _redis().rpush(key, f"{self.attempt}:{os.getpid()}:{self.request.hostname}")
    time.sleep(seconds)
    return "done"


@app.task(base=JobbersTask, bind=True, name="proj.heartbeating")
def heartbeating(self: JobbersTask, key: str, seconds: float) -> str:
    """Heartbeats in a tight loop for ``seconds`` (cancellation lands at a heartbeat)."""
    _redis().rpush(key, "started")
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            self.heartbeat(progress={"left": round(end - time.monotonic(), 2)})
            time.sleep(0.01)
    except BaseException as exc:
        _redis().rpush(key, type(exc).__name__)
        raise
    return "done"


@app.task(base=JobbersTask, bind=True, name="proj.capped", max_concurrent=2)
def capped(self: JobbersTask, key: str, seconds: float) -> int:
    """Counts how many run at once (``key:now``) and the most seen (``key:max``)."""
    r = _redis()
    now = int(r.incr(f"{key}:now"))
    r.eval("if tonumber(redis.call('GET', KEYS[1]) or '0') < tonumber(ARGV[1]) then "
           "redis.call('SET', KEYS[1], ARGV[1]) end", 1, f"{key}:max", now)
    try:
        time.sleep(seconds)
    finally:
        r.decr(f"{key}:now")
        r.rpush(f"{key}:done", self.request.id)
    return now


# ---------------------------------------------------------------------------------------
# Tasks for test_cancel.py, test_heartbeat.py and test_purge.py.


@app.task(base=JobbersTask, bind=True, name="proj.until_released", max_retries=3,
          expected_exceptions=(Flaky,), dead_letter_policy="save")
def until_released(self: JobbersTask, key: str, beat: bool = True) -> str:
    """Logs "attempt:start" to ``key``, then waits (heartbeating if ``beat``) until the test
    sets ``key:release`` to "ok" (return), "flaky" (expected exception) or "boom"."""
    r = _redis()
    r.rpush(key, f"{self.attempt}:start")
    end = time.monotonic() + 30
    how = None
    while time.monotonic() < end:
        if beat:
            self.heartbeat(progress={"attempt": self.attempt})
        how = r.get(f"{key}:release")
        if how:
            break
        time.sleep(0.02)
    r.rpush(key, f"{self.attempt}:{how}")
    if how == "flaky":
        raise Flaky("released with an expected exception")
    if how == "boom":
        raise ValueError("released with an unexpected exception")
    return str(how)


class CancelsItsRetry(JobbersTask):
    """Cancels its own task between the immediate-retry step and the retry's publish (the
    retry publishes through ``apply_async`` with the running task's id)."""

    def apply_async(self, args=None, kwargs=None, task_id=None, **options):  # type: ignore[no-untyped-def]
        if task_id is not None and task_id == self.request.id:
            _redis().rpush(f"proj:retry_window:{task_id}", str(jobbers.cancel(task_id)))
        return super().apply_async(args, kwargs, task_id=task_id, **options)


@app.task(base=CancelsItsRetry, bind=True, name="proj.retry_window", max_retries=2,
          expected_exceptions=(Flaky,))
def retry_window(self: JobbersTask, key: str) -> int:
    """Retries at once on every run (and cancels itself on the way, see CancelsItsRetry)."""
    _redis().rpush(key, self.attempt)
    raise Flaky(f"attempt {self.attempt}")


@app.task(base=JobbersTask, bind=True, name="proj.checkpointed", max_retries=2,
          expected_exceptions=(Flaky,))
def checkpointed(self: JobbersTask, key: str) -> object:
    """Attempt 1 checkpoints twice (the second is throttled, unsent) and fails with an
    expected exception; attempt 2 returns the checkpoint it was handed."""
    import json

    _redis().rpush(key, json.dumps({"attempt": self.attempt, "checkpoint": self.checkpoint}))
    if self.attempt == 1:
        self.heartbeat(progress={"phase": 1}, checkpoint={"step": 1})
        self.heartbeat(progress={"phase": 2}, checkpoint={"step": 2})
        raise Flaky("retry once")
    return self.checkpoint


@app.task(base=JobbersTask, bind=True, name="proj.hammer")
def hammer(self: JobbersTask, calls: int, seconds: float) -> float:
    """Calls heartbeat() ``calls`` times spread over about ``seconds``; returns how long."""
    started = time.monotonic()
    for i in range(calls):
        self.heartbeat(progress={"i": i})
        target = started + seconds * (i + 1) / calls
        while time.monotonic() < target:
            time.sleep(0.0002)
    return time.monotonic() - started


@app.task(base=JobbersTask, bind=True, name="proj.big_checkpoint", dead_letter_policy="save")
def big_checkpoint(self: JobbersTask, size: int) -> str:
    """Checkpoints a string of ``size`` characters."""
    self.heartbeat(checkpoint="x" * size)
    return "saved"


@app.task(base=JobbersTask, bind=True, name="proj.purgeable", max_retries=1,
          expected_exceptions=(Flaky,))
def purgeable(self: JobbersTask, key: str, seconds: float = 0.0, fail: bool = False,
              delay: float | None = None) -> int:
    """Logs its task id to ``key``; then fails, retries after ``delay``, or sleeps."""
    n = int(_redis().rpush(key, self.request.id))
    if fail:
        raise ValueError("purgeable fails")
    if delay is not None and self.attempt == 1:
        raise self.retry(exc=Flaky("delayed retry"), countdown=delay)
    time.sleep(seconds)
    return n


# ---------------------------------------------------------------------------------------
# Tasks for the shutdown-policy tests: each logs "<attempt>:<pid>:<hostname>" when it
# starts and "<attempt>:done" when it ends, heartbeating every ``step`` seconds.


def _policy_body(task: JobbersTask, key: str, seconds: float, step: float) -> str:
    r = _redis()
    r.rpush(key, f"{task.attempt}:{os.getpid()}:{task.request.hostname}")
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(step)
        task.heartbeat(progress={"left": round(end - time.monotonic(), 1)})
    r.rpush(key, f"{task.attempt}:done")
    return "done"


@app.task(base=JobbersTask, bind=True, name="proj.on_stop", on_shutdown="stop",
          dead_letter_policy="save")
def on_stop(self: JobbersTask, key: str, seconds: float, step: float = 0.1) -> str:
    return _policy_body(self, key, seconds, step)


@app.task(base=JobbersTask, bind=True, name="proj.on_resubmit", on_shutdown="resubmit")
def on_resubmit(self: JobbersTask, key: str, seconds: float, step: float = 0.1) -> str:
    return _policy_body(self, key, seconds, step)


@app.task(base=JobbersTask, bind=True, name="proj.on_continue", on_shutdown="continue")
def on_continue(self: JobbersTask, key: str, seconds: float, step: float = 0.1) -> str:
    return _policy_body(self, key, seconds, step)


# ---------------------------------------------------------------------------------------
# For test_shutdown.py. PROJ_SOFT_SHUTDOWN sets worker_soft_shutdown_timeout (seconds; the
# worker CLI has no option for it).

if os.environ.get("PROJ_SOFT_SHUTDOWN"):
    app.conf.worker_soft_shutdown_timeout = float(os.environ["PROJ_SOFT_SHUTDOWN"])


@app.task(base=JobbersTask, bind=True, name="proj.on_resubmit_ckpt", on_shutdown="resubmit")
def on_resubmit_ckpt(self: JobbersTask, key: str, steps: int, step: float = 0.1) -> int:
    """Logs like ``_policy_body``, and "<attempt>:<retries>:<checkpoint>" to ``key:resume``
    when it starts; resumes after its checkpoint, checkpointing the steps done after each."""
    r = _redis()
    r.rpush(f"{key}:resume", f"{self.attempt}:{self.request.retries}:{self.checkpoint}")
    r.rpush(key, f"{self.attempt}:{os.getpid()}:{self.request.hostname}")
    for i in range(int(self.checkpoint or 0), steps):
        time.sleep(step)
        self.heartbeat(checkpoint=i + 1)
    r.rpush(key, f"{self.attempt}:done")
    return steps


class SlowResubmit(JobbersTask):
    """Waits PROJ_SLOW_PUBLISH seconds (default 2) before publishing a message with its own
    task id (its resubmission): stands for a slow broker, so that a second signal reaches
    the task while it applies its on_shutdown policy."""

    def apply_async(self, args=None, kwargs=None, task_id=None, **options):  # type: ignore[no-untyped-def]
        if task_id is not None and task_id == self.request.id:
            time.sleep(float(os.environ.get("PROJ_SLOW_PUBLISH", "2")))
        return super().apply_async(args, kwargs, task_id=task_id, **options)


@app.task(base=SlowResubmit, bind=True, name="proj.on_resubmit_slow", on_shutdown="resubmit")
def on_resubmit_slow(self: JobbersTask, key: str, seconds: float, step: float = 0.1) -> str:
    return _policy_body(self, key, seconds, step)


@app.task(base=JobbersTask, bind=True, name="proj.freezes_unrecovered",
          max_heartbeat_interval=1, max_stall_recoveries=0)
def freezes_unrecovered(self: JobbersTask, seconds: float) -> None:
    """Heartbeats once, then freezes for ``seconds``: stalled for good (no recovery)."""
    self.heartbeat()
    time.sleep(seconds)


@app.task(base=JobbersTask, bind=True, name="proj.freezes", max_heartbeat_interval=1,
          max_stall_recoveries=1, dead_letter_policy="save")
def freezes(self: JobbersTask, key: str, seconds: float, deaf: bool = False) -> int:
    """Logs "<attempt>:<pid>" to ``key``; attempt 1 then heartbeats once and freezes for
    ``seconds`` without another heartbeat (``deaf``: ignoring SIGTERM too, prefork only);
    later attempts return at once."""
    _redis().rpush(key, f"{self.attempt}:{os.getpid()}")
    if self.attempt == 1:
        self.heartbeat()
        if deaf:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        time.sleep(seconds)
    return self.attempt


@app.task(base=JobbersTask, bind=True, name="proj.fails_with", dead_letter_policy="save")
def fails_with(self: JobbersTask, unit: str, size: int) -> None:
    """Fails with a message of ``size`` characters, ``unit`` repeated (hostile text)."""
    raise ValueError((unit * (size // len(unit) + 1))[:size])


@app.task(base=JobbersTask, bind=True, name="proj.oserror_with", dead_letter_policy="save")
def oserror_with(self: JobbersTask, host: str, password: str) -> None:
    """Fails with an OSError whose message and file name hold ``password`` (``str()`` of an
    OSError reads its ``strerror`` and ``filename``, not its args)."""
    raise OSError(13, f"login to {host} refused for {password}", f"/etc/{password}")


class BadStr(Exception):
    """An exception whose ``__str__`` raises (one formatting its args can)."""

    def __str__(self) -> str:
        raise RuntimeError("str boom")


@app.task(base=JobbersTask, bind=True, name="proj.bad_str", dead_letter_policy="save")
def bad_str(self: JobbersTask) -> None:
    raise BadStr("x")
