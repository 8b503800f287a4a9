"""Alerts with Django: rules set in the admin (who may), read by the alert service, sent by
Django's email (locmem backend); the sink tells a new failure group, with a link to its
page; the links jobbers_celery writes are the admin's routes."""

from __future__ import annotations

from typing import Any

import pytest
from django.core import mail
from django.test import Client
from django.urls import reverse

from jobbers_celery import AlertKind, JobbersConfig
from jobbers_celery.alerts import AlertEvent, Alerts, links
from jobbers_celery.testing import InMemoryStore
from jobbers_django import alerting
from jobbers_django.models import AlertRule, FailureGroup
from jobbers_django.sink import DjangoDeadLetterSink
from tests.django.conftest import dead_letter

ADMIN = "https://ops.example.com/admin/"


def service() -> Alerts:
    config = JobbersConfig.from_mapping({"jobbers_redis_url": "redis://x",
                                         "jobbers_admin_url": ADMIN})
    return Alerts(InMemoryStore(), config)


@pytest.fixture
def fresh_rules() -> None:
    alerting.admin_rules.invalidate()


def rule_row(**over: Any) -> AlertRule:
    values: dict[str, Any] = {"name": "groups", "kind": "new_failure_group",
                              "emails": "oncall@example.com\nlead@example.com"}
    values.update(over)
    return AlertRule.objects.create(**values)


@pytest.mark.django_db(transaction=True)  # the alert thread reads the rules: committed
@pytest.mark.usefixtures("fresh_rules")
def test_a_new_failure_group_is_emailed_once_with_its_link(settings: Any) -> None:
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    rule_row()
    alerts = service()

    class Jobbers:  # what the sink reads of its Jobbers
        pass

    holder = Jobbers()
    holder.alerts = alerts  # type: ignore[attr-defined]
    sink = DjangoDeadLetterSink(holder)
    first = dead_letter(exception_message="card 4242 declined <!channel>")
    sink.write(first)
    sink.write(dead_letter(exception_message="card 4343 declined <!channel>"))  # same group
    assert alerts.flush()
    group = FailureGroup.objects.get()
    assert group.failures == 2
    assert len(mail.outbox) == 1
    message = mail.outbox[0]
    assert message.to == ["oncall@example.com", "lead@example.com"]
    assert message.subject == ("[jobbers] New failure group: djproj.flaky_import: "
                               "builtins.ValueError")
    assert f"{ADMIN}jobbers/failuregroup/{group.pk}/change/" in message.body
    assert "hunter2" not in message.body


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("fresh_rules")
def test_disabled_and_other_kinds_are_not_sent(settings: Any) -> None:
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    rule_row(enabled=False)
    rule_row(name="stalls", kind="stall")
    alerts = service()
    alerts.emit(AlertEvent(AlertKind.NEW_FAILURE_GROUP, "fp", "t", "x"))
    alerts.emit(AlertEvent(AlertKind.STALL, "proj.add", "stalled", "x", links.LIVE,
                           task_name="proj.add"))
    assert alerts.flush()
    assert [m.subject for m in mail.outbox] == ["[jobbers] stalled"]


@pytest.mark.django_db
@pytest.mark.usefixtures("names")
def test_a_bad_rule_is_refused_by_the_form(admin_client: Client) -> None:
    url = reverse("admin:jobbers_alertrule_add")
    answer = admin_client.post(url, {"name": "rate", "kind": "dead_letter_rate",
                                     "webhooks": "https://hooks.example.com/x", "window": 60,
                                     "min_interval": 600, "enabled": "on"})
    assert answer.status_code == 200
    assert "threshold must be a whole number" in answer.content.decode()
    assert not AlertRule.objects.exists()
    answer = admin_client.post(url, {"name": "rate", "kind": "dead_letter_rate",
                                     "threshold": 5, "window": 60, "min_interval": 600,
                                     "webhooks": "https://hooks.example.com/T0/secret",
                                     "enabled": "on"})
    assert answer.status_code == 302
    listing = admin_client.get(reverse("admin:jobbers_alertrule_changelist")).content.decode()
    assert "https://hooks.example.com" in listing
    assert "secret" not in listing


@pytest.fixture
def names(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Name lookups of ``*.example.com`` answered from a dict (no network); others as
    ever (Redis, PostgreSQL)."""
    import socket

    answers: dict[str, str] = {}
    real = socket.getaddrinfo

    def lookup(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(host, str) and host.endswith(".example.com"):
            if host not in answers:
                raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (answers[host], port))]
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", lookup)
    return answers


@pytest.mark.django_db
@pytest.mark.parametrize(("webhook", "says"), [
    ("http://169.254.169.254/latest/meta-data/SECRET", "169.254.169.254, a link-local address"),
    ("http://127.1:8500/v1/SECRET", "127.0.0.1, a loopback address"),
    ("https://hooks.internal.example.com/SECRET", "10.0.0.7, a private address"),
])
def test_a_webhook_to_an_internal_address_is_refused_by_the_form(
        admin_client: Client, names: dict[str, str], webhook: str, says: str) -> None:
    names["hooks.internal.example.com"] = "10.0.0.7"
    answer = admin_client.post(reverse("admin:jobbers_alertrule_add"), {
        "name": "internal", "kind": "stall", "webhooks": webhook, "window": 300,
        "min_interval": 600, "enabled": "on"})
    assert answer.status_code == 200
    page = answer.content.decode()
    assert says in page
    assert "jobbers_alert_webhook_allow_networks" in page
    assert "SECRET" not in page.replace(webhook, "")  # shown only in the field itself
    assert not AlertRule.objects.exists()


@pytest.mark.django_db
def test_a_name_that_does_not_resolve_here_is_checked_at_each_send(
        admin_client: Client, names: dict[str, str]) -> None:
    answer = admin_client.post(reverse("admin:jobbers_alertrule_add"), {
        "name": "elsewhere", "kind": "stall", "webhooks": "https://hooks.example.com/x",
        "window": 300, "min_interval": 600, "enabled": "on"})
    assert answer.status_code == 302
    assert AlertRule.objects.filter(name="elsewhere").exists()


@pytest.mark.django_db
def test_who_may_read_and_edit_rules(client: Client, staff: Any, operator: Any,
                                     django_user_model: Any) -> None:
    from django.contrib.auth.models import Permission

    rule_row()
    add = reverse("admin:jobbers_alertrule_add")
    listing = reverse("admin:jobbers_alertrule_changelist")
    client.force_login(staff)  # jobbers.view_*: reads, may not edit
    assert client.get(listing).status_code == 200
    assert client.get(add).status_code == 403
    client.force_login(operator)  # no view_alertrule: reads nothing
    assert client.get(listing).status_code == 403
    editor = django_user_model.objects.create_user("editor", password="pw", is_staff=True)
    editor.user_permissions.add(Permission.objects.get(codename="change_alertrule"))
    client.force_login(editor)
    assert client.get(add).status_code == 200


def test_the_links_are_the_admins_routes() -> None:
    root = reverse("admin:index")
    assert root + links.LIVE == reverse("admin:jobbers_live")
    assert root + links.task("a/b c") == reverse("admin:jobbers_task", args=["a/b c"])
    assert root + links.failure_group(7) == reverse("admin:jobbers_failuregroup_change",
                                                    args=[7])
    assert root + alerting.group_page(7) == reverse("admin:jobbers_failuregroup_change",
                                                    args=[7])
    assert (root + links.dead_letters_of("x")).startswith(
        reverse("admin:jobbers_deadletterentry_changelist"))


@pytest.mark.django_db
def test_send_a_test_alert_from_the_list(admin_client: Client, djapp: Any,
                                         settings: Any) -> None:
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    row = rule_row(kind="stall")
    down = rule_row(name="down", webhooks="http://127.0.0.1:9/hook", emails="")
    answer = admin_client.post(reverse("admin:jobbers_alertrule_changelist"), {
        "action": "send_test", "_selected_action": [row.pk, down.pk]}, follow=True)
    shown = [str(m) for m in answer.context["messages"]]
    assert "groups: test alert sent" in shown
    # no jobbers_alert_webhook_allow_networks in djapp: a loopback receiver is refused
    assert ("down: http://127.0.0.1:9 refused: it resolves to 127.0.0.1, a loopback address "
            "(alerts go to public addresses only unless jobbers_alert_webhook_allow_networks "
            "names its network)") in shown
    assert [m.subject for m in mail.outbox] == ["[jobbers] Test alert of rule groups"]


@pytest.mark.django_db
def test_a_reader_sees_webhook_hosts_never_their_urls(client: Client, staff: Any) -> None:
    row = rule_row(webhooks="https://hooks.example.com/services/T0/B0/SECRETPATH")
    client.force_login(staff)
    page = client.get(reverse("admin:jobbers_alertrule_change", args=[row.pk]))
    assert page.status_code == 200
    body = page.content.decode()
    assert "https://hooks.example.com" in body
    assert "SECRETPATH" not in body


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("fresh_rules")
def test_a_dead_letter_rate_per_failure_group(settings: Any) -> None:
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    alerts = service()

    class Jobbers:
        pass

    holder = Jobbers()
    holder.alerts = alerts  # type: ignore[attr-defined]
    sink = DjangoDeadLetterSink(holder)
    sink.write(dead_letter())
    assert alerts.flush()  # counted by no rule
    fingerprint = FailureGroup.objects.get().fingerprint
    rule_row(name="group-spike", kind="dead_letter_rate", group=fingerprint, threshold=2,
             window=600)
    alerting.admin_rules.invalidate()
    sink.write(dead_letter())  # same group: 1 of 2 counted since the rule exists
    sink.write(dead_letter(name="djproj.other"))  # another task, another group
    assert alerts.flush()
    assert mail.outbox == []
    sink.write(dead_letter())
    assert alerts.flush()
    [message] = mail.outbox
    assert message.subject == (f"[jobbers] 2 dead letters of failure group {fingerprint} "
                               "within 600 s")
    assert f"{ADMIN}jobbers/deadletterentry/?fingerprint={fingerprint}" in message.body


@pytest.mark.django_db
def test_the_api_lists_the_rules_with_webhook_hosts_only(client: Client, staff: Any,
                                                         operator: Any, djapp: Any,
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    import dataclasses

    from jobbers_django import bridge

    jobbers = bridge.get_jobbers()
    monkeypatch.setattr(jobbers, "config", dataclasses.replace(jobbers.config, alerts=(
        {"name": "from-settings", "kind": "stall", "webhooks": [
            "https://hooks.example.com/services/T0/B0/SECRETPATH"]},)))
    rule_row(webhooks="https://other.example.com/SECRET2", emails="")
    url = reverse("jobbers:alert-rules")
    client.force_login(operator)  # no view_alertrule
    assert client.get(url).status_code == 403
    client.force_login(staff)
    answer = client.get(url)
    assert answer.status_code == 200
    rules = answer.json()["results"]
    assert [(r["name"], r["source"], r["webhooks"]) for r in rules] == [
        ("from-settings", "settings", ["https://hooks.example.com"]),
        ("groups", "admin", ["https://other.example.com"])]
    assert "SECRET" not in answer.content.decode()
    assert client.get(url, {"limit": 5}).status_code == 400  # no query parameters
