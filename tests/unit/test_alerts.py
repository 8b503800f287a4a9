"""Alerts without a network: rules as users write them, matching, dedupe and rate limits
over the in-memory store, the dead-letter rate, and what a receiver is handed."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import pytest

from jobbers_celery import ConfigurationError, JobbersConfig
from jobbers_celery.alerts import AlertEvent, AlertKind, Alerts
from jobbers_celery.alerts import service as alert_service
from jobbers_celery.core.alertrules import AlertRule, parse_rules
from jobbers_celery.testing import InMemoryStore

HOOK = "https://hooks.example.com/services/T0/B0/secret"


@pytest.fixture(autouse=True)
def _no_process_sources(monkeypatch: pytest.MonkeyPatch) -> None:
    """What jobbers_django registers for every service of the process (when a Django test
    ran in this session) stays out of these."""
    monkeypatch.setattr(alert_service, "_SOURCES", [])
    monkeypatch.setattr(alert_service, "_EMAIL", [])


def config(*rules: dict[str, Any], **more: Any) -> JobbersConfig:
    return JobbersConfig.from_mapping({"jobbers_redis_url": "redis://x", "jobbers_alerts":
                                       list(rules), **more})


def rule(**fields: Any) -> dict[str, Any]:
    return {"name": "r1", "kind": "stall", "webhooks": [HOOK], **fields}


# ---------------------------------------------------------------- rules, as users write them
def test_rules_from_the_setting() -> None:
    rules = parse_rules([rule(task="billing.*", min_interval=60),
                         rule(name="rate", kind="dead_letter_rate", threshold=10, window=60,
                              webhooks=None, emails=["ops@example.com"])])
    assert rules[0] == AlertRule(name="r1", kind=AlertKind.STALL, task="billing.*",
                                 webhooks=(HOOK,), min_interval=60.0)
    assert rules[1].threshold == 10
    assert rules[1].emails == ("ops@example.com",)


@pytest.mark.parametrize(("raw", "says"), [
    ({"name": "r1", "kind": "stal", "webhooks": [HOOK]}, "r1'.kind must be one of"),
    (rule(webhooks=["ftp://x"]), "each must be an http:// or https:// URL"),
    (rule(webhooks=[]), "needs somewhere to send"),
    (rule(emails=["nobody"]), "'nobody' is not an address"),
    (rule(kind="dead_letter_rate"), ".threshold must be a whole number >= 1"),
    (rule(threshold=3), "threshold is for dead_letter_rate rules only"),
    (rule(min_interval=0), ".min_interval must be a number of seconds >= 1"),
    (rule(window="5m"), ".window must be a number of seconds"),
    (rule(enabled="yes"), ".enabled must be True or False"),
    (rule(taks="x"), "unknown field(s) taks"),
    (rule(name="has space"), "jobbers_alerts[0].name must be"),
])
def test_a_bad_rule_is_refused_naming_it(raw: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigurationError, match=None) as caught:
        config(raw)
    assert says in str(caught.value)


def test_a_webhook_url_is_never_quoted_in_an_error() -> None:
    with pytest.raises(ConfigurationError) as caught:
        config(rule(webhooks=["https://hooks.example.com/x y/secret-path"]))
    assert "secret-path" not in str(caught.value)


def test_the_setting_must_be_a_list_with_unique_names() -> None:
    with pytest.raises(ConfigurationError, match="must be a list of dicts"):
        config(jobbers_alerts={"name": "x"})
    with pytest.raises(ConfigurationError, match="two rules are named 'r1'"):
        config(rule(), rule())
    with pytest.raises(ConfigurationError, match="jobbers_admin_url must be"):
        config(jobbers_admin_url="ops.example.com/admin")


def test_matching_by_kind_task_group_and_schedule() -> None:
    r = parse_rules([rule(task="billing.*")])[0]
    assert r.matches("stall", "k", "billing.charge", None)
    assert not r.matches("stall", "k", "mail.send", None)
    assert not r.matches("stall", "k", None, None)  # cannot tell: not this rule's
    assert not r.matches("cleaner_overdue", "k", "billing.charge", None)
    g = parse_rules([rule(kind="new_failure_group", group="ab12")])[0]
    assert g.matches("new_failure_group", "ab12", "t", "ab12")
    assert not g.matches("new_failure_group", "cd34", "t", "cd34")
    s = parse_rules([rule(kind="periodic_missed", schedule="nightly-*")])[0]
    assert s.matches("periodic_missed", "nightly-report", None, None)
    assert not s.matches("periodic_missed", "hourly", None, None)
    off = parse_rules([rule(enabled=False)])[0]
    assert not off.matches("stall", "k", None, None)


# ---------------------------------------------------------------- dedupe and rate limit
class Sent:
    """A webhook stand-in: what would have been posted."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.fail = False

    def __call__(self, url: str, body: dict[str, Any], timeout: float,
                 allow: Sequence[Any] = ()) -> int:
        if self.fail:
            from jobbers_celery.alerts.webhook import WebhookError
            raise WebhookError("https://hooks.example.com unreachable: ConnectionRefusedError")
        self.bodies.append(body)
        return 200


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> Sent:
    box = Sent()
    monkeypatch.setattr(alert_service, "post", box)
    return box


def event(key: str = "proj.add", **more: Any) -> AlertEvent:
    return AlertEvent(AlertKind.STALL, key, f"3 task(s) of {key} stalled", "text",
                      "jobbers/deadletterentry/live/", task_name=key, **more)


def test_one_alert_per_rule_and_key_within_min_interval(sent: Sent) -> None:
    store = InMemoryStore()
    alerts = Alerts(store, config(rule(min_interval=60),
                                  jobbers_admin_url="https://ops.example.com/admin/"))
    for _ in range(5):
        alerts.emit(event())
    alerts.emit(event("proj.other"))
    assert alerts.flush()
    assert [b["jobbers"]["key"] for b in sent.bodies] == ["proj.add", "proj.other"]
    assert sent.bodies[0]["jobbers"]["link"] == (
        "https://ops.example.com/admin/jobbers/deadletterentry/live/")
    assert alerts.stats["suppressed"] == 4
    store.advance(61)  # the mark expired: told again
    alerts.emit(event())
    assert alerts.flush()
    assert len(sent.bodies) == 3


def test_two_processes_share_the_dedupe_mark(sent: Sent) -> None:
    store = InMemoryStore()
    one, two = Alerts(store, config(rule())), Alerts(store, config(rule()))
    one.emit(event())
    assert one.flush()
    two.emit(event())
    assert two.flush()
    assert len(sent.bodies) == 1
    assert two.stats["suppressed"] == 1


def test_an_ongoing_condition_is_told_once_while_it_lasts(sent: Sent) -> None:
    store = InMemoryStore()
    alerts = Alerts(store, config(rule(kind="cleaner_overdue", min_interval=60)))
    overdue = AlertEvent(AlertKind.CLEANER_OVERDUE, "cleaner", "overdue", "", ongoing=True)
    for _ in range(4):  # reported every 50 s, over 150 s: the mark keeps being extended
        alerts.emit(overdue)
        assert alerts.flush()
        store.advance(50)
    assert len(sent.bodies) == 1
    store.advance(61)  # no report for longer than min_interval: a new outage
    alerts.emit(overdue)
    assert alerts.flush()
    assert len(sent.bodies) == 2


def test_a_failed_delivery_is_logged_once_and_tried_again_next_time(
        sent: Sent, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="jobbers.alerts")  # whatever the root's level is
    alerts = Alerts(InMemoryStore(), config(rule()))
    sent.fail = True
    for _ in range(3):
        alerts.emit(event())
        assert alerts.flush()
    failures = [r for r in caplog.records if "failed" in r.getMessage()]
    assert len(failures) == 1
    assert "secret" not in failures[0].getMessage()
    assert alerts.stats["failed"] == 3  # the mark was cleared each time: each one tried
    sent.fail = False
    alerts.emit(event())
    assert alerts.flush()
    assert len(sent.bodies) == 1
    assert any(r.levelno == logging.INFO and "works again" in r.getMessage()
               for r in caplog.records)  # the recovery's own line, not the failure's


def test_dead_letter_rate_per_task_and_per_group(sent: Sent) -> None:
    store = InMemoryStore()
    alerts = Alerts(store, config(
        rule(name="per-task", kind="dead_letter_rate", task="billing.*", threshold=3,
             window=60),
        rule(name="per-group", kind="dead_letter_rate", group="fp1", threshold=2,
             window=60)))
    alerts.dead_lettered("billing.charge")
    alerts.dead_lettered("billing.charge")
    alerts.dead_lettered("mail.send")
    alerts.dead_lettered("billing.refund")
    assert alerts.flush()
    assert sent.bodies == []  # 2 of billing.charge, 1 of billing.refund: per task name
    alerts.dead_lettered("billing.charge")
    alerts.dead_lettered("billing.charge")  # over the threshold again: deduplicated
    alerts.dead_lettered("mail.send", group="fp1", link="jobbers/failuregroup/7/change/")
    alerts.dead_lettered("mail.send", group="fp1", link="jobbers/failuregroup/7/change/")
    assert alerts.flush()
    got = {b["jobbers"]["rule"]: b["jobbers"] for b in sent.bodies}
    assert set(got) == {"per-task", "per-group"}
    assert len(sent.bodies) == 2
    assert got["per-task"]["key"] == "billing.charge"
    assert got["per-task"]["title"].startswith("3 dead letters of billing.charge within 60 s")
    assert got["per-group"]["link"] is None  # no jobbers_admin_url: no link


def test_emails_go_through_the_registered_sender(sent: Sent) -> None:
    mails: list[tuple[str, str, Sequence[str]]] = []
    alerts = Alerts(InMemoryStore(), config(rule(webhooks=None, emails=["ops@example.com"])))
    alerts.set_email_sender(lambda subject, body, to: mails.append((subject, body, to)))
    alerts.emit(event())
    assert alerts.flush()
    assert mails == [("[jobbers] 3 task(s) of proj.add stalled", mails[0][1],
                      ("ops@example.com",))]


def test_emit_never_raises_nor_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    alerts = Alerts(InMemoryStore(), config(rule()), queue_size=2)
    monkeypatch.setattr(alerts, "_ensure_thread", lambda: None)  # nobody drains the queue
    for _ in range(5):
        alerts.emit(event())
    assert alerts.stats["dropped"] == 3
    broken = Alerts(InMemoryStore(), config(rule()))
    monkeypatch.setattr(broken, "_ensure_thread", lambda: 1 / 0)
    broken.emit(event())  # no exception
    assert broken.stats["dropped"] == 1


def test_without_rules_emit_costs_nothing() -> None:
    alerts = Alerts(InMemoryStore(), config())
    alerts.emit(event())
    assert alerts._thread is None
    assert alerts.stats["emitted"] == 0


def test_the_store_down_dedupes_per_process(sent: Sent, monkeypatch: pytest.MonkeyPatch,
                                            caplog: pytest.LogCaptureFixture) -> None:
    store = InMemoryStore()

    def down(*_: object) -> bool:
        raise ConnectionError("Redis is down")

    monkeypatch.setattr(store, "alert_mark", down)
    caplog.set_level(logging.WARNING, logger="jobbers.alerts")  # whatever the root's level is
    alerts = Alerts(store, config(rule()))
    alerts.emit(event())
    alerts.emit(event())
    assert alerts.flush()
    assert len(sent.bodies) == 1
    assert sum("store is unreachable" in r.getMessage() for r in caplog.records) == 1


def test_outcomes_are_counted_in_the_alerts_metric(sent: Sent) -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from jobbers_celery.telemetry import metrics

    reader = InMemoryMetricReader()
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    try:
        alerts = Alerts(InMemoryStore(), config(rule()))
        alerts.emit(event())
        alerts.emit(event())
        assert alerts.flush()
        sent.fail = True
        alerts.emit(event("proj.other"))
        assert alerts.flush()
        data: Any = reader.get_metrics_data()
        points = {(dict(p.attributes)["kind"], dict(p.attributes)["outcome"]): p.value
                  for r in data.resource_metrics for s in r.scope_metrics
                  for m in s.metrics if m.name == "alerts" for p in m.data.data_points}
    finally:
        metrics.set_meter_provider(None)
    assert points == {("stall", "sent"): 1, ("stall", "suppressed"): 1,
                      ("stall", "failed"): 1}


def test_a_process_that_exits_delivers_what_is_queued_first(sent: Sent) -> None:
    alerts = Alerts(InMemoryStore(), config(rule()))
    alerts.emit(event())
    # what worker_process_shutdown calls (a pool child exits without atexit)
    assert alert_service.flush_all()
    assert alerts._queue.unfinished_tasks == 0
    assert len(sent.bodies) == 1


def test_a_webhook_port_out_of_range_is_refused_with_the_rule() -> None:
    """``urlsplit(url).port`` raises for ``:99999``: refused when the rule is read, never at
    a delivery (where it stopped the rules after it)."""
    from jobbers_celery.alerts.webhook import where
    from jobbers_celery.core.alertrules import parse_rule
    from jobbers_celery.core.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="webhooks"):
        parse_rule({"name": "typo", "kind": "stall",
                    "webhooks": ["http://hooks.example:99999/T/x"]})
    assert where("http://hooks.example:99999/T/x") == "a malformed URL"
