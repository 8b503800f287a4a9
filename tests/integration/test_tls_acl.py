"""Broker, result backend and jobbers store over ``rediss://`` as an ACL user.

A TLS-only redis-server with certificates made at test time (tests/integration/tls_helpers.py);
the user has exactly the documented ACL rule (``ACL_RULE``), the default user is password
protected. A real prefork worker runs every kind of step (completed, delayed retry through
the scheduler, heartbeats, cancel, failure into the Redis DLQ, stall found by the cleaner,
resubmit, purge) and its liveness thread; then neither the server's ACL log nor the worker's
log may show a refusal: a permission the rule lacks fails the test.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import celery
import pytest
import redis
from redis.exceptions import NoPermissionError

from jobbers_celery import TaskState, get_jobbers
from tests.conftest import ROOT, Worker, start_worker, wait_for
from tests.integration import tls_proj
from tests.integration.lifecycle_helpers import (
    COMPLETE,
    DELAYED_RETRY,
    PUBLISH,
    START,
    path,
    wait_state,
)
from tests.integration.tls_helpers import ACL_RULE, TlsRedisServer, make_certificates

S = TaskState


@pytest.fixture(scope="module")
def tls_server() -> Iterator[TlsRedisServer]:
    server = TlsRedisServer()
    yield server
    server.stop()


@pytest.fixture
def tls(tls_server: TlsRedisServer) -> Iterator[TlsRedisServer]:
    """The TLS server, empty, with the documented user and an empty ACL log."""
    tls_server.set_user(tls_server.user, tls_server.password, ACL_RULE)
    tls_server.flush()
    yield tls_server
    tls_server.flush()


@pytest.fixture
def tls_worker(tmp_path: Path) -> Iterator[Callable[..., Worker]]:
    """Start ``celery -A tests.integration.tls_proj worker`` (prefork, with Celery's default
    mingle, gossip, heartbeat and task events on: all of them go through the broker)."""
    workers: list[Worker] = []

    def start(app: Any, env: dict[str, str]) -> Worker:
        worker = start_worker(app, "tests.integration.tls_proj", tmp_path, env=env,
                              options=("-E",), timeout=45)
        workers.append(worker)
        return worker

    yield start
    for worker in workers:
        worker.kill()


def _app(tls: TlsRedisServer, mode: str, url: str | None = None) -> tuple[Any, dict[str, str]]:
    url = url or tls.url(query=(mode == "url"))
    env = {"TLS_PROJ_URL": url, "TLS_PROJ_MODE": mode, "TLS_PROJ_CA": str(tls.certs.ca)}
    return tls_proj.make_app(mode, url, str(tls.certs.ca)), env


def _assert_no_refusal(tls: TlsRedisServer, worker: Worker) -> None:
    denials = [(d["reason"], d["object"], d["context"]) for d in tls.acl_denials()]
    assert denials == [], f"ACL refusals: {denials}"
    for marker in ("NOPERM", "NoPermission", "no permissions", "WRONGPASS",
                   "AuthenticationError", "SSLError", "ConnectionError"):
        assert marker not in worker.log, f"{marker} in the worker log:\n{worker.log[-6000:]}"


def test_every_step_over_tls_as_the_documented_acl_user(tls, tls_worker):
    started = time.monotonic()
    app, env = _app(tls, "url")
    jobbers = get_jobbers(app)
    pool = jobbers.store.client.connection_pool
    assert pool.connection_class is redis.SSLConnection
    assert pool.connection_kwargs["username"] == tls.user
    worker = tls_worker(app, env)
    tasks = app.tasks

    # completed, with the result written by the completed step's script and read back
    result = tasks["tls.add"].delay(2, 3)
    assert result.get(timeout=20) == 5
    assert path(jobbers, result.id) == PUBLISH + START + COMPLETE

    # a delayed retry: scheduled, republished by the worker's scheduler, then completed
    retried = tasks["tls.retry_later"].delay()
    assert retried.get(timeout=20) == 2
    assert path(jobbers, retried.id) == PUBLISH + START + DELAYED_RETRY + COMPLETE

    # heartbeats (progress, checkpoint), then cancelled at a heartbeat
    beating = tasks["tls.beating"].delay(30)
    record = wait_for(lambda: (r := jobbers.get(beating.id)) and r.progress and r,
                      timeout=20, message="a heartbeat's progress")
    assert record.state == S.STARTED
    assert record.heartbeat_at is not None
    assert jobbers.cancel(beating.id) is True
    wait_state(jobbers, beating.id, S.CANCELLED, worker=worker)

    # an unexpected exception: failed, and its entry in the Redis dead-letter queue
    failed = tasks["tls.boom"].delay()
    wait_state(jobbers, failed.id, S.FAILED, worker=worker)
    wait_for(lambda: [e.task_id for e in jobbers.sink.entries()] == [failed.id],  # type: ignore[attr-defined]
             message="the dead-letter entry")

    # a task that never heartbeats: the cleaner (run here, as the ACL user) stalls it
    frozen = tasks["tls.frozen"].delay(4)
    wait_state(jobbers, frozen.id, S.STARTED, worker=worker)
    wait_for(lambda: jobbers.clean().stalled or jobbers.get(frozen.id).state == S.STALLED,
             timeout=15, interval=0.3, message="the cleaner to stall the silent task")
    wait_state(jobbers, frozen.id, S.STALLED, worker=worker)
    # the cleaner's beat task, run by the worker
    app.tasks["jobbers.clean"].delay()
    wait_for(lambda: jobbers.cleaner_status().by == "beat", message="the worker's cleaner pass")

    # the operator's side: reads, resubmit from the DLQ, purge; a plain Celery task too
    assert jobbers.counts()[S.COMPLETED] == 2
    assert [r.task_id for r in jobbers.tasks(state=S.FAILED)] == [failed.id]
    assert jobbers.resubmit([failed.id]) == [failed.id]
    wait_state(jobbers, failed.id, S.FAILED, worker=worker)
    assert tasks["tls.plain"].delay(7).get(timeout=20) == 7
    wait_state(jobbers, frozen.id, S.STALLED)
    report = jobbers.purge(name="tls.add")
    assert jobbers.get(result.id) is None, report

    # a group read in part (its counts by ZINTERCARD), and the per-minute history
    members = celery.group(tasks["tls.add"].s(i, i) for i in range(4)).apply_async()
    # (member by member: GroupResult.get reads with MGET, which the rule does not grant)
    assert [r.get(timeout=20) for r in members.results] == [0, 2, 4, 6]
    part = jobbers.workflow(members.id, limit=1)
    assert part is not None
    assert part.truncated
    assert part.total == 4
    assert part.completed == 4  # every member counted, not only the one read
    assert sum(p.completed for p in jobbers.series(name="tls.add").points) >= 5
    assert "tls.add" in jobbers.series_names()[0]

    # the worker's liveness entry is refreshed (alive.lua) while it runs
    keys = jobbers.store.shards.keys[0]  # (a shard's copy of) the workers set
    admin = tls.admin()
    first = wait_for(lambda: admin.zrange(keys.workers, 0, -1, withscores=True),
                     message="the worker's liveness entry")
    wait_for(lambda: admin.zrange(keys.workers, 0, -1, withscores=True) != first,
             timeout=10, message="the liveness entry to be refreshed")

    assert worker.stop() == 0
    _assert_no_refusal(tls, worker)
    assert "results are written by the completed step" in worker.log
    print(f"\nTLS + ACL: every step as {tls.user!r} in {time.monotonic() - started:.1f}s")


def test_tls_from_settings_broker_use_ssl_and_jobbers_redis_use_ssl(tls, tls_worker):
    started = time.monotonic()
    app, env = _app(tls, "settings")
    worker = tls_worker(app, env)
    jobbers = get_jobbers(app)
    result = app.tasks["tls.add"].delay(20, 22)
    assert result.get(timeout=20) == 42
    assert path(jobbers, result.id) == PUBLISH + START + COMPLETE
    assert worker.stop() == 0
    _assert_no_refusal(tls, worker)
    assert "results are written by the completed step" in worker.log
    print(f"\nTLS from settings: one task in {time.monotonic() - started:.1f}s")


def test_a_missing_permission_a_wrong_password_or_ca_fail_fast_and_clearly(
        tls, tls_worker, tmp_path):
    # the documented rule without jobbers' key pattern
    tls.set_user("nokeys", "pw", tuple(r for r in ACL_RULE
                                             if r not in ("~{jobbers}:*", "~{jobbers.*}:*")))
    try:
        app, env = _app(tls, "url", tls.url("nokeys", "pw"))
        jobbers = get_jobbers(app)
        started = time.monotonic()
        with pytest.raises(NoPermissionError, match="no permissions"):
            jobbers.counts()
        worker = tls_worker(app, env)  # the broker's keys are allowed: it starts
        # the publish step is refused (logged; the message is still published), and the
        # worker's started step fails the task with the server's refusal
        result = app.tasks["tls.add"].delay(1, 2)
        with pytest.raises(NoPermissionError):
            result.get(timeout=15)
        wait_for(lambda: "NoPermissionError" in worker.log, message="the refusal logged")
        took = time.monotonic() - started
    finally:
        tls.admin().acl_deluser("nokeys")

    wrong = tls_proj.make_app("url", tls.url(password="wrong"), str(tls.certs.ca))
    with pytest.raises(redis.AuthenticationError):
        get_jobbers(wrong).counts()

    (tmp_path / "other").mkdir()
    other = make_certificates(tmp_path / "other")  # a CA that did not sign the server's
    unknown = tls_proj.make_app("url", tls.url(ca=other.ca), str(other.ca))
    with pytest.raises(redis.ConnectionError, match="certificate verify failed"):
        get_jobbers(unknown).counts()
    plain = tls.url(query=False).replace("rediss://", "redis://", 1)  # TLS forgotten
    with pytest.raises(redis.ConnectionError):
        get_jobbers(tls_proj.make_app("url", plain, "")).counts()
    print(f"\nmissing key permission: refused at the first step, task failed in {took:.1f}s")


def test_the_scripts_run_only_commands_the_documented_rule_grants():
    """Redis checks every command a script runs against the caller: a command added to a
    script (``jobbers_celery/store/lua``) and not to the documented rule (the one
    ``ACL_RULE`` reads) fails every step at once for that user. ``select`` is the
    documented optional grant (results on another database)."""
    assert ACL_RULE[:2] == ("~{jobbers}:*", "~{jobbers.*}:*")  # the block was read whole
    called = re.compile(r"redis\.p?call\(\s*'([A-Za-z]+)'")
    used = {(m.group(1).lower(), lua.name)
            for lua in (ROOT / "jobbers_celery" / "store" / "lua").glob("*.lua")
            for m in called.finditer(lua.read_text())}
    assert len({c for c, _ in used}) > 20  # the pattern still finds the scripts' calls
    assert sorted((c, f) for c, f in used if f"+{c}" not in ACL_RULE) == [
        ("select", "complete.lua")]


def test_without_info_jobbers_still_runs(tls, tls_worker):
    """``+info`` is the one ``@dangerous`` command of the rule; a user without it still
    runs tasks and cleaner passes (only the restart detection by ``run_id`` is lost)."""
    tls.set_user("noinfo", "pw", tuple(r for r in ACL_RULE if r != "+info"))
    try:
        app, env = _app(tls, "url", tls.url("noinfo", "pw"))
        jobbers = get_jobbers(app)
        worker = tls_worker(app, env)
        result = app.tasks["tls.add"].delay(1, 2)
        assert result.get(timeout=20) == 3
        assert jobbers.get(result.id).state is TaskState.COMPLETED
        jobbers.clean()
        assert worker.stop() == 0
        refused = {(d["reason"], d["object"]) for d in tls.acl_denials()
                   if d["username"] == "noinfo"}  # (not an earlier test's wrong password)
        assert refused == {("command", "info")}, refused  # refused, and the script went on
    finally:
        tls.admin().acl_deluser("noinfo")
