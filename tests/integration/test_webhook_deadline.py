"""``jobbers_alert_timeout`` is one deadline for a webhook's whole post: a receiver that
drips its answer a byte at a time (each read answered well within the timeout, so a
per-operation timeout never fires) holds the post, and the alert thread, no longer than
the timeout; a TLS handshake that never ends alike. Local receivers on 127.0.0.1 (let in by
``jobbers_alert_webhook_allow_networks``)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from jobbers_celery import JobbersConfig
from jobbers_celery.alerts import AlertEvent, AlertKind, AlertRule, Alerts
from jobbers_celery.alerts.webhook import WebhookError, post
from jobbers_celery.core.destinations import parse_networks
from jobbers_celery.testing import InMemoryStore
from tests.conftest import wait_for

LOCAL = parse_networks(["127.0.0.0/8"])
TIMEOUT = 1.0
#: What the deadline may overrun by on a loaded 2-core machine.
SLACK = 0.5


class Drip:
    """A receiver that reads the request, then answers ``answer`` a byte every ``every``
    seconds (the default never ends the status line); ``silent``: never sends a byte (a
    TLS handshake that never ends). ``sent``: bytes it dripped."""

    def __init__(self, answer: bytes = b"HTTP/1.1 200 OK" + b" " * 10_000,
                 every: float = 0.05, silent: bool = False) -> None:
        self.answer, self.every, self.silent = answer, every, silent
        self.sent = 0
        self.stop = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            if self.silent:
                self.stop.wait(30)
                return
            got = b""
            while b"\r\n\r\n" not in got and not self.stop.is_set():
                chunk = conn.recv(65536)
                if not chunk:
                    return
                got += chunk
            for byte in self.answer:
                if self.stop.wait(self.every):
                    return
                try:
                    conn.sendall(bytes([byte]))
                except OSError:
                    return  # the client gave up
                self.sent += 1

    def url(self, scheme: str = "http") -> str:
        return f"{scheme}://127.0.0.1:{self.port}/services/T0/B0/SECRET"

    def close(self) -> None:
        self.stop.set()
        self.listener.close()


@pytest.fixture
def drips() -> Iterator[list[Drip]]:
    made: list[Drip] = []
    yield made
    for drip in made:
        drip.close()


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_a_dripping_or_silent_receiver_holds_the_post_no_longer_than_the_timeout(
        drips: list[Drip], scheme: str) -> None:
    drip = Drip(silent=scheme == "https")  # https: the handshake never gets an answer
    drips.append(drip)
    started = time.monotonic()
    with pytest.raises(WebhookError, match=r"gave no answer within 1 s \(the whole post"):
        post(drip.url(scheme), {"text": "x"}, TIMEOUT, LOCAL)
    took = time.monotonic() - started
    print(f"\n{scheme}: gave up after {took:.3f} s (timeout {TIMEOUT} s, {drip.sent} bytes "
          "dripped)")
    assert TIMEOUT - 0.05 <= took <= TIMEOUT + SLACK
    if scheme == "http":
        assert drip.sent >= 5  # it kept answering: each read got a byte within the timeout


def test_a_slow_but_complete_answer_within_the_timeout_is_a_success(
        drips: list[Drip]) -> None:
    drip = Drip(answer=b"HTTP/1.1 204 No Content\r\n\r\n", every=0.01)
    drips.append(drip)
    assert post(drip.url(), {"text": "x"}, 5, LOCAL) == 204


def test_the_alert_thread_is_held_no_longer_than_the_timeout(drips: list[Drip]) -> None:
    drip = Drip()
    drips.append(drip)
    alerts = Alerts(InMemoryStore(), JobbersConfig.from_mapping({
        "jobbers_redis_url": "redis://x", "jobbers_alert_timeout": TIMEOUT,
        "jobbers_alert_webhook_allow_networks": ["127.0.0.0/8"],
        "jobbers_alerts": [{"name": "r", "kind": "stall", "webhooks": [drip.url()]}]}))
    started = time.monotonic()
    alerts.emit(AlertEvent(AlertKind.STALL, "proj.add", "stalled", "x", task_name="proj.add"))
    wait_for(lambda: alerts.stats["failed"] == 1, timeout=TIMEOUT + 5,
             message="the dripping receiver's failure")
    took = time.monotonic() - started
    print(f"\nthe alert thread was free again after {took:.3f} s")
    assert took <= TIMEOUT + SLACK
    assert alerts.flush(1)


def test_a_test_alert_is_bounded_whatever_its_receivers(
        drips: list[Drip], caplog: pytest.LogCaptureFixture) -> None:
    """The admin's "Send a test alert": every receiver tried at once, the caller back
    within the timeout (+ 0.5 s): a dripping webhook reported, a mail server that holds on
    reported as still going and its outcome logged when it ends."""
    import logging

    caplog.set_level(logging.INFO, logger="jobbers.alerts")
    slow, good = Drip(), Drip(answer=b"HTTP/1.1 200 OK\r\n\r\n", every=0.001)
    drips += [slow, good]
    alerts = Alerts(InMemoryStore(), JobbersConfig.from_mapping({
        "jobbers_redis_url": "redis://x", "jobbers_alert_timeout": TIMEOUT,
        "jobbers_alert_webhook_allow_networks": ["127.0.0.0/8"]}))
    mail_server = threading.Event()
    alerts.set_email_sender(lambda subject, body, to: mail_server.wait(30))
    rules = [AlertRule("slow", AlertKind.STALL, webhooks=(slow.url(),),
                       emails=("oncall@example.com",)),
             *(AlertRule(f"good-{n}", AlertKind.STALL, webhooks=(good.url(),))
               for n in range(20))]
    started = time.monotonic()
    failures = alerts.send_tests(rules)
    took = time.monotonic() - started
    print(f"\n21 rules tested in {took:.3f} s (timeout {TIMEOUT} s)")
    assert took <= TIMEOUT + 0.5 + SLACK
    webhook_failure, email_failure = failures.pop("slow")
    assert "gave no answer within 1 s" in webhook_failure
    assert email_failure.startswith("email: no outcome within 1.5 s")
    assert all(not f for f in failures.values())
    mail_server.set()
    wait_for(lambda: any("went through email (after the admin stopped waiting)"
                         in r.getMessage() for r in caplog.records),
             timeout=10, message="the late email's outcome in the log")
