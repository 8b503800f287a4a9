"""Secrets at rest on a real worker and a real Redis (``jobbers_payload_keys``): what jobbers
keeps of a task's arguments (the record's payload, the Redis dead-letter sink) holds no
plaintext, a delayed retry and a resubmit run with the real values, and a process without
the key shows "encrypted", refuses to resubmit, and leaves a due retry to a worker that
holds the key (never publishing the sealed form as arguments)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
import redis

from jobbers_celery import ENCRYPTED, PayloadCodec, ResubmitVersion, TaskState, get_jobbers
from jobbers_celery.core.codec import new_key
from jobbers_celery.core.records import DeadLetter
from jobbers_celery.lifecycle import payload as pl
from jobbers_celery.resubmit.pace import ResubmitPace, RunStatus
from jobbers_celery.resubmit.pacer import Pacer, read, start
from tests.conftest import ROOT, start_worker, subprocess_env, wait_for
from tests.integration import sealed_proj
from tests.integration.lifecycle_helpers import dead_letters, wait_state

pytestmark = [pytest.mark.redis, pytest.mark.worker]

S = TaskState
KEY = new_key("k-test")
MODULE = "tests.integration.sealed_proj"


def _secret() -> str:
    return f"hunter2-{uuid.uuid4().hex}"


def _jobbers_text(client: redis.Redis) -> str:
    """Every key and value jobbers keeps in Redis, as one text (the broker's own message,
    which jobbers does not seal, lives in other keys)."""
    out: list[str] = []
    for raw in client.scan_iter(match="{jobbers*"):
        key = raw.decode()
        kind = client.type(key).decode()
        if kind == "string":
            value: Any = client.get(key)
        elif kind == "hash":
            value = client.hgetall(key)
        elif kind == "list":
            value = client.lrange(key, 0, -1)
        elif kind == "zset":
            value = client.zrange(key, 0, -1)
        elif kind == "set":
            value = client.smembers(key)
        else:
            value = client.xrange(key) if kind == "stream" else b""
        out.append(f"{key} {value!r}")
    return "\n".join(out)


def _ran(client: redis.Redis, task_id: str) -> list[str]:
    return [v.decode() for v in client.lrange(f"sealed:ran:{task_id}", 0, -1)]


@pytest.fixture
def apps(redis_url: str) -> Iterator[tuple[Any, Any]]:
    """This process's app with the key, and one without (a web process without keys)."""
    keyed = sealed_proj.build(redis_url, [KEY], main="sealed")
    keyless = sealed_proj.build(redis_url, [], main="sealed-keyless")
    yield keyed, keyless
    for app in (keyed, keyless):
        app.close()


def _worker(app: Any, tmp_path: Any, keys: list[str], concurrency: int = 2) -> Any:
    return start_worker(app, MODULE, tmp_path, concurrency=concurrency,
                        env={"SEALED_PROJ_KEYS": json.dumps(keys)})


def test_a_delayed_retry_is_stored_sealed_and_runs_with_the_real_value(apps, tmp_path,
                                                                       redis_url):
    keyed, _ = apps
    client = redis.Redis.from_url(redis_url)
    worker = _worker(keyed, tmp_path, [KEY])
    try:
        secret = _secret()
        result = keyed.tasks["sealed.login"].delay("ann", secret, note=secret)
        jobbers = get_jobbers(keyed)
        wait_state(jobbers, result.id, S.SCHEDULED, worker=worker)
        stored = _jobbers_text(client)
        assert result.id in stored  # the scan sees the record
        assert secret not in stored
        wait_state(jobbers, result.id, S.COMPLETED, worker=worker)
        assert _ran(client, result.id) == [sealed_proj.digest(secret)] * 2
        assert secret not in _jobbers_text(client)
    finally:
        worker.kill()
        client.close()


def test_a_dead_letter_is_sealed_shown_encrypted_without_the_key_and_resubmitted_whole(
        apps, tmp_path, redis_url):
    keyed, keyless = apps
    client = redis.Redis.from_url(redis_url)
    worker = _worker(keyed, tmp_path, [KEY])
    try:
        secret = _secret()
        result = keyed.tasks["sealed.charge"].delay("4242", password=secret, note=secret)
        jobbers, without = get_jobbers(keyed), get_jobbers(keyless)
        wait_state(jobbers, result.id, S.FAILED, worker=worker)
        wait_for(lambda: dead_letters(jobbers, result.id), message="the dead letter")
        assert secret not in _jobbers_text(client)  # sink entry, record and outbox
        [entry] = dead_letters(jobbers, result.id)
        assert jobbers.readable(entry).kwargs == {"password": secret, "note": secret}
        # a process without the key: "encrypted", and its resubmit is refused (no step)
        assert without.readable(entry).args == [ENCRYPTED]
        assert without.resubmit_dead_letters([entry]) == []
        assert jobbers.get(result.id).state is S.FAILED
        shown = _cli(redis_url, [], "dlq", "show", result.id, "--json")
        assert ENCRYPTED in shown
        assert secret not in shown
        shown = _cli(redis_url, [KEY], "dlq", "show", result.id, "--json")
        assert secret in shown  # the note, opened with the key (password: redacted)
        assert "4242" in shown
        # the key holder resubmits: the task runs with the real values
        assert jobbers.resubmit_dead_letters([entry]) == [result.id]
        wait_state(jobbers, result.id, S.COMPLETED, worker=worker)
        assert _ran(client, result.id) == [sealed_proj.digest(secret)] * 2
    finally:
        worker.kill()
        client.close()


def test_a_worker_without_the_key_leaves_a_due_retry_to_one_that_holds_it(apps, tmp_path,
                                                                        redis_url):
    keyed, _ = apps
    client = redis.Redis.from_url(redis_url)
    first = _worker(keyed, tmp_path, [KEY], concurrency=1)
    keyless = None
    try:
        secret = _secret()
        result = keyed.tasks["sealed.login"].delay("ann", secret)
        jobbers = get_jobbers(keyed)
        wait_state(jobbers, result.id, S.SCHEDULED, worker=first)
        first.stop()
        keyless = _worker(keyed, tmp_path, [])  # its scheduler claims the due retry
        wait_for(lambda: "not published by this worker" in keyless.log, timeout=20,
                 message="the keyless worker to leave the due retry")
        assert _ran(client, result.id) == [sealed_proj.digest(secret)]  # not run sealed
        assert secret not in keyless.log
        second = _worker(keyed, tmp_path, [KEY])
        try:
            wait_state(jobbers, result.id, S.COMPLETED, worker=second, timeout=30)
        finally:
            second.kill()
        assert _ran(client, result.id) == [sealed_proj.digest(secret)] * 2
    finally:
        first.kill()
        if keyless is not None:
            keyless.kill()
        client.close()


def _cli(redis_url: str, keys: list[str], *args: str) -> str:
    env = subprocess_env({"SEALED_PROJ_KEYS": json.dumps(keys),
                          "JOBBERS_TEST_REDIS_URL": redis_url})
    out = subprocess.run([sys.executable, "-m", "celery", "-A", MODULE, "jobbers", *args],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
                         check=False)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_a_paced_run_without_the_key_skips_sealed_entries_with_the_reason(
        make_store: Callable[..., Any]) -> None:
    """A worker's pacer that cannot open an entry's arguments never hands it to the publish
    (which would send the sealed form): skipped, the key id it needs in the run's note."""
    store = make_store(f"sealed{time.monotonic_ns()}")
    sealed = pl.seal_arguments({"args": ["ann"], "kwargs": {"password": "pw"}},
                               PayloadCodec.of([KEY]))

    def entry(task_id: str, attempt: int = 1) -> DeadLetter:
        return DeadLetter(task_id=task_id, name="t", version=1, queue="q", reason="failed",
                          args=sealed["args"], kwargs=sealed["kwargs"],
                          exception_type="ValueError", exception_message="x", traceback=None,
                          attempt=attempt, retry_attempt=0, worker=None,
                          failed_at=datetime.now(UTC))

    run_id = start(store, [entry("sealed-0")], ResubmitPace(500), reset_retry_count=True,
                   version=ResubmitVersion.ENTRY, selection={"task_ids": ["sealed-0"]},
                   source="test", username="")
    handed: list[str] = []

    def publish(entries: list[DeadLetter], reset: bool, version: ResubmitVersion
                ) -> list[str]:
        handed.extend(e.task_id for e in entries)
        return [e.task_id for e in entries]

    pacer = Pacer(store, entry, publish, 30,
                  unopenable=lambda e: pl.unopenable(e.args, e.kwargs, PayloadCodec.of([])))

    def finished() -> bool:
        pacer.pass_once()
        info = read(store, run_id)
        return info is not None and not info.active and info.in_flight == 0

    wait_for(finished, timeout=20, interval=0.01, message="the run to finish")
    info = read(store, run_id)
    assert info is not None
    assert (info.status, info.skipped, handed) == (RunStatus.DONE, 1, [])
    assert "encrypted with payload key 'k-test'" in info.notes["sealed-0:1"]

