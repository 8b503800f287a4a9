"""Dead-letter entries: a read-only changelist with filters and search, a detail page with
the failure history and the task's lifecycle transitions, and the actions resubmit
(resetting the retry count or keeping it) and discard, each behind a confirmation page.

An id-looking search term is an exact (indexed) ``task_id`` match; any other term searches
the messages, which scans (bounded by the page size and the count cap).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html
from django.utils.http import urlencode
from django.utils.text import Truncator

from jobbers_django import conf, permissions, querysets, runs, services
from jobbers_django.admin.base import STORE_ERRORS
from jobbers_django.admin.display import json_block, local_time
from jobbers_django.admin.filters import (
    ExceptionTypeFilter,
    FingerprintFilter,
    QueueFilter,
    ReasonFilter,
    StatusFilter,
    TaskNameFilter,
    VersionFilter,
)
from jobbers_django.admin.live import LivePagesAdmin, lifecycle
from jobbers_django.admin.pagination import BoundedPaginator
from jobbers_django.models import (
    Action,
    DeadLetterEntry,
    DeadLetterFailure,
    FailureGroup,
    Source,
    Status,
    VersionChoice,
)
from jobbers_django.redaction import arguments, text

__all__ = ["CONFIRM_SHOWN", "DeadLetterEntryAdmin", "summary"]

#: Entries listed by name on a confirmation page (the count covers all of them).
CONFIRM_SHOWN = 50
#: Task ids that look like Celery's (uuid4) are searched as ids, never as messages.
_UUID = re.compile(r"[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?"
                   r"[0-9a-fA-F]{12}")


@admin.register(DeadLetterEntry)
class DeadLetterEntryAdmin(LivePagesAdmin):
    list_display = ("task_id", "task_name", "version", "queue", "reason", "exception",
                    "n_failures", "last_failed", "status")
    list_filter = (TaskNameFilter, VersionFilter, QueueFilter, ReasonFilter, ExceptionTypeFilter,
                   StatusFilter, ("last_failed_at", admin.DateFieldListFilter), FingerprintFilter)
    sortable_by = ("last_failed",)
    search_fields = ("task_id",)  # shows the box; get_search_results decides
    search_help_text = ("A task id finds that task (exact match); any other text searches "
                        "the exception messages (slower on large tables).")
    actions = ("resubmit_selected", "discard_selected")
    change_list_template = "jobbers/admin/entry_change_list.html"
    change_form_template = "jobbers/admin/entry_detail.html"
    fieldsets = (
        (None, {"fields": ("task_id", "task_name", "task_version", "queue", "status",
                           "group")}),
        ("Last failure", {"fields": ("reason", "exception_type", "exception_message_display",
                                     "traceback_display", "worker", "attempt",
                                     "retry_attempt", "failure_count", "first_failed_at",
                                     "last_failed_at")}),
        ("Arguments (secrets redacted, long values cut)", {
            "fields": ("args_display", "kwargs_display", "checkpoint_display",
                       "options_display")}),
        ("Resubmission", {"fields": ("resubmit_count", "resubmitted_at", "discarded_at",
                                     "publish_pending")}),
    )
    readonly_fields = ("group", "exception_message_display", "traceback_display",
                       "args_display", "kwargs_display",
                       "checkpoint_display", "options_display")

    # -------------------------------------------------------------- list
    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        qs = super().get_queryset(request)
        match = request.resolver_match
        if match is not None and match.url_name == "jobbers_deadletterentry_changelist":
            # the list shows none of these: a page of big payloads is not read for nothing
            qs = qs.defer("args", "kwargs", "options", "checkpoint", "traceback")
        return qs

    @admin.display(description="version")
    def version(self, obj: DeadLetterEntry) -> Any:
        return obj.task_version

    @admin.display(description="failures")
    def n_failures(self, obj: DeadLetterEntry) -> int:
        return obj.failure_count

    @admin.display(description="last failed", ordering="last_failed_at")
    def last_failed(self, obj: DeadLetterEntry) -> str:
        return local_time(obj.last_failed_at)

    @admin.display(description="exception")
    def exception(self, obj: DeadLetterEntry) -> str:
        # the list does not read the arguments: credentials are taken out by look only
        message = text(obj.exception_message)
        return format_html("<span title=\"{}\">{}</span>", message,
                           Truncator(f"{obj.exception_type}: {message}"
                                     if obj.exception_type else message).chars(90))

    def get_search_results(self, request: HttpRequest, queryset: QuerySet[Any],
                           search_term: str) -> tuple[QuerySet[Any], bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        if _UUID.fullmatch(term) or (not any(c.isspace() for c in term)
                                     and DeadLetterEntry.objects.filter(task_id=term).exists()):
            return queryset.filter(task_id=term), False
        return queryset.filter(exception_message__icontains=term), False

    # -------------------------------------------------------------- detail
    @admin.display(description="failure group")
    def group(self, obj: DeadLetterEntry) -> str:
        group = FailureGroup.objects.filter(fingerprint=obj.fingerprint).first()
        url = reverse("admin:jobbers_deadletterentry_changelist")
        label = (f"{group.failures} failures, {group.dead} dead now: "
                 f"{Truncator(text(group.message)).chars(80)}" if group else obj.fingerprint)
        return format_html("<a href=\"{}?{}\">{}</a>", url,
                           urlencode({"fingerprint": obj.fingerprint}), label)

    @admin.display(description="traceback")
    def traceback_display(self, obj: DeadLetterEntry) -> str:
        if not obj.traceback:
            return "-"
        return format_html("<details><summary>show</summary><pre>{}</pre></details>",
                           text(obj.traceback, obj.task_name, obj.args, obj.kwargs))

    @admin.display(description="exception message")
    def exception_message_display(self, obj: DeadLetterEntry) -> str:
        return text(obj.exception_message, obj.task_name, obj.args, obj.kwargs)

    @admin.display(description="args")
    def args_display(self, obj: DeadLetterEntry) -> str:
        return json_block(arguments(obj.task_name, obj.args, obj.kwargs)[0], redacted=True)

    @admin.display(description="kwargs")
    def kwargs_display(self, obj: DeadLetterEntry) -> str:
        return json_block(arguments(obj.task_name, obj.args, obj.kwargs)[1], redacted=True)

    @admin.display(description="checkpoint")
    def checkpoint_display(self, obj: DeadLetterEntry) -> str:
        return json_block(obj.checkpoint)

    @admin.display(description="publish options")
    def options_display(self, obj: DeadLetterEntry) -> str:
        return json_block(obj.options)

    def render_change_form(self, request: HttpRequest, context: dict[str, Any],
                           add: bool = False, change: bool = False, form_url: str = "",
                           obj: DeadLetterEntry | None = None) -> HttpResponse:
        if obj is not None:
            context.update(
                failures=_redacted(obj, services.failure_history(obj.task_id)),
                lifecycle=lifecycle(obj.task_id),
                can_resubmit=obj.status == Status.DEAD and self.has_resubmit_permission(request),
                changelist_url=reverse("admin:jobbers_deadletterentry_changelist"),
                action_checkbox_name=ACTION_CHECKBOX_NAME,
            )
        return super().render_change_form(request, context, add, change, form_url, obj)

    # -------------------------------------------------------------- actions
    def has_resubmit_permission(self, request: HttpRequest) -> bool:
        return permissions.allowed(request.user, permissions.RESUBMIT)

    def changelist_view(self, request: HttpRequest,
                        extra_context: dict[str, Any] | None = None) -> HttpResponse:
        guarded = {"resubmit_selected", "discard_selected"}
        if (request.method == "POST" and guarded & set(request.POST.getlist("action"))
                and not self.has_resubmit_permission(request)):
            raise PermissionDenied
        return super().changelist_view(request, {"live_url": reverse("admin:jobbers_live"),
                                                 "max_action_ids": conf.MAX_IDS,
                                                 **(extra_context or {})})

    @admin.action(description="Resubmit selected dead-letter entries…",
                  permissions=["resubmit"])
    def resubmit_selected(self, request: HttpRequest, queryset: QuerySet[Any]
                          ) -> HttpResponse | None:
        return self._act(request, queryset, Action.RESUBMIT)

    @admin.action(description="Discard selected dead-letter entries…",
                  permissions=["resubmit"])
    def discard_selected(self, request: HttpRequest, queryset: QuerySet[Any]
                         ) -> HttpResponse | None:
        return self._act(request, queryset, Action.DISCARD)

    def _act(self, request: HttpRequest, queryset: QuerySet[Any], action: str
             ) -> HttpResponse | None:
        """A confirmation page listing the dead entries of the selection (at most
        ``MAX_IDS``, newest first); confirming acts on exactly those."""
        verb = "resubmit" if action == Action.RESUBMIT else "discard"
        if request.POST.get("post") == "yes":
            return self._perform(request, action, verb, queryset)
        dead = queryset.filter(status=Status.DEAD).order_by(*querysets.NEWEST_FIRST)
        rows = list(dead.values_list("task_id", "task_name", "exception_type",
                                     "last_failed_at", "task_version")[: conf.MAX_IDS + 1])
        more = len(rows) > conf.MAX_IDS
        rows = rows[: conf.MAX_IDS]
        if not rows:
            self.message_user(request, f"Nothing to {verb}: none of the selected entries is "
                              "dead (they were resubmitted or discarded already).",
                              messages.WARNING)
            return None
        not_dead = querysets.count_at_most(queryset.exclude(status=Status.DEAD),
                                           BoundedPaginator.cap)
        noun = "dead-letter entry" if len(rows) == 1 else "dead-letter entries"
        context = self.admin_context(
            request, f"{verb.capitalize()} {len(rows)} {noun}?", action=verb, count=len(rows),
            shown=rows[:CONFIRM_SHOWN], rest=max(0, len(rows) - CONFIRM_SHOWN), more=more,
            max_ids=conf.MAX_IDS, not_dead=not_dead,
            # one field, not one per id: Django refuses more than 1,000 fields per request
            hidden=[("action", f"{verb}_selected"),
                    ("select_across", request.POST.get("select_across", "0")),
                    ("task_ids", json.dumps([r[0] for r in rows])),
                    *((ACTION_CHECKBOX_NAME, pk)
                      for pk in request.POST.getlist(ACTION_CHECKBOX_NAME))],
            back_url=request.get_full_path(),
            current_versions=_current_versions({r[1] for r in rows})
            if action == Action.RESUBMIT else {},
        )
        return TemplateResponse(request, "jobbers/admin/action_confirmation.html", context)

    def _perform(self, request: HttpRequest, action: str, verb: str,
                 queryset: QuerySet[Any]) -> HttpResponse | None:
        """Act on the entries the confirmation page listed that are still selected (those
        resubmitted or discarded meanwhile are reported as skipped, newer ones untouched);
        a paced resubmit starts a run and shows its page."""
        try:
            listed = json.loads(request.POST.get("task_ids") or "[]")[: conf.MAX_IDS]
        except ValueError:
            listed = []
        ids = tuple(queryset.filter(task_id__in=[str(i) for i in listed])
                    .values_list("task_id", flat=True))
        if not ids:
            self.message_user(request, f"Nothing to {verb}: the confirmed entries are no "
                              "longer selected.", messages.WARNING)
            return None
        selection = services.Selection(task_ids=ids)
        reset = request.POST.get("reset_retry_count", "1") != "0"
        version = request.POST.get("version") or VersionChoice.ENTRY
        if action == Action.RESUBMIT and request.POST.get("paced") == "1":
            return self._start_run(request, selection, reset, version)
        try:
            if action == Action.RESUBMIT:
                result = services.resubmit(selection, reset_retry_count=reset,
                                           version=version, user=request.user,
                                           source=Source.ADMIN)
            else:
                result = services.discard(selection, user=request.user, source=Source.ADMIN)
        except services.SelectionError as exc:
            self.message_user(request, f"Nothing was resubmitted: {exc.message}",
                              messages.ERROR)
            return None
        except STORE_ERRORS as exc:
            self.message_user(request, f"Redis is unreachable ({exc}): nothing was published. "
                              "Entries already marked resubmitted are published by a later "
                              "resubmit.", messages.ERROR)
            return None
        self.message_user(request, summary(result, reset, version),
                          messages.SUCCESS if result.acted else messages.WARNING)
        return None

    def _start_run(self, request: HttpRequest, selection: services.Selection, reset: bool,
                   version: str) -> HttpResponse | None:
        """A paced resubmit of the confirmed entries: its page shows the progress."""
        def number(name: str, kind: type[float | int]) -> Any:
            raw = (request.POST.get(name) or "").strip()
            if not raw:
                return None
            try:
                return kind(raw)
            except ValueError:
                raise services.SelectionError(name, "must be a number") from None

        try:
            rate = number("rate", float)
            if rate is None:
                raise services.SelectionError("rate", "give a rate (tasks per second)")
            pace = runs.Pace(rate=rate, halt_after=number("halt_after", int),
                             of_last=number("of_last", int))
            run = runs.start(selection, pace, reset_retry_count=reset, version=version,
                             user=request.user, source=Source.ADMIN)
        except services.SelectionError as exc:
            self.message_user(request, f"No paced resubmit was started: {exc}",
                              messages.ERROR)
            return None
        self.message_user(request, f"Paced resubmit #{run.pk} started: {run.total} entries "
                          f"at {run.rate:g} per second; {run.rule}.")
        return HttpResponseRedirect(reverse("admin:jobbers_resubmitrun_change",
                                            args=[run.pk]))


def _current_versions(names: set[str]) -> dict[str, int]:
    """The current version of each of ``names`` registered in this process's Celery app
    (what the confirmation page offers); the others are left out."""
    from jobbers_celery import ConfigurationError

    try:
        jobbers = services.get_jobbers()
    except ConfigurationError:  # not installed here: the page offers no current version
        return {}
    found: dict[str, int] = {}
    for name in sorted(names):
        try:
            found.update(jobbers.current_versions([name]))
        except ValueError:
            continue
    return found


def summary(result: services.ActionResult, reset_retry_count: bool,
            version: str = VersionChoice.ENTRY) -> str:
    """``Resubmitted 3 dead-letter entries (retry count reset): 3 published; 1 skipped
    (status is discarded).``"""
    n = len(result.acted)
    noun = "dead-letter entry" if n == 1 else "dead-letter entries"
    if result.action == Action.RESUBMIT:
        text = (f"Resubmitted {n} {noun} ("
                f"{'retry count reset' if reset_retry_count else 'retry count kept'}"
                f"{', as the current version' if version == VersionChoice.CURRENT else ''})")
        if result.published is None:
            text += ": published once the request's transaction commits"
        else:
            text += f": {len(result.published)} published"
            if len(result.published) < n:
                text += (f", {n - len(result.published)} not published (their tasks are "
                         "already pending, running or finished in jobbers)")
    else:
        text = f"Discarded {n} {noun}"
    if result.skipped:
        why = Counter(s["why"] for s in result.skipped)
        text += f"; {len(result.skipped)} skipped (" + ", ".join(
            f"{count} {reason}" for reason, count in why.items()) + ")"
    return text + "."


def _redacted(entry: DeadLetterEntry, failures: Any) -> list[DeadLetterFailure]:
    """The entry's failures for the page, their messages and tracebacks redacted (copies in
    memory, never saved)."""
    shown = list(failures)
    for failure in shown:
        failure.exception_message = text(failure.exception_message, entry.task_name,
                                         entry.args, entry.kwargs)
        failure.traceback = text(failure.traceback, entry.task_name, entry.args, entry.kwargs)
    return shown
