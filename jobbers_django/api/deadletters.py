"""The dead-letter queue's endpoints: search, an entry's failure history, resubmit (now or
paced) and discard. Everything acts through :mod:`jobbers_django.dlq`, as the admin
does; lists are read with :mod:`jobbers_django.querysets`.

Lists never count the whole table: ``count`` stops at :data:`COUNT_CAP` (``count_capped``
says so) and pages follow a keyset cursor, so a page costs the same at any depth.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.db import transaction
from django.utils.decorators import method_decorator
from drf_spectacular.utils import OpenApiResponse
from rest_framework import exceptions, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.utils.urls import replace_query_param

from jobbers_django import conf, querysets
from jobbers_django.api.base import (
    TASK_ID_PARAM,
    JobbersAPIView,
    bad,
    check_task_id,
    documented,
    error_responses,
    read_query,
)
from jobbers_django.api.serializers.requests import (
    FILTER_FIELDS,
    ORDERINGS,
    DeadLetterListQuerySerializer,
    DiscardRequestSerializer,
    NoQuerySerializer,
    ResubmitRequestSerializer,
)
from jobbers_django.api.serializers.responses import (
    DeadLetterPageSerializer,
    DiscardResultSerializer,
    FailureHistorySerializer,
    ResubmitResultSerializer,
    ResubmitRunSerializer,
)
from jobbers_django.bridge import failure_history
from jobbers_django.dlq import actions, runs
from jobbers_django.dlq.selection import Selection, SelectionError
from jobbers_django.models import DeadLetterEntry, Source
from jobbers_django.permissions import CanResubmit

__all__ = [
    "COUNT_CAP",
    "DeadLetterDiscardView",
    "DeadLetterHistoryView",
    "DeadLetterListView",
    "DeadLetterResubmitView",
    "start_run",
]

#: A list's ``count`` stops here (a bounded subquery), so a filter matching a million
#: entries costs no more than one matching ten thousand.
COUNT_CAP = 1_000


class DeadLetterListView(JobbersAPIView):
    @documented(
        operation_id="dead_letter_queue_list",
        summary="Search dead-letter entries",
        description="Filters combine (all must match); no filter lists every entry. "
        "Newest last failure first by default. Pages follow `next` (a keyset cursor); "
        f"`count` stops at {COUNT_CAP:,} (`count_capped`).",
        parameters=[DeadLetterListQuerySerializer],
        responses={200: DeadLetterPageSerializer, **error_responses(400, 401, 403)},
    )
    def get(self, request: Request) -> Response:
        query = read_query(DeadLetterListQuerySerializer, request)
        filters = {k: query[k] for k in (*FILTER_FIELDS, "status") if k in query}
        ordering, limit = query["ordering"], query["limit"]
        field, descending = ORDERINGS[ordering]
        try:
            after = (querysets.decode_cursor(query["cursor"], ordering, field)
                     if "cursor" in query else None)
        except querysets.CursorError as exc:
            raise bad("cursor", str(exc)) from None
        base = querysets.filter_entries(DeadLetterEntry.objects.all(), filters)
        count = querysets.count_at_most(base, COUNT_CAP + 1)
        rows = querysets.ids_first(querysets.keyset(base, field, descending, after), 0,
                                   limit + 1, rows=DeadLetterEntry.objects.defer("traceback"))
        next_url = None
        if len(rows) > limit:
            rows = rows[:limit]
            next_url = replace_query_param(request.build_absolute_uri(), "cursor",
                                           querysets.encode_cursor(rows[-1], ordering, field))
        page = {"count": min(count, COUNT_CAP), "count_capped": count > COUNT_CAP,
                "next": next_url, "results": rows}
        return Response(DeadLetterPageSerializer(page).data)


class DeadLetterHistoryView(JobbersAPIView):
    @documented(
        operation_id="dead_letter_queue_history",
        summary="Failure history of one dead-lettered task",
        description="Every failed attempt of the task, oldest first.",
        parameters=[TASK_ID_PARAM],
        responses={200: FailureHistorySerializer, **error_responses(400, 401, 403, 404)},
    )
    def get(self, request: Request, task_id: str) -> Response:
        check_task_id(task_id)
        read_query(NoQuerySerializer, request)
        entry = DeadLetterEntry.objects.filter(task_id=task_id).only(
            "task_id", "task_name", "status").first()
        if entry is None:
            raise exceptions.NotFound(f"task {task_id} is not in the dead-letter queue")
        data = {"task_id": entry.task_id, "task_name": entry.task_name,
                "status": entry.status, "failures": failure_history(task_id)}
        # the entry lends its arguments' secret values to the redaction of the messages
        return Response(FailureHistorySerializer(data, context={"entry": entry}).data)


# ---------------------------------------------------------------------- actions
def _selection(data: Mapping[str, Any]) -> Selection:
    """The entries a validated body selects (``task_ids`` or filters); a 400 if none can."""
    try:
        if "task_ids" in data:
            return Selection(task_ids=tuple(data["task_ids"]), limit=conf.MAX_IDS)
        return Selection(filters=data["filters"], limit=data["limit"])
    except SelectionError as exc:
        raise bad(exc.field, exc.message) from None


def _refreshed(sample: list[DeadLetterEntry]) -> list[DeadLetterEntry]:
    """The sample rows as they are now (after the action changed their status)."""
    fresh = {r.pk: r for r in DeadLetterEntry.objects.filter(pk__in=[r.pk for r in sample])}
    return [fresh.get(r.pk, r) for r in sample]


def _action_data(result: actions.ActionResult) -> dict[str, Any]:
    return {"dry_run": result.dry_run, "matched": result.matched, "more": result.more,
            "skipped": result.skipped,
            "sample": result.sample if result.dry_run else _refreshed(result.sample),
            "audit_id": result.audit_id}


def _pace(data: Mapping[str, Any]) -> runs.Pace:
    try:
        return runs.Pace(rate=data["rate"], halt_after=data.get("halt_after"),
                         of_last=data.get("of_last"))
    except SelectionError as exc:
        raise bad(exc.field, exc.message) from None


def start_run(request: Request, data: Mapping[str, Any]) -> Response:
    """Start a paced resubmit: 202 with the run (its progress at its own URL)."""
    try:
        run = runs.start(_selection(data), _pace(data),
                         reset_retry_count=data["reset_retry_count"], version=data["version"],
                         user=request.user, source=Source.API)
    except SelectionError as exc:
        raise bad(exc.field, exc.message) from None
    answer = ResubmitRunSerializer(run).data
    location = request.build_absolute_uri(f"resubmit-runs/{run.pk}")
    return Response(answer, status=status.HTTP_202_ACCEPTED, headers={"Location": location})


@method_decorator(transaction.non_atomic_requests, name="dispatch")
class DeadLetterResubmitView(JobbersAPIView):
    """Not wrapped in ATOMIC_REQUESTS: the claim commits inside the service, then the
    messages go out, all before the answer (which lists them in ``published``)."""

    permission_classes = (CanResubmit,)

    @documented(
        operation_id="dead_letter_queue_resubmit",
        summary="Resubmit dead letters",
        description="Resubmits `task_ids`, or up to `limit` entries matching the filters "
        "(newest first). Only entries still `dead` are taken, each at most once however "
        "many requests race. The task name and arguments are the entry's; a client "
        "cannot choose them. `version` chooses the entry's version (default) or the "
        "current one. Entries that cannot be published again (no JSON arguments) are "
        "never taken. With `dry_run` nothing changes. With `rate` (and optionally the "
        "stop rule `halt_after`/`of_last`) the resubmit is paced: it runs in the "
        "background and the answer is 202 with the run (see resubmit-runs).",
        request=ResubmitRequestSerializer,
        responses={200: ResubmitResultSerializer,
                   202: OpenApiResponse(ResubmitRunSerializer,
                                        description="a paced resubmit started"),
                   **error_responses(400, 401, 403)},
    )
    def post(self, request: Request) -> Response:
        read_query(NoQuerySerializer, request)  # ?dry_run=true must not be ignored
        body = ResubmitRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        if data.get("rate") is not None and not data["dry_run"]:
            return start_run(request, data)
        try:
            result = actions.resubmit(_selection(data),
                                      reset_retry_count=data["reset_retry_count"],
                                      version=data["version"], user=request.user,
                                      source=Source.API, dry_run=data["dry_run"])
        except SelectionError as exc:
            raise bad(exc.field, exc.message) from None
        answer = {**_action_data(result), "resubmitted": result.acted,
                  "published": [] if result.dry_run else result.published}
        return Response(ResubmitResultSerializer(answer).data)


@method_decorator(transaction.non_atomic_requests, name="dispatch")
class DeadLetterDiscardView(JobbersAPIView):
    permission_classes = (CanResubmit,)

    @documented(
        operation_id="dead_letter_queue_discard",
        summary="Discard dead letters",
        description="Marks `task_ids`, or up to `limit` entries matching the filters, "
        "discarded: kept and listed with status=discarded, never resubmitted. Needs the "
        "resubmit permission. With `dry_run` nothing changes.",
        request=DiscardRequestSerializer,
        responses={200: DiscardResultSerializer, **error_responses(400, 401, 403)},
    )
    def post(self, request: Request) -> Response:
        read_query(NoQuerySerializer, request)
        body = DiscardRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        result = actions.discard(_selection(data), user=request.user, source=Source.API,
                                 dry_run=data["dry_run"])
        answer = {**_action_data(result), "discarded": result.acted}
        return Response(DiscardResultSerializer(answer).data)
