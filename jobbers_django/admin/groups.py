"""Failure groups (entries grouped by fingerprint, with counts; each links to its entries)
and the audit of every resubmit, discard and cancel, read-only."""

from __future__ import annotations

from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html
from django.utils.http import urlencode
from django.utils.text import Truncator

from jobbers_django.admin.base import ReadOnlyAdmin
from jobbers_django.admin.display import compact_json, local_time
from jobbers_django.admin.filters import ExceptionTypeFilter, TaskNameFilter
from jobbers_django.models import DeadLetterAudit, FailureGroup, Status
from jobbers_django.redaction import text

__all__ = ["DeadLetterAuditAdmin", "FailureGroupAdmin"]


@admin.register(FailureGroup)
class FailureGroupAdmin(ReadOnlyAdmin):
    list_display = ("task_name", "exception_type", "normalised_message", "frame", "failures",
                    "dead_now", "first", "last")
    list_display_links = None
    list_filter = (TaskNameFilter, ExceptionTypeFilter)
    sortable_by = ("failures", "dead_now", "first", "last")
    search_fields = ("message",)
    search_help_text = "Searches the normalised messages."

    @admin.display(description="normalised message")
    def normalised_message(self, obj: FailureGroup) -> str:
        url = reverse("admin:jobbers_deadletterentry_changelist")
        message = text(obj.message)  # credentials taken out by look
        return format_html("<a href=\"{}?{}\" title=\"{}\">{}</a>", url,
                           urlencode({"fingerprint": obj.fingerprint}), message,
                           Truncator(message or "(no message)").chars(90))

    @admin.display(description="first seen", ordering="first_seen")
    def first(self, obj: FailureGroup) -> str:
        return local_time(obj.first_seen)

    @admin.display(description="last seen", ordering="last_seen")
    def last(self, obj: FailureGroup) -> str:
        return local_time(obj.last_seen)

    @admin.display(description="dead now", ordering="dead")
    def dead_now(self, obj: FailureGroup) -> str:
        url = reverse("admin:jobbers_deadletterentry_changelist")
        return format_html("<a href=\"{}?{}\">{}</a>", url, urlencode(
            {"fingerprint": obj.fingerprint, "status": Status.DEAD}), obj.dead)


@admin.register(DeadLetterAudit)
class DeadLetterAuditAdmin(ReadOnlyAdmin):
    list_display = ("when", "username", "action", "source", "matched", "acted",
                    "reset_retry_count", "version", "selection")
    list_filter = ("action", "source", ("at", admin.DateFieldListFilter))
    sortable_by = ("when",)

    @admin.display(description="at", ordering="at")
    def when(self, obj: DeadLetterAudit) -> str:
        return local_time(obj.at)

    @admin.display(description="selection")
    def selection(self, obj: DeadLetterAudit) -> str:
        if obj.task_ids is not None:
            return Truncator(", ".join(obj.task_ids)).chars(80)
        return Truncator(compact_json(obj.filters)).chars(80)
