"""The jobbers admin: dead-letter triage and live tasks.

Pages (under the admin site, app ``jobbers``):

- Dead-letter entries: a read-only changelist with filters and search, a detail page with
  the failure history and the task's lifecycle transitions, and the actions resubmit
  (resetting the retry count or keeping it) and discard, each behind a confirmation page.
- Failure groups: entries grouped by fingerprint, with counts; each links to its entries.
- Audit: every resubmit, discard and cancel, read-only.
- Live tasks (``deadletterentry/live/``): counts per state, running, stalled and scheduled
  tasks from Redis, the cleaner's last pass, and a cancel action.

Actions go through :mod:`jobbers_django.services`, the same code the API calls; who may
act is :func:`jobbers_django.permissions.allowed`. Everything shown is redacted
(:func:`jobbers_django.redaction.redact`).

Made for tables of millions of entries: filter choices come from the failure groups (a
small table) or are text boxes, counts stop at :attr:`BoundedPaginator.cap`, facets are
off, and the only sortable column is the one the indexes are ordered by. An id-looking
search term is an exact (indexed) ``task_id`` match; any other term searches the messages,
which scans (bounded by the page size and the count cap).
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from datetime import datetime, timedelta
from typing import Any, cast

import redis
from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.options import IncorrectLookupParameters
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.paginator import Paginator
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import dateformat, timezone
from django.utils.functional import cached_property
from django.utils.html import format_html
from django.utils.http import urlencode
from django.utils.text import Truncator

from jobbers_celery import ConfigurationError, TaskState
from jobbers_django import conf, permissions, services
from jobbers_django.models import (
    Action,
    DeadLetterAudit,
    DeadLetterEntry,
    FailureGroup,
    Source,
    Status,
)
from jobbers_django.redaction import display, redact

#: What reading Redis can raise: the admin shows these as a message, never as a 500.
REDIS_ERRORS = (redis.RedisError, OSError, ConfigurationError)

#: Entries listed by name on a confirmation page (the count covers all of them).
CONFIRM_SHOWN = 50
#: Choices a filter offers at most (the failure groups table is small, but not bounded).
MAX_CHOICES = 200
#: Task ids that look like Celery's (uuid4) are searched as ids, never as messages.
_UUID = re.compile(r"[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?"
                   r"[0-9a-fA-F]{12}")


class BoundedPaginator(Paginator):  # type: ignore[type-arg]
    """Counts at most ``cap + 1`` rows (``COUNT(*)`` over a ``LIMIT``ed subquery), so a page
    of a million-row table never counts the table; pages stop at ``cap`` rows (narrow the
    filters to reach older entries). Templates say "more than {cap}" when ``capped``."""

    cap = 10_000

    @cached_property
    def count(self) -> int:
        rows = cast("QuerySet[Any]", self.object_list)
        return rows.order_by()[: self.cap + 1].count()

    @property
    def capped(self) -> bool:
        return self.count > self.cap

    @cached_property
    def num_pages(self) -> int:
        if self.capped:
            return math.ceil(self.cap / self.per_page)
        return int(super().num_pages)

    def page(self, number: Any) -> Any:
        """The page's ids first, then their rows: an ids-only query is an index-only scan
        of (filter, -last_failed_at, -id), where the planner, asked for whole rows, may walk
        the newest-first index and filter (slow when the filter's entries are all old)."""
        number = self.validate_number(number)
        bottom = (number - 1) * self.per_page
        top = bottom + self.per_page
        if top + self.orphans >= self.count:
            top = self.count
        rows = cast("QuerySet[Any]", self.object_list)
        ids = list(rows.values_list("pk", flat=True)[bottom:top])
        by_pk = {obj.pk: obj for obj in rows.filter(pk__in=ids)}
        return self._get_page(  # type: ignore[attr-defined]
            [by_pk[pk] for pk in ids if pk in by_pk], number, self)


# ---------------------------------------------------------------------- filters
class ExactFilter(admin.SimpleListFilter):
    """``?<parameter_name>=<value>``: an exact match on the column of that name (the
    parameters are the API's filter names)."""

    parameter_name: str

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = (self.value() or "").strip()
        if not value:
            return queryset
        try:
            return queryset.filter(**{self.parameter_name: value})
        except (ValueError, ValidationError) as exc:  # e.g. a version that is not a number
            raise IncorrectLookupParameters(exc) from exc


class GroupValuesFilter(ExactFilter):
    """Choices read from the failure groups (``SELECT DISTINCT`` over a small table),
    never from the entries; a value passed in the URL filters even if not offered."""

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        values = list(FailureGroup.objects.exclude(**{self.parameter_name: ""})
                      .order_by(self.parameter_name)
                      .values_list(self.parameter_name, flat=True).distinct()[:MAX_CHOICES])
        current = self.value()
        if current and current not in values:
            values.append(current)
        return [(v, v) for v in values]


class TaskNameFilter(GroupValuesFilter):
    title = "task name"
    parameter_name = "task_name"


class ExceptionTypeFilter(GroupValuesFilter):
    title = "exception type"
    parameter_name = "exception_type"


class ChoicesFilter(ExactFilter):
    """A choices field (``?status=dead``); the choices come from the model."""

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return list(model_admin.model._meta.get_field(self.parameter_name).flatchoices)


class ReasonFilter(ChoicesFilter):
    title = "reason"
    parameter_name = "reason"


class StatusFilter(ChoicesFilter):
    title = "status"
    parameter_name = "status"


class InputFilter(ExactFilter):
    """A text box, for columns whose values no small table lists (no query for choices)."""

    template = "jobbers/admin/input_filter.html"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return []

    def has_output(self) -> bool:
        return True

    def choices(self, changelist: Any) -> Any:
        yield {
            "name": self.parameter_name,
            "value": self.value() or "",
            "hidden": [(k, v) for k, values in changelist.filter_params.items()
                       if k != self.parameter_name for v in values],
            "clear": changelist.get_query_string(remove=[self.parameter_name]),
        }


class QueueFilter(InputFilter):
    title = "queue"
    parameter_name = "queue"


class VersionFilter(InputFilter):
    title = "task version"
    parameter_name = "task_version"


class FingerprintFilter(ExactFilter):
    """``?fingerprint=<fp>`` (the groups page links here); shown only while it is set."""

    title = "failure group"
    parameter_name = "fingerprint"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        fp = self.value()
        if not fp:
            return []
        group = FailureGroup.objects.filter(fingerprint=fp).first()
        return [(fp, f"{group.exception_type or group.task_name}: "
                     f"{Truncator(group.message).chars(60)}" if group else fp)]


# ---------------------------------------------------------------------- helpers
def _json(value: Any) -> str:
    """A stored JSON value as people see it: redacted, long values cut (with a note)."""
    shown, cut = display(value)
    text = json.dumps(shown, indent=2, sort_keys=True, ensure_ascii=False, default=str)
    if cut:
        return format_html("<pre class=\"jobbers-json\">{}</pre><p class=\"help\">Cut for "
                           "display (JOBBERS_DISPLAY_MAX_CHARS); resubmission uses the full "
                           "value.</p>", text)
    return format_html("<pre class=\"jobbers-json\">{}</pre>", text)


def _compact(value: Any) -> str:
    if value is None:
        return ""
    return json.dumps(redact(value), sort_keys=True, ensure_ascii=False, default=str)


def _duration(delta: timedelta | None) -> str:
    """``1h 02m``, ``3m 05s``, ``12s`` (``""`` for ``None``)."""
    if delta is None:
        return ""
    seconds = max(0, int(delta.total_seconds()))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes:02d}m"
    return f"{minutes}m {secs:02d}s" if minutes else f"{secs}s"


def _when(value: datetime | None) -> str:
    """A compact local time for list columns (the admin's default is long)."""
    return dateformat.format(timezone.localtime(value), "Y-m-d H:i:s") if value else "-"


def _since(now: datetime, then: datetime | None) -> timedelta | None:
    return now - then if then else None


class ReadOnlyAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Nothing here is added, edited or deleted by hand; lists stay cheap on big tables."""

    paginator = BoundedPaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    list_per_page = conf.DEFAULT_PAGE_SIZE

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def admin_context(self, request: HttpRequest, title: str, **extra: Any) -> dict[str, Any]:
        return {**self.admin_site.each_context(request), "opts": self.model._meta,
                "title": title, **extra}


# ---------------------------------------------------------------------- entries
@admin.register(DeadLetterEntry)
class DeadLetterEntryAdmin(ReadOnlyAdmin):
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
        ("Last failure", {"fields": ("reason", "exception_type", "exception_message",
                                     "traceback_display", "worker", "attempt",
                                     "retry_attempt", "failure_count", "first_failed_at",
                                     "last_failed_at")}),
        ("Arguments (secrets redacted, long values cut)", {
            "fields": ("args_display", "kwargs_display", "checkpoint_display",
                       "options_display")}),
        ("Resubmission", {"fields": ("resubmit_count", "resubmitted_at", "discarded_at",
                                     "publish_pending")}),
    )
    readonly_fields = ("group", "traceback_display", "args_display", "kwargs_display",
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
        return _when(obj.last_failed_at)

    @admin.display(description="exception")
    def exception(self, obj: DeadLetterEntry) -> str:
        return format_html("<span title=\"{}\">{}</span>", obj.exception_message,
                           Truncator(f"{obj.exception_type}: {obj.exception_message}"
                                     if obj.exception_type else obj.exception_message)
                           .chars(90))

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
                 f"{Truncator(group.message).chars(80)}" if group else obj.fingerprint)
        return format_html("<a href=\"{}?{}\">{}</a>", url,
                           urlencode({"fingerprint": obj.fingerprint}), label)

    @admin.display(description="traceback")
    def traceback_display(self, obj: DeadLetterEntry) -> str:
        if not obj.traceback:
            return "-"
        return format_html("<details><summary>show</summary><pre>{}</pre></details>",
                           obj.traceback)

    @admin.display(description="args")
    def args_display(self, obj: DeadLetterEntry) -> str:
        return _json(obj.args)

    @admin.display(description="kwargs")
    def kwargs_display(self, obj: DeadLetterEntry) -> str:
        return _json(obj.kwargs)

    @admin.display(description="checkpoint")
    def checkpoint_display(self, obj: DeadLetterEntry) -> str:
        return _json(obj.checkpoint)

    @admin.display(description="publish options")
    def options_display(self, obj: DeadLetterEntry) -> str:
        return _json(obj.options)

    def render_change_form(self, request: HttpRequest, context: dict[str, Any],
                           add: bool = False, change: bool = False, form_url: str = "",
                           obj: DeadLetterEntry | None = None) -> HttpResponse:
        if obj is not None:
            context.update(
                failures=list(services.failure_history(obj.task_id)),
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
            self._perform(request, action, verb, queryset)
            return None
        dead = queryset.filter(status=Status.DEAD).order_by("-last_failed_at", "-id")
        rows = list(dead.values_list("task_id", "task_name", "exception_type",
                                     "last_failed_at")[: conf.MAX_IDS + 1])
        more = len(rows) > conf.MAX_IDS
        rows = rows[: conf.MAX_IDS]
        if not rows:
            self.message_user(request, f"Nothing to {verb}: none of the selected entries is "
                              "dead (they were resubmitted or discarded already).",
                              messages.WARNING)
            return None
        not_dead = queryset.exclude(status=Status.DEAD).order_by()[:BoundedPaginator.cap]
        noun = "dead-letter entry" if len(rows) == 1 else "dead-letter entries"
        context = self.admin_context(
            request, f"{verb.capitalize()} {len(rows)} {noun}?", action=verb, count=len(rows),
            shown=rows[:CONFIRM_SHOWN], rest=max(0, len(rows) - CONFIRM_SHOWN), more=more,
            max_ids=conf.MAX_IDS, not_dead=not_dead.count(),
            # one field, not one per id: Django refuses more than 1,000 fields per request
            hidden=[("action", f"{verb}_selected"),
                    ("select_across", request.POST.get("select_across", "0")),
                    ("task_ids", json.dumps([r[0] for r in rows])),
                    *((ACTION_CHECKBOX_NAME, pk)
                      for pk in request.POST.getlist(ACTION_CHECKBOX_NAME))],
            back_url=request.get_full_path(),
        )
        return TemplateResponse(request, "jobbers/admin/action_confirmation.html", context)

    def _perform(self, request: HttpRequest, action: str, verb: str,
                 queryset: QuerySet[Any]) -> None:
        """Act on the entries the confirmation page listed that are still selected (those
        resubmitted or discarded meanwhile are reported as skipped, newer ones untouched)."""
        try:
            listed = json.loads(request.POST.get("task_ids") or "[]")[: conf.MAX_IDS]
        except ValueError:
            listed = []
        ids = tuple(queryset.filter(task_id__in=[str(i) for i in listed])
                    .values_list("task_id", flat=True))
        if not ids:
            self.message_user(request, f"Nothing to {verb}: the confirmed entries are no "
                              "longer selected.", messages.WARNING)
            return
        selection = services.Selection(task_ids=ids)
        reset = request.POST.get("reset_retry_count", "1") != "0"
        try:
            if action == Action.RESUBMIT:
                result = services.resubmit(selection, reset_retry_count=reset,
                                           user=request.user, source=Source.ADMIN)
            else:
                result = services.discard(selection, user=request.user, source=Source.ADMIN)
        except REDIS_ERRORS as exc:
            self.message_user(request, f"Redis is unreachable ({exc}): nothing was published. "
                              "Entries already marked resubmitted are published by a later "
                              "resubmit.", messages.ERROR)
            return
        self.message_user(request, summary(result, reset),
                          messages.SUCCESS if result.acted else messages.WARNING)

    # -------------------------------------------------------------- live tasks
    def get_urls(self) -> list[URLPattern]:
        wrap = self.admin_site.admin_view
        return [
            path("live/", wrap(self.live_view), name="jobbers_live"),
            path("live/task/<path:task_id>/", wrap(self.task_view), name="jobbers_task"),
            path("live/cancel/<path:task_id>/", wrap(self.cancel_view), name="jobbers_cancel"),
            *super().get_urls(),
        ]

    def live_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        context = self.admin_context(request, "Live tasks",
                                     can_cancel=permissions.allowed(request.user,
                                                                    permissions.CANCEL))
        try:
            overview = services.live_overview()
        except REDIS_ERRORS as exc:
            context["error"] = f"Redis is unreachable: {exc}"
            return TemplateResponse(request, "jobbers/admin/live.html", context)
        now = overview.now
        entries = dict(DeadLetterEntry.objects.filter(
            task_id__in=[r.task_id for r in overview.stalled]).values_list("task_id", "pk"))
        context.update(
            counts=[(state.value, overview.counts.get(state.value, 0)) for state in TaskState],
            running=[{"record": r, "progress": _compact(r.progress),
                      "elapsed": _duration(_since(now, r.retried_at or r.started_at)),
                      "heartbeat_ago": _duration(_since(now, r.heartbeat_at))}
                     for r in overview.running],
            stalled=[{"record": r, "entry_pk": entries.get(r.task_id)} for r in overview.stalled],
            scheduled=[{"record": r, "due_in": _duration(_since(r.run_at, now))
                        if r.run_at and r.run_at > now else "due"} for r in overview.scheduled],
            cleaner=overview.cleaner, now=now,
        )
        return TemplateResponse(request, "jobbers/admin/live.html", context)

    def task_view(self, request: HttpRequest, task_id: str) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        entry = DeadLetterEntry.objects.filter(task_id=task_id).first()
        context = self.admin_context(
            request, f"Task {task_id}", task_id=task_id, lifecycle=lifecycle(task_id),
            entry=entry, can_cancel=permissions.allowed(request.user, permissions.CANCEL))
        return TemplateResponse(request, "jobbers/admin/task.html", context)

    def cancel_view(self, request: HttpRequest, task_id: str) -> HttpResponse:
        if not permissions.allowed(request.user, permissions.CANCEL):
            raise PermissionDenied
        live_url = reverse("admin:jobbers_live")
        if request.method == "POST":
            terminate = request.POST.get("terminate") == "1"
            try:
                done = services.cancel_task(task_id, terminate=terminate, user=request.user,
                                            source=Source.ADMIN)
            except REDIS_ERRORS as exc:
                self.message_user(request, f"Redis is unreachable: {exc}", messages.ERROR)
                return HttpResponseRedirect(live_url)
            if done:
                self.message_user(request, f"Task {task_id}: cancelled, or cancellation "
                                  "requested (a running task stops at its next heartbeat"
                                  + (", or is terminated" if terminate else "") + ").")
            else:
                self.message_user(request, f"Task {task_id} was not cancelled: it is unknown "
                                  "or already finished.", messages.WARNING)
            return HttpResponseRedirect(live_url)
        context = self.admin_context(request, f"Cancel task {task_id}?", task_id=task_id,
                                     lifecycle=lifecycle(task_id), live_url=live_url)
        return TemplateResponse(request, "jobbers/admin/cancel_confirmation.html", context)


def lifecycle(task_id: str) -> dict[str, Any]:
    """The task's Redis record (progress redacted) and transitions, or why there are none."""
    try:
        detail = services.task_detail(task_id)
    except REDIS_ERRORS as exc:
        return {"error": f"Redis is unreachable, so the lifecycle cannot be shown: {exc}"}
    record = detail.record
    return {"record": record, "transitions": detail.transitions,
            "progress": _compact(record.progress) if record else "",
            "cancellable": record is not None and record.state in (
                TaskState.SUBMITTED, TaskState.SCHEDULED, TaskState.STARTED)}


def summary(result: services.ActionResult, reset_retry_count: bool) -> str:
    """``Resubmitted 3 dead-letter entries (retry count reset): 3 published; 1 skipped
    (status is discarded).``"""
    n = len(result.acted)
    noun = "dead-letter entry" if n == 1 else "dead-letter entries"
    if result.action == Action.RESUBMIT:
        text = (f"Resubmitted {n} {noun} ("
                f"{'retry count reset' if reset_retry_count else 'retry count kept'})")
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


# ---------------------------------------------------------------------- groups, audit
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
        return format_html("<a href=\"{}?{}\" title=\"{}\">{}</a>", url,
                           urlencode({"fingerprint": obj.fingerprint}), obj.message,
                           Truncator(obj.message or "(no message)").chars(90))

    @admin.display(description="first seen", ordering="first_seen")
    def first(self, obj: FailureGroup) -> str:
        return _when(obj.first_seen)

    @admin.display(description="last seen", ordering="last_seen")
    def last(self, obj: FailureGroup) -> str:
        return _when(obj.last_seen)

    @admin.display(description="dead now", ordering="dead")
    def dead_now(self, obj: FailureGroup) -> str:
        url = reverse("admin:jobbers_deadletterentry_changelist")
        return format_html("<a href=\"{}?{}\">{}</a>", url, urlencode(
            {"fingerprint": obj.fingerprint, "status": Status.DEAD}), obj.dead)


@admin.register(DeadLetterAudit)
class DeadLetterAuditAdmin(ReadOnlyAdmin):
    list_display = ("when", "username", "action", "source", "matched", "acted",
                    "reset_retry_count", "selection")
    list_filter = ("action", "source", ("at", admin.DateFieldListFilter))
    sortable_by = ("when",)

    @admin.display(description="at", ordering="at")
    def when(self, obj: DeadLetterAudit) -> str:
        return _when(obj.at)

    @admin.display(description="selection")
    def selection(self, obj: DeadLetterAudit) -> str:
        if obj.task_ids is not None:
            return Truncator(", ".join(obj.task_ids)).chars(80)
        return Truncator(_compact(obj.filters)).chars(80)
