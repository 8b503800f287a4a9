"""Shared fixtures: a private redis-server for the session and real worker subprocesses.

Nothing here touches the machine's shared Redis: the session starts its own
``redis-server`` on a free port (persistence off) and stops it at the end. A missing
``redis-server`` binary fails the run with a clear message; it never skips.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from tests.rabbitmq import rabbitmq  # noqa: F401  (the session's RabbitMQ vhost fixture)

# Property-based tests (hypothesis) of everything that parses or renders outside input: a fixed
# budget and a fixed seed, so a CI run is reproducible and its time known; no example database
# left in the checkout. A test that needs more or fewer examples says so with @settings.
settings.register_profile(
    "jobbers", max_examples=200, derandomize=True, database=None, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
settings.load_profile("jobbers")

ROOT = Path(__file__).resolve().parent.parent
REDIS_DB = 1


def wait_for(predicate: Callable[[], Any], timeout: float = 10.0, interval: float = 0.02,
             message: str = "condition") -> Any:
    """Poll ``predicate`` until it returns something truthy, or fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)


def subprocess_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for a child process: this one's, without the Django settings that
    pytest-django exported (a Celery process seeing them would set up Django), plus
    ``extra``."""
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env.update(extra or {})
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """A private redis-server process on a free loopback port."""

    def __init__(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail("redis-server is not installed (apt-get install redis-server); "
                        "the integration tests need a real one", pytrace=False)
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="jobbers-redis-")
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.dir, "--maxmemory-policy", "noeviction"],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
        )
        import redis

        client = redis.Redis(port=self.port)
        wait_for(lambda: self._ping(client), timeout=10, message="redis-server to answer")

    @staticmethod
    def _ping(client: Any) -> bool:
        import redis

        try:
            return bool(client.ping())
        except redis.ConnectionError:
            return False

    def url(self, db: int = REDIS_DB) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


#: Tests that share something costly of a module or of the session, by path: scripts/test
#: runs pytest-xdist with ``--dist loadgroup``, and each group goes to one worker (where it is
#: built or started once); every other test is sent on its own. Each worker is a session of
#: its own: its private redis-server, RabbitMQ vhost and PostgreSQL database (pytest-django
#: suffixes the name with the worker's id: ``test_jobbers_gw0``).
XDIST_GROUPS = {
    "tests/distribution/": "distribution",  # one build of the sdist and the wheel
    "tests/browser/": "browser",  # one Chromium
    "tests/integration/test_on_cluster.py": "cluster",  # one Redis Cluster (six servers)
    # one Sentinel set (five servers) and one worker for the module
    "tests/integration/test_flow_sentinel.py": "sentinel_flow",
    "tests/integration/test_tls_acl.py": "tls",  # one TLS redis-server
    "tests/integration/test_cli.py": "cli",  # one worker for the module
    "tests/integration/test_paced_redis.py": "paced_redis",  # one worker for the module
    # a redis-server and a plain and a jobbers worker per pool (five pools) for the module
    "tests/integration/test_celery_parity.py": "parity",
    "tests/integration/test_beat_django.py": "beat_django",  # one migrated database
    # its outages one at a time: each loads a worker of four processes, and what each
    # counts depends on timing that two at once upset (a paused store met no step, once)
    "tests/integration/test_store_outage.py": "store_outage",
}


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup`` with the groups above, read from the test's path. (pytest-xdist
    3.8 marks an ``xdist_group`` by editing the node id, which pytest 9.2 no longer reads:
    pytest-xdist#1386. The mark still works here, should a test carry one.)"""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class PathGroups(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            group = next((g for prefix, g in XDIST_GROUPS.items() if nodeid.startswith(prefix)),
                         None)
            return group if group is not None else super()._split_scope(nodeid)

    return PathGroups(config, log)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """A failed test's report ends with the logs its processes wrote under ``tmp_path``
    (workers, servers, the quickstarts' commands)."""
    report = yield
    if report.failed and call.when == "call":
        tmp = getattr(item, "funcargs", {}).get("tmp_path")
        if isinstance(tmp, Path):
            for log in sorted(tmp.rglob("*.log")):
                text = log.read_text(errors="replace")
                report.sections.append((f"log {log.relative_to(tmp)}", text[-20000:]))
    return report


@pytest.fixture(autouse=True)
def _worker_not_shutting_down() -> None:
    """Each test starts in a process whose worker is not shutting down. An embedded worker a
    test stopped leaves the process-wide flag set (a worker's process then exits; a test's
    goes on), and a task a later test calls in this process would be handed back unrun: with
    pytest-xdist any test may follow any other."""
    from jobbers_celery.worker import shutdown

    shutdown.on_worker_init()  # what a worker starting in the process does


@pytest.fixture(autouse=True)
def _root_logger_level() -> Iterator[None]:
    """Each test ends with the root logger's level it started with. An embedded worker
    (celery.contrib.testing's start_worker) sets it to its loglevel, "error": left so, a
    later test of this pytest process reading a jobbers warning with caplog sees nothing.
    (Only the level: pytest's logging plugin swaps its own root handlers between phases.)"""
    root = logging.getLogger()
    level = root.level
    yield
    root.setLevel(level)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer()
    os.environ["JOBBERS_TEST_REDIS_URL"] = server.url()
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> Iterator[str]:
    """A clean database on the session's private Redis."""
    import redis

    client = redis.Redis.from_url(redis_server.url())
    client.flushdb()
    yield redis_server.url()
    client.flushdb()
    client.close()


@pytest.fixture
def proj(redis_url: str) -> Any:
    """The integration-test Celery app module (imported once the Redis URL is known)."""
    import importlib

    module = importlib.import_module("tests.integration.proj")
    return module


class Worker:
    def __init__(self, proc: subprocess.Popen[str], name: str, log_path: Path) -> None:
        self.proc = proc
        self.name = name
        self.log_path = log_path

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def stop(self, timeout: float = 20.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        return int(self.proc.returncode)

    def kill(self) -> None:
        """SIGKILL the worker's whole process group if it still runs (test cleanup)."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


#: Worker options of most tests: nothing but the task messages goes through the broker.
QUIET = ("--without-mingle", "--without-gossip", "--without-heartbeat")


def start_worker(app: Any, module: str, log_dir: Path, *, pool: str = "prefork",
                 concurrency: int = 2, env: dict[str, str] | None = None,
                 options: Sequence[str] = QUIET, timeout: float = 30.0) -> Worker:
    """Start ``celery -A module worker`` as a real subprocess in its own session (its log in
    ``log_dir/w-<id>@localhost.log``) and return once it answers ``ping`` through ``app``."""
    name = f"w-{uuid.uuid4().hex[:8]}@localhost"
    log_path = log_dir / f"{name}.log"
    cmd = [sys.executable, "-m", "celery", "-A", module, "worker",
           "-P", pool, "-c", str(concurrency), "-n", name, "-l", "INFO", *options]
    with log_path.open("w") as log_file:  # the child keeps its own descriptor
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=subprocess_env(env), stdout=log_file,
            stderr=subprocess.STDOUT, text=True, start_new_session=True,
        )
    worker = Worker(proc, name, log_path)

    def ready() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"worker {name} exited early:\n{worker.log}")
        return bool(app.control.ping(destination=[name], timeout=0.5))

    try:
        wait_for(ready, timeout=timeout, interval=0.1, message=f"worker {name} to answer ping")
    except BaseException:
        worker.kill()
        raise
    return worker


@pytest.fixture
def worker_factory(proj: Any, tmp_path: Path) -> Iterator[Callable[..., Worker]]:
    """Start real ``celery worker`` subprocesses running ``tests.integration.proj`` (or
    another app module that builds on it: ``app=``)."""
    workers: list[Worker] = []

    def start(pool: str = "prefork", concurrency: int = 2, env: dict[str, str] | None = None,
              queues: str | None = None, extra: list[str] | None = None,
              app: str = "tests.integration.proj") -> Worker:
        options = [*QUIET, *(["-Q", queues] if queues else []), *(extra or [])]
        worker = start_worker(proj.app, app, tmp_path, pool=pool, concurrency=concurrency,
                              env=env, options=options)
        workers.append(worker)
        return worker

    yield start
    for worker in workers:
        worker.kill()
