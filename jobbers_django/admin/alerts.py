"""Alert rules (``AlertRule``), edited in the admin: reading them is the read rule's
(``jobbers.view_alertrule`` by default), adding, changing and deleting them
``JOBBERS_ALERTS_PERMISSION``'s. The form checks a rule as the setting's are checked
(``jobbers_celery.parse_rule``); the list shows where alerts go by host only (a Slack
webhook's path is its secret). The form also refuses a webhook whose host is, or resolves
to, an address that is not public (outside ``jobbers_alert_webhook_allow_networks``).
"Send a test alert" posts one to each selected rule's receivers now, bypassing dedupe, and
says what each answered, within ``jobbers_alert_timeout`` in all."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from jobbers_celery import Alerts, ConfigurationError, printable
from jobbers_django import bridge, permissions
from jobbers_django.models import AlertRule

__all__ = ["AlertRuleAdmin"]


def _host(url: str) -> str:
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname or '?'}"


def _alerts() -> Alerts:
    """The alert service of the Celery app here (its allowance and timeout); without an
    app, one with the defaults (internal addresses refused, 5 s)."""
    try:
        return bridge.get_jobbers().alerts
    except Exception:  # noqa: BLE001 - no app installed in this process
        return Alerts()


class AlertRuleForm(forms.ModelForm):  # type: ignore[type-arg]
    """The model's checks (``parse_rule``), and each webhook's destination: a host that is
    (or resolves to, looked up now within ``jobbers_alert_timeout``) a loopback, private,
    link-local or otherwise non-public address is refused here, by its host only (the
    path may be a secret). A name that does not resolve from here is let through: each
    send checks it again."""

    class Meta:
        model = AlertRule
        fields = "__all__"

    def clean(self) -> dict[str, Any]:
        cleaned: dict[str, Any] = super().clean() or {}
        urls = [u.strip() for u in str(cleaned.get("webhooks") or "").splitlines()
                if u.strip()]
        if any(not u.startswith(("http://", "https://")) for u in urls):
            return cleaned  # the model's check says what is wrong
        alerts = _alerts()
        for url in urls[:20]:
            why = alerts.refusal(url)
            if why is not None:
                self.add_error("webhooks", printable(why))
                break
        return cleaned


@admin.register(AlertRule)
class AlertRuleAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("name", "kind", "narrowed_to", "sent_to", "min_interval", "enabled")
    list_filter = ("kind", "enabled")
    search_fields = ("name", "task")
    actions = ("send_test",)
    form = AlertRuleForm
    fieldsets = (
        (None, {"fields": ("name", "kind", "enabled")}),
        ("Which events", {"fields": ("task", "group", "schedule", "threshold", "window")}),
        ("Where to", {"fields": ("webhooks", "emails", "min_interval")}),
    )

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return permissions.can_read(request.user, AlertRule) or self._may_edit(request)

    def has_module_permission(self, request: HttpRequest) -> bool:
        return self.has_view_permission(request)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return self._may_edit(request)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self._may_edit(request)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self._may_edit(request)

    @staticmethod
    def _may_edit(request: HttpRequest) -> bool:
        return permissions.allowed(request.user, permissions.ALERTS)

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        """A reader who may not edit sees the webhooks' hosts, never their URLs (a Slack
        webhook's path is its secret)."""
        fieldsets = super().get_fieldsets(request, obj)
        if self._may_edit(request):
            return fieldsets
        return [(name, {**opts, "fields": tuple("webhook_hosts" if f == "webhooks" else f
                                                for f in opts["fields"])})
                for name, opts in fieldsets]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return () if self._may_edit(request) else ("webhook_hosts",)

    @admin.display(description="webhooks")
    def webhook_hosts(self, obj: AlertRule) -> str:
        return ", ".join(_host(u) for u in obj.as_dict()["webhooks"]) or "none"

    @admin.display(description="narrowed to")
    def narrowed_to(self, obj: AlertRule) -> str:
        parts = [f"task {obj.task}" if obj.task else "", f"group {obj.group}" if obj.group
                 else "", f"schedule {obj.schedule}" if obj.schedule else "",
                 f"{obj.threshold} per {obj.window} s" if obj.threshold else ""]
        return ", ".join(p for p in parts if p) or "everything"

    @admin.display(description="sent to")
    def sent_to(self, obj: AlertRule) -> str:
        rule = obj.as_dict()
        return ", ".join([*(_host(u) for u in rule["webhooks"]), *rule["emails"]]) or "nowhere"

    @admin.action(description="Send a test alert", permissions=["change"])
    def send_test(self, request: HttpRequest, queryset: QuerySet[AlertRule]) -> None:
        """Post a test alert to each selected rule's receivers (at most 20 rules) and say
        what each answered, within the request.

        Run here, not queued, because the operator asks "does this receiver work?" and
        wants the receiver's answer on this page, not in a worker's log; yet bounded: all
        receivers are tried at once and the request waits ``jobbers_alert_timeout`` (plus
        half a second) in all, whatever the number of rules (:meth:`Alerts.send_tests`),
        each webhook post under one deadline for its whole exchange, so a receiver that
        drips its answer cannot hold the web worker. An email still being sent then is
        said so, and its outcome is logged. A non-public destination is refused, saying
        which setting lets it in."""
        rules = []
        for row in queryset[:20]:
            try:
                rules.append(row.as_rule())
            except ConfigurationError as exc:
                self.message_user(request, printable(f"{row.name}: {exc}"), messages.ERROR)
        for name, failures in _alerts().send_tests(rules).items():
            if failures:
                self.message_user(request, printable(f"{name}: " + "; ".join(failures)),
                                  messages.ERROR)
            else:
                self.message_user(request, f"{name}: test alert sent", messages.SUCCESS)
