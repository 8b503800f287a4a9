"""RabbitMQ for the tests that run jobbers on an ``amqp://`` broker (state stays in Redis).

The session makes its own vhost on the RabbitMQ at 127.0.0.1:5672 (``rabbitmqctl
add_vhost``, permissions for guest) and deletes it at the end, with every queue and message
in it: parallel sessions, and messages left by killed workers, never meet. scripts/test
starts (or installs) the server; a missing server or an unusable ``rabbitmqctl`` FAILS the
run, it never skips.

A test switches a Celery app of its own process to the vhost with :func:`use_broker` and
its workers with the ``JOBBERS_TEST_BROKER_URL`` environment variable (read by
tests/integration/proj.py and tests/django/celery_app.py).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

HOST, PORT = "127.0.0.1", 5672
#: The environment variable that points the test apps' broker elsewhere than Redis.
BROKER_ENV = "JOBBERS_TEST_BROKER_URL"
#: Queues the test apps use (Celery's default queue; test_lifecycle routes to "other").
QUEUES = ("celery", "other")
#: A test session's vhost: this prefix, its pid, a random suffix.
PREFIX = "jobbers-test-"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class RabbitVhost:
    """A vhost of its own on the machine's RabbitMQ, for one test session."""

    def __init__(self) -> None:
        with socket.socket() as s:
            s.settimeout(2)
            if s.connect_ex((HOST, PORT)) != 0:
                pytest.fail(f"RabbitMQ does not answer on {HOST}:{PORT}; scripts/test starts "
                            "or installs it (apt-get install rabbitmq-server)", pytrace=False)
        self.ctl = shutil.which("rabbitmqctl")
        if self.ctl is None:
            pytest.fail("rabbitmqctl is not installed: the RabbitMQ tests make their own "
                        "vhost with it", pytrace=False)
        self._forget_stale()
        self.name = f"{PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.run("add_vhost", self.name)
        self.run("set_permissions", "-p", self.name, "guest", ".*", ".*", ".*")
        self.url = f"amqp://guest:guest@{HOST}:{PORT}/{self.name}"

    def run(self, *args: str) -> str:
        assert self.ctl is not None
        done = subprocess.run([self.ctl, "-q", *args], capture_output=True, text=True,
                              timeout=60, check=False)
        if done.returncode != 0:
            pytest.fail(f"rabbitmqctl {' '.join(args)} failed ({done.returncode}): "
                        f"{done.stderr.strip() or done.stdout.strip()}", pytrace=False)
        return done.stdout

    def _forget_stale(self) -> None:
        """Delete the vhosts of test sessions that were killed before they could (their
        process is gone)."""
        for name in self.run("list_vhosts", "--no-table-headers", "name").split():
            pid = name[len(PREFIX):].split("-", 1)[0]
            if name.startswith(PREFIX) and pid.isdigit() and not _alive(int(pid)):
                self.run("delete_vhost", name)

    def delete(self) -> None:
        self.run("delete_vhost", self.name)

    # ----------------------------------------------------------------- per test
    def reset(self) -> None:
        """Purge the test queues: a clean broker per test. (Purged, not deleted: pooled
        connections remember the queues they declared and would not declare them again.)"""
        from amqp.exceptions import NotFound
        from kombu import Connection

        with Connection(self.url) as conn:
            for queue in QUEUES:
                channel = conn.channel()
                try:
                    channel.queue_purge(queue)
                except NotFound:
                    continue  # never declared (the error closed the channel)
                channel.close()

    def held(self, _r: Any = None) -> Counter[str]:
        """Task ids of the messages the queues hold. Ready messages are read without being
        acknowledged (they go back when the channel closes); messages delivered to a
        connected worker and not acknowledged yet count under ``"<unacked>"`` (rabbitmqctl,
        asked only while a consumer is connected). Replaces shutdown_cases' ``broker()``."""
        from amqp.exceptions import NotFound
        from kombu import Connection

        ids: Counter[str] = Counter()
        consumers = 0
        with Connection(self.url) as conn:
            for queue in QUEUES:
                channel = conn.channel()
                try:
                    _, _, n_consumers = channel.queue_declare(queue, passive=True)
                except NotFound:
                    continue  # the channel is closed by the error
                consumers += n_consumers
                while (message := channel.basic_get(queue, no_ack=False)) is not None:
                    ids[str(message.headers["id"])] += 1
                channel.close()  # unacknowledged: they are ready again
        if consumers:
            out = self.run("list_queues", "-p", self.name, "--no-table-headers",
                           "name", "messages_unacknowledged")
            unacked = sum(int(line.split()[1]) for line in out.splitlines()
                          if len(line.split()) == 2 and line.split()[0] in QUEUES)
            if unacked:
                ids["<unacked>"] += unacked
        return ids


@pytest.fixture(scope="session")
def rabbitmq() -> Iterator[RabbitVhost]:
    vhost = RabbitVhost()
    yield vhost
    vhost.delete()


def reset_connections(app: Any) -> None:
    """Make ``app`` look its broker connection pools up again (kombu keeps one pool per
    URL for the process: they stay open for the next test on the same broker)."""
    app._pool = None
    amqp = app.__dict__.get("amqp")
    if amqp is not None:
        amqp._producer_pool = None


@contextmanager
def use_broker(app: Any, url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Point ``app`` (this process) and the workers started meanwhile at ``url``."""
    before = app.conf.broker_url
    monkeypatch.setenv(BROKER_ENV, url)
    reset_connections(app)
    app.conf.broker_url = url
    try:
        yield
    finally:
        reset_connections(app)
        app.conf.broker_url = before
