"""Resubmit and discard behind a confirmation page, shared by every way to start them: the
changelist's bulk actions, a failure group's buttons and one entry's buttons.

The page counts the dead entries of the selection (at most ``MAX_IDS``, newest first, are
taken), shows a redacted sample and lists the ids it will act on; confirming (POST, CSRF)
acts on exactly those that are still selected and dead. Who may do it is checked by the
callers (:data:`jobbers_django.permissions.RESUBMIT`) before either step.

The page is ``jobbers/admin/action_confirmation.html``; ``extra_fieldsets`` (templates
included inside its form) lets an admin add options, such as pacing, without a new page.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from django.contrib import messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse

from jobbers_django import bridge, conf, querysets
from jobbers_django.admin.base import STORE_ERRORS
from jobbers_django.admin.display import compact_json
from jobbers_django.admin.pagination import BoundedPaginator
from jobbers_django.dlq import runs
from jobbers_django.dlq.actions import ActionResult, discard, resubmit
from jobbers_django.dlq.selection import Selection, SelectionError
from jobbers_django.models import Action, Source, Status, VersionChoice
from jobbers_django.redaction import arguments, text

if TYPE_CHECKING:
    from jobbers_django.admin.base import ReadOnlyAdmin

__all__ = ["CONFIRM_SHOWN", "SAMPLE_SHOWN", "confirmation", "perform", "summary"]

#: Entries listed by id on a confirmation page (the count covers all of them).
CONFIRM_SHOWN = 50
#: Entries shown with their (redacted) message and arguments: what the operator checks.
SAMPLE_SHOWN = 5


def verb_of(action: str) -> str:
    return "resubmit" if action == Action.RESUBMIT else "discard"


def confirmation(admin: ReadOnlyAdmin, request: HttpRequest, queryset: QuerySet[Any],
                 action: str, *, back_url: str, form_url: str = "",
                 hidden: Sequence[tuple[str, Any]] = (), subject: str = "",
                 extra_fieldsets: Sequence[str] = ()) -> HttpResponse | None:
    """The confirmation page of ``action`` on the dead entries of ``queryset``, or ``None``
    (after a message) when none is dead. ``hidden`` fields go back with the confirmation;
    ``subject`` names the selection in the title (``of group ...``)."""
    verb = verb_of(action)
    dead = queryset.filter(status=Status.DEAD).order_by(*querysets.NEWEST_FIRST)
    rows = list(dead.values_list("task_id", "task_name", "exception_type",
                                 "last_failed_at", "task_version")[: conf.MAX_IDS + 1])
    more = len(rows) > conf.MAX_IDS
    rows = rows[: conf.MAX_IDS]
    if not rows:
        admin.message_user(request, f"Nothing to {verb}: none of the selected entries is "
                           "dead (they were resubmitted or discarded already).",
                           messages.WARNING)
        return None
    not_dead = querysets.count_at_most(queryset.exclude(status=Status.DEAD),
                                       BoundedPaginator.cap)
    noun = "dead-letter entry" if len(rows) == 1 else "dead-letter entries"
    context = admin.admin_context(
        request, f"{verb.capitalize()} {len(rows)} {noun}{subject}?", action=verb,
        count=len(rows), sample=_sample(dead[:SAMPLE_SHOWN]),
        shown=rows[SAMPLE_SHOWN:CONFIRM_SHOWN], rest=max(0, len(rows) - CONFIRM_SHOWN),
        more=more, max_ids=conf.MAX_IDS, not_dead=not_dead,
        # one field, not one per id: Django refuses more than 1,000 fields per request
        hidden=[*hidden, ("task_ids", json.dumps([r[0] for r in rows]))],
        back_url=back_url, form_url=form_url or request.get_full_path(),
        current_versions=current_versions({r[1] for r in rows})
        if action == Action.RESUBMIT else {},
        extra_fieldsets=list(extra_fieldsets),
    )
    return TemplateResponse(request, "jobbers/admin/action_confirmation.html", context)


def _sample(entries: QuerySet[Any]) -> list[dict[str, Any]]:
    """The first entries as the page shows them: message and arguments redacted."""
    out = []
    for e in entries:
        args, kwargs = arguments(e.task_name, e.args, e.kwargs)
        out.append({"entry": e, "message": text(e.exception_message, e.task_name, e.args,
                                                e.kwargs),
                    "args": compact_json(args), "kwargs": compact_json(kwargs)})
    return out


def perform(admin: ReadOnlyAdmin, request: HttpRequest, queryset: QuerySet[Any],
            action: str) -> HttpResponse | None:
    """Act on the entries the confirmation page listed that ``queryset`` still selects
    (those resubmitted or discarded meanwhile are reported as skipped, newer ones left
    alone); the outcome is a message. A paced resubmit (the page's "paced" button) starts
    a run in the background instead and returns its page to go to."""
    verb = verb_of(action)
    try:
        listed = json.loads(request.POST.get("task_ids") or "[]")[: conf.MAX_IDS]
    except ValueError:
        listed = []
    if not isinstance(listed, list):
        listed = []
    ids = tuple(queryset.filter(task_id__in=[str(i) for i in listed])
                .values_list("task_id", flat=True))
    if not ids:
        admin.message_user(request, f"Nothing to {verb}: the confirmed entries are no "
                           "longer selected.", messages.WARNING)
        return None
    selection = Selection(task_ids=ids)
    reset = request.POST.get("reset_retry_count", "1") != "0"
    version = request.POST.get("version") or VersionChoice.ENTRY
    if version not in VersionChoice.values:
        admin.message_user(request, f"Nothing was done: unknown version choice {version!r}.",
                           messages.ERROR)
        return None
    if action == Action.RESUBMIT and request.POST.get("paced") == "1":
        return _start_run(admin, request, selection, reset, version)
    try:
        if action == Action.RESUBMIT:
            result = resubmit(selection, reset_retry_count=reset, version=version,
                                       user=request.user, source=Source.ADMIN)
        else:
            result = discard(selection, user=request.user,
                                      source=Source.ADMIN)
    except SelectionError as exc:
        admin.message_user(request, f"Nothing was {'resubmitted' if verb == 'resubmit' else 'discarded'}: "
                           f"{exc.message}", messages.ERROR)
        return None
    except STORE_ERRORS as exc:
        admin.message_user(request, f"Redis is unreachable ({exc}): nothing was published. "
                           "Entries already marked resubmitted are published by a later "
                           "resubmit.", messages.ERROR)
        return None
    admin.message_user(request, summary(result, reset, version),
                       messages.SUCCESS if result.acted else messages.WARNING)
    return None


def _start_run(admin: ReadOnlyAdmin, request: HttpRequest, selection: Selection,
               reset: bool, version: str) -> HttpResponse | None:
    """A paced resubmit of the confirmed entries: its page shows the progress."""
    def number(name: str, kind: type[float | int]) -> Any:
        raw = (request.POST.get(name) or "").strip()
        if not raw:
            return None
        try:
            return kind(raw)
        except ValueError:
            raise SelectionError(name, "must be a number") from None

    try:
        rate = number("rate", float)
        if rate is None:
            raise SelectionError("rate", "give a rate (tasks per second)")
        pace = runs.Pace(rate=rate, halt_after=number("halt_after", int),
                         of_last=number("of_last", int))
        run = runs.start(selection, pace, reset_retry_count=reset, version=version,
                         user=request.user, source=Source.ADMIN)
    except SelectionError as exc:
        admin.message_user(request, f"No paced resubmit was started: {exc}", messages.ERROR)
        return None
    admin.message_user(request, f"Paced resubmit #{run.pk} started: {run.total} entries "
                       f"at {run.rate:g} per second; {run.rule}.")
    return HttpResponseRedirect(reverse("admin:jobbers_resubmitrun_change", args=[run.pk]))


def current_versions(names: set[str]) -> dict[str, int]:
    """The current version of each of ``names`` registered in this process's Celery app
    (what the confirmation page offers); the others are left out."""
    from jobbers_celery import ConfigurationError

    try:
        jobbers = bridge.get_jobbers()
    except ConfigurationError:  # not installed here: the page offers no current version
        return {}
    found: dict[str, int] = {}
    for name in sorted(names):
        try:
            found.update(jobbers.current_versions([name]))
        except ValueError:
            continue
    return found


def summary(result: ActionResult, reset_retry_count: bool,
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
