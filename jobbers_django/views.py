"""The REST API (docs/howto/rest-api.md), mounted with
``path("jobbers/", include("jobbers_django.urls"))``.

Authentication is the project's (DRF's ``DEFAULT_AUTHENTICATION_CLASSES``: session and
HTTP Basic unless the project says otherwise; a session request needs its CSRF token).
Permissions are explicit, one rule per endpoint from the ``JOBBERS_*_PERMISSION`` settings
(the permission classes of :mod:`jobbers_django.permissions`): reading, resubmitting or
discarding, cancelling. Everything the views do goes through :mod:`jobbers_django.services`,
as the admin does; lists are read with :mod:`jobbers_django.querysets`.

Lists never count the whole table: ``count`` stops at :data:`COUNT_CAP` (``count_capped``
says so) and pages follow a keyset cursor, so a page costs the same at any depth.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from django.db import transaction
from django.db.models import Model
from django.utils.decorators import method_decorator
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    inline_serializer,
)
from drf_spectacular.views import SpectacularAPIView
from rest_framework import exceptions, serializers, status
from rest_framework.parsers import BaseParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.schemas.inspectors import ViewInspector
from rest_framework.settings import api_settings
from rest_framework.utils.urls import replace_query_param
from rest_framework.views import APIView

from jobbers_django import conf, querysets, runs, services
from jobbers_django import serializers as s
from jobbers_django.models import DeadLetterEntry, ResubmitRun, Source
from jobbers_django.parsers import BoundedJSONParser
from jobbers_django.permissions import CanCancel, CanRead, CanResubmit
from jobbers_django.redaction import shown

if TYPE_CHECKING:
    from rest_framework.permissions import _PermissionClass

__all__ = [
    "COUNT_CAP",
    "CancelTaskView",
    "DeadLetterDiscardView",
    "DeadLetterHistoryView",
    "DeadLetterListView",
    "DeadLetterResubmitView",
    "ResubmitRunControlView",
    "ResubmitRunDetailView",
    "ResubmitRunListView",
    "ScheduledTasksView",
    "SchemaView",
    "TaskDetailView",
]

#: A list's ``count`` stops here (a bounded subquery), so a filter matching a million
#: entries costs no more than one matching ten thousand.
COUNT_CAP = 1_000


# ---------------------------------------------------------------------- errors
def _flatten(errors: Any, prefix: str = "") -> list[str]:
    """``{"task_ids": {3: ["malformed"]}}`` -> ``["task_ids[3]: malformed"]``."""
    if isinstance(errors, Mapping):
        lines = []
        for key, value in errors.items():
            if key == api_settings.NON_FIELD_ERRORS_KEY and not prefix:
                name = ""
            elif isinstance(key, int):
                name = f"{prefix}[{key}]"
            else:
                name = f"{prefix}.{key}" if prefix else str(key)
            lines += _flatten(value, name)
        return lines
    if isinstance(errors, list | tuple):
        if all(not isinstance(e, Mapping | list | tuple) for e in errors):
            return [f"{prefix}: {e}" if prefix else str(e) for e in errors]
        return [line for i, e in enumerate(errors) for line in _flatten(e, f"{prefix}[{i}]")]
    return [f"{prefix}: {errors}" if prefix else str(errors)]


def _with_summary(handler: Callable[[Exception, dict[str, Any]], Response | None]
                  ) -> Callable[[Exception, dict[str, Any]], Response | None]:
    """The project's exception handler, with a validation error answered as
    ``{"detail": "field: message; ...", "errors": {field: [messages]}}``."""

    def handle(exc: Exception, context: dict[str, Any]) -> Response | None:
        response = handler(exc, context)
        if response is not None and isinstance(exc, exceptions.ValidationError):
            errors = exc.detail if isinstance(exc.detail, dict) else {
                api_settings.NON_FIELD_ERRORS_KEY: exc.detail}
            lines = (line.rstrip(".") for line in _flatten(errors))
            response.data = {"detail": "; ".join(lines), "errors": errors}
        return response

    return handle


def _bad(field: str, message: str) -> exceptions.ValidationError:
    return exceptions.ValidationError({field: [message]})


def _check_task_id(task_id: str) -> None:
    if len(task_id) > s.TASK_ID_MAX_LENGTH:
        raise _bad("task_id", s.TASK_ID_MESSAGE)
    if s.not_unicode(task_id):
        raise _bad("task_id", s.NOT_UNICODE_MESSAGE)


def _query(serializer_class: type[s.StrictSerializer], request: Request) -> dict[str, Any]:
    """Validated query parameters: unknown, repeated or blank ones are 400s."""
    params = request.query_params
    data: dict[str, Any] = {}
    errors: dict[str, list[str]] = {}
    for name in params:
        if name == api_settings.URL_FORMAT_OVERRIDE:
            continue
        values = params.getlist(name)
        if len(values) > 1:
            errors[name] = ["give this parameter once"]
        data[name] = values[-1]
    if errors:
        raise exceptions.ValidationError(errors)
    serializer = serializer_class(data=data)
    serializer.is_valid(raise_exception=True)
    return dict(serializer.validated_data)


def _selection(data: Mapping[str, Any]) -> services.Selection:
    try:
        if "task_ids" in data:
            return services.Selection(task_ids=tuple(data["task_ids"]), limit=conf.MAX_IDS)
        return services.Selection(filters=data["filters"], limit=data["limit"])
    except services.SelectionError as exc:
        raise _bad(exc.field, exc.message) from None


# ---------------------------------------------------------------------- base
_TASK_ID_PARAM = OpenApiParameter(
    "task_id", OpenApiTypes.STR, OpenApiParameter.PATH,
    description=f"the Celery task id, percent-encoded (every character outside "
    f"A-Z a-z 0-9 - . _ ~, '/' included; an id of dots only as %2E); any characters, at "
    f"most {s.TASK_ID_MAX_LENGTH}")


_ERROR = inline_serializer("Error", {
    "detail": serializers.CharField(help_text="what went wrong; a 400 names the field"),
    "errors": serializers.DictField(
        required=False, help_text="400 only: the messages per field (per index for a "
        "list such as task_ids)"),
})


def _documented(**kwargs: Any) -> Callable[[Callable[..., Response]], Callable[..., Response]]:
    """``extend_schema`` based on drf-spectacular's AutoSchema even when the project's
    ``DEFAULT_SCHEMA_CLASS`` is DRF's own (the decorator reads it at import time), so the
    schema endpoint needs no ``REST_FRAMEWORK`` setting."""

    def decorate(method: Callable[..., Response]) -> Callable[..., Response]:
        method.kwargs = {"schema": AutoSchema}  # type: ignore[attr-defined]
        documented: Callable[..., Response] = extend_schema(**kwargs)(method)
        return documented

    return decorate


def _errors(*codes: int) -> dict[int, OpenApiResponse]:
    text = {400: "invalid input (the message names the field)",
            401: "not authenticated", 403: "not allowed", 404: "not found"}
    return {c: OpenApiResponse(_ERROR, description=text[c]) for c in codes}


class _JobbersMixin:
    """Errors naming their field, and 401 (not 403) for a request without credentials
    whenever one of the authentication classes can challenge (HTTP Basic): DRF asks only
    the first one, which is usually the session's. The views describe themselves with
    drf-spectacular whatever the project's ``DEFAULT_SCHEMA_CLASS``."""

    schema: ViewInspector | None = AutoSchema()

    def get_exception_handler(self) -> Callable[[Exception, dict[str, Any]], Response | None]:
        handler: Callable[[Exception, dict[str, Any]], Response | None] = \
            super().get_exception_handler()  # type: ignore[misc]
        return _with_summary(handler)

    def get_authenticate_header(self, request: Request) -> str:
        for authenticator in self.get_authenticators():  # type: ignore[attr-defined]
            header = authenticator.authenticate_header(request)
            if header:
                return str(header)
        return ""  # none can challenge: a 403


class JobbersAPIView(_JobbersMixin, APIView):
    """Base of the jobbers endpoints: explicit permissions (reading by default: the read
    rule for ``read_model``, see :class:`~jobbers_django.permissions.CanRead`), JSON bodies
    only."""

    permission_classes: Sequence[_PermissionClass] = (CanRead,)
    #: the model whose records a GET shows (its view permission, by default)
    read_model: type[Model] = DeadLetterEntry
    #: paced resubmits: readable by who may read them or start them
    read_runs = False
    parser_classes: Sequence[type[BaseParser]] = (BoundedJSONParser,)


# ---------------------------------------------------------------------- dead letters
class DeadLetterListView(JobbersAPIView):
    @_documented(
        operation_id="dead_letter_queue_list",
        summary="Search dead-letter entries",
        description="Filters combine (all must match); no filter lists every entry. "
        "Newest last failure first by default. Pages follow `next` (a keyset cursor); "
        f"`count` stops at {COUNT_CAP:,} (`count_capped`).",
        parameters=[s.DeadLetterListQuerySerializer],
        responses={200: s.DeadLetterPageSerializer, **_errors(400, 401, 403)},
    )
    def get(self, request: Request) -> Response:
        query = _query(s.DeadLetterListQuerySerializer, request)
        filters = {k: query[k] for k in (*s.FILTER_FIELDS, "status") if k in query}
        ordering, limit = query["ordering"], query["limit"]
        field, descending = s.ORDERINGS[ordering]
        try:
            after = (querysets.decode_cursor(query["cursor"], ordering, field)
                     if "cursor" in query else None)
        except querysets.CursorError as exc:
            raise _bad("cursor", str(exc)) from None
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
        return Response(s.DeadLetterPageSerializer(page).data)


class DeadLetterHistoryView(JobbersAPIView):
    @_documented(
        operation_id="dead_letter_queue_history",
        summary="Failure history of one dead-lettered task",
        description="Every failed attempt of the task, oldest first.",
        parameters=[_TASK_ID_PARAM],
        responses={200: s.FailureHistorySerializer, **_errors(400, 401, 403, 404)},
    )
    def get(self, request: Request, task_id: str) -> Response:
        _check_task_id(task_id)
        _query(s.NoQuerySerializer, request)
        entry = DeadLetterEntry.objects.filter(task_id=task_id).only(
            "task_id", "task_name", "status").first()
        if entry is None:
            raise exceptions.NotFound(f"task {task_id} is not in the dead-letter queue")
        data = {"task_id": entry.task_id, "task_name": entry.task_name,
                "status": entry.status, "failures": services.failure_history(task_id)}
        # the entry lends its arguments' secret values to the redaction of the messages
        return Response(s.FailureHistorySerializer(data, context={"entry": entry}).data)


def _refreshed(sample: list[DeadLetterEntry]) -> list[DeadLetterEntry]:
    """The sample rows as they are now (after the action changed their status)."""
    fresh = {r.pk: r for r in DeadLetterEntry.objects.filter(pk__in=[r.pk for r in sample])}
    return [fresh.get(r.pk, r) for r in sample]


def _action_data(result: services.ActionResult) -> dict[str, Any]:
    return {"dry_run": result.dry_run, "matched": result.matched, "more": result.more,
            "skipped": result.skipped,
            "sample": result.sample if result.dry_run else _refreshed(result.sample),
            "audit_id": result.audit_id}


def _pace(data: Mapping[str, Any]) -> runs.Pace:
    try:
        return runs.Pace(rate=data["rate"], halt_after=data.get("halt_after"),
                         of_last=data.get("of_last"))
    except services.SelectionError as exc:
        raise _bad(exc.field, exc.message) from None


def _start_run(request: Request, data: Mapping[str, Any]) -> Response:
    """Start a paced resubmit: 202 with the run (its progress at its own URL)."""
    try:
        run = runs.start(_selection(data), _pace(data),
                         reset_retry_count=data["reset_retry_count"], version=data["version"],
                         user=request.user, source=Source.API)
    except services.SelectionError as exc:
        raise _bad(exc.field, exc.message) from None
    answer = s.ResubmitRunSerializer(run).data
    location = request.build_absolute_uri(f"resubmit-runs/{run.pk}")
    return Response(answer, status=status.HTTP_202_ACCEPTED, headers={"Location": location})


@method_decorator(transaction.non_atomic_requests, name="dispatch")
class DeadLetterResubmitView(JobbersAPIView):
    """Not wrapped in ATOMIC_REQUESTS: the claim commits inside the service, then the
    messages go out, all before the answer (which lists them in ``published``)."""

    permission_classes = (CanResubmit,)

    @_documented(
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
        request=s.ResubmitRequestSerializer,
        responses={200: s.ResubmitResultSerializer,
                   202: OpenApiResponse(s.ResubmitRunSerializer,
                                        description="a paced resubmit started"),
                   **_errors(400, 401, 403)},
    )
    def post(self, request: Request) -> Response:
        _query(s.NoQuerySerializer, request)  # ?dry_run=true must not be ignored
        body = s.ResubmitRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        if data.get("rate") is not None and not data["dry_run"]:
            return _start_run(request, data)
        try:
            result = services.resubmit(_selection(data),
                                       reset_retry_count=data["reset_retry_count"],
                                       version=data["version"], user=request.user,
                                       source=Source.API, dry_run=data["dry_run"])
        except services.SelectionError as exc:
            raise _bad(exc.field, exc.message) from None
        answer = {**_action_data(result), "resubmitted": result.acted,
                  "published": [] if result.dry_run else result.published}
        return Response(s.ResubmitResultSerializer(answer).data)


@method_decorator(transaction.non_atomic_requests, name="dispatch")
class DeadLetterDiscardView(JobbersAPIView):
    permission_classes = (CanResubmit,)

    @_documented(
        operation_id="dead_letter_queue_discard",
        summary="Discard dead letters",
        description="Marks `task_ids`, or up to `limit` entries matching the filters, "
        "discarded: kept and listed with status=discarded, never resubmitted. Needs the "
        "resubmit permission. With `dry_run` nothing changes.",
        request=s.DiscardRequestSerializer,
        responses={200: s.DiscardResultSerializer, **_errors(400, 401, 403)},
    )
    def post(self, request: Request) -> Response:
        _query(s.NoQuerySerializer, request)
        body = s.DiscardRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        result = services.discard(_selection(data), user=request.user, source=Source.API,
                                  dry_run=data["dry_run"])
        answer = {**_action_data(result), "discarded": result.acted}
        return Response(s.DiscardResultSerializer(answer).data)


# ---------------------------------------------------------------------- paced resubmits
_RUN_ID_PARAM = OpenApiParameter("run_id", OpenApiTypes.INT, OpenApiParameter.PATH,
                                 description="the paced resubmit's id")


def _run(run_id: int) -> ResubmitRun:
    run = ResubmitRun.objects.filter(pk=run_id).first()
    if run is None:
        raise exceptions.NotFound(f"no paced resubmit {run_id}")
    return run


@method_decorator(transaction.non_atomic_requests, name="dispatch")
class ResubmitRunListView(JobbersAPIView):
    read_runs = True

    def get_permissions(self) -> Sequence[Any]:
        return [CanResubmit()] if self.request.method == "POST" else [CanRead()]

    @_documented(
        operation_id="resubmit_runs_list",
        summary="Paced resubmits",
        description="Newest first, with their progress.",
        parameters=[s.RunListQuerySerializer],
        responses={200: s.ResubmitRunListSerializer, **_errors(400, 401, 403)},
    )
    def get(self, request: Request) -> Response:
        query = _query(s.RunListQuerySerializer, request)
        qs = ResubmitRun.objects.all()
        if "status" in query:
            qs = qs.filter(status=query["status"])
        return Response(s.ResubmitRunListSerializer(
            {"results": list(qs.order_by("-created_at", "-id")[: query["limit"]])}).data)

    @_documented(
        operation_id="resubmit_runs_create",
        summary="Start a paced resubmit",
        description="As `POST /dead-letter-queue/resubmit`, with `rate` required: the "
        "selected dead entries (taken now, at most `limit`, newest first) are published in "
        "the background at `rate` per second, and the run halts when more than "
        "`halt_after` of the last `of_last` settled tasks failed again. Each entry is "
        "published at most once per run. Needs the resubmit permission.",
        request=s.ResubmitRunRequestSerializer,
        responses={202: s.ResubmitRunSerializer, **_errors(400, 401, 403)},
    )
    def post(self, request: Request) -> Response:
        _query(s.NoQuerySerializer, request)
        body = s.ResubmitRunRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        if body.validated_data["dry_run"]:
            raise _bad("dry_run", "a run cannot be a dry run: use POST "
                       "/dead-letter-queue/resubmit with dry_run")
        return _start_run(request, body.validated_data)


class ResubmitRunDetailView(JobbersAPIView):
    read_runs = True

    @_documented(
        operation_id="resubmit_runs_retrieve",
        summary="A paced resubmit and its progress",
        description="published, completed, failed_again, skipped and remaining are "
        "recounted from the run's items at every step (about every half second).",
        parameters=[_RUN_ID_PARAM],
        responses={200: s.ResubmitRunSerializer, **_errors(400, 401, 403, 404)},
    )
    def get(self, request: Request, run_id: int) -> Response:
        _query(s.NoQuerySerializer, request)
        return Response(s.ResubmitRunSerializer(_run(run_id)).data)


_CONTROLS = {"pause": runs.pause, "resume": runs.resume, "cancel": runs.cancel}


@method_decorator(transaction.non_atomic_requests, name="dispatch")
class ResubmitRunControlView(JobbersAPIView):
    """``pause``, ``resume`` or ``cancel`` (the URL's ``control``)."""

    permission_classes = (CanResubmit,)

    @_documented(
        operation_id="resubmit_runs_control",
        summary="Pause, resume or cancel a paced resubmit",
        description="pause: publish nothing more until resumed (what was published is "
        "still followed); resume: from where it paused, at its pace counted from now; "
        "cancel: publish nothing more, the unpublished entries stay dead. 409 when the "
        "run's status does not allow it (a finished run, resuming a running one).",
        parameters=[_RUN_ID_PARAM],
        request=None,
        responses={200: s.ResubmitRunSerializer,
                   409: OpenApiResponse(_ERROR, description="not in a status that allows it"),
                   **_errors(401, 403, 404)},
    )
    def post(self, request: Request, run_id: int, control: str) -> Response:
        _query(s.NoQuerySerializer, request)
        if control not in _CONTROLS:
            raise exceptions.NotFound(f"no such control {control!r}")
        if request.data:
            raise _bad("body", "expected no body")
        _run(run_id)
        try:
            run = _CONTROLS[control](run_id, user=request.user, source=Source.API)
        except runs.RunConflict as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
        return Response(s.ResubmitRunSerializer(run).data)


# ---------------------------------------------------------------------- live tasks
class ScheduledTasksView(JobbersAPIView):
    @_documented(
        operation_id="scheduled_tasks_list",
        summary="Tasks waiting for a delayed retry",
        description="Soonest `run_at` first.",
        parameters=[s.ScheduledQuerySerializer],
        responses={200: s.ScheduledTasksSerializer, **_errors(400, 401, 403)},
    )
    def get(self, request: Request) -> Response:
        from jobbers_celery import TaskState

        query = _query(s.ScheduledQuerySerializer, request)
        jobbers = services.get_jobbers()
        records = jobbers.scheduled(limit=query["limit"])
        count = jobbers.counts().get(TaskState.SCHEDULED, len(records))
        return Response(s.ScheduledTasksSerializer({"count": count, "results": records}).data)


class TaskDetailView(JobbersAPIView):
    @_documented(
        operation_id="task_retrieve",
        summary="A task's record, transitions and dead-letter entry",
        description="404 when jobbers has neither a record (records expire after "
        "jobbers_retention) nor a dead-letter entry for the id.",
        parameters=[_TASK_ID_PARAM],
        responses={200: s.TaskDetailSerializer, **_errors(400, 401, 403, 404)},
    )
    def get(self, request: Request, task_id: str) -> Response:
        _check_task_id(task_id)
        _query(s.NoQuerySerializer, request)
        detail = services.task_detail(task_id)
        if detail.record is None and detail.entry is None:
            raise exceptions.NotFound(f"no task {task_id}: no record and no dead-letter entry")
        # what the task put in its record (error, progress) in a form JSON renders, as pages
        detail = dataclasses.replace(
            detail, record=shown(detail.record) if detail.record else None,
            transitions=[shown(t) for t in detail.transitions])
        return Response(s.TaskDetailSerializer(detail).data)


class CancelTaskView(JobbersAPIView):
    permission_classes = (CanCancel,)

    @_documented(
        operation_id="task_cancel",
        summary="Cancel a task",
        description="A submitted or scheduled task is cancelled at once (it never runs). "
        "A started one is asked to stop: it raises TaskCancelled at its next heartbeat "
        "(`outcome` requested; with `terminate` its worker also interrupts it after "
        "jobbers_cancel_grace). 404 for an unknown task; 409 for a finished one.",
        parameters=[_TASK_ID_PARAM],
        request=s.CancelRequestSerializer,
        responses={200: s.CancelResultSerializer,
                   409: OpenApiResponse(s.CancelResultSerializer,
                                        description="already finished: nothing to cancel"),
                   **_errors(400, 401, 403, 404)},
    )
    def post(self, request: Request, task_id: str) -> Response:
        _check_task_id(task_id)
        _query(s.NoQuerySerializer, request)
        body = s.CancelRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        terminate = body.validated_data["terminate"]
        jobbers = services.get_jobbers()
        if jobbers.get(task_id) is None:
            raise exceptions.NotFound(f"no task {task_id} in jobbers (unknown or expired)")
        done = services.cancel_task(task_id, terminate=terminate, user=request.user,
                                    source=Source.API)
        after = jobbers.get(task_id)
        state = after.state.value if after is not None else None
        outcome = ("refused" if not done else
                   "cancelled" if state == "cancelled" else "requested")
        answer = s.CancelResultSerializer({"task_id": task_id, "cancelled": done,
                                           "outcome": outcome, "state": state,
                                           "terminate": terminate}).data
        return Response(answer, status=status.HTTP_200_OK if done else status.HTTP_409_CONFLICT)


# ---------------------------------------------------------------------- schema
def jobbers_endpoints_only(endpoints: list[tuple[Any, ...]], **_: Any) -> list[tuple[Any, ...]]:
    """drf-spectacular preprocessing hook: this app's endpoints (any of its modules),
    whatever else the project serves."""
    return [e for e in endpoints
            if getattr(getattr(e[3], "cls", None), "__module__", "").partition(".")[0]
            == __name__.partition(".")[0]]


class SchemaView(_JobbersMixin, SpectacularAPIView):
    """The OpenAPI 3 schema of the jobbers endpoints (readers only)."""

    @_documented(operation_id="schema_retrieve", summary="This OpenAPI schema",
                 description="YAML by default; JSON with `Accept: "
                 "application/vnd.oai.openapi+json` or `?format=json`.",
                 responses={200: OpenApiTypes.OBJECT, **_errors(401, 403)})
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        response: Response = super().get(request, *args, **kwargs)  # type: ignore[no-untyped-call]
        return response

    permission_classes = (CanRead,)
    custom_settings: ClassVar[dict[str, Any]] = {  # type: ignore[misc]
        "TITLE": "jobbers API",
        "DESCRIPTION": "Dead-letter queue triage and task control for Celery "
                       "(jobbers_django).",
        "VERSION": "1",
        "PREPROCESSING_HOOKS": [f"{__name__}.jobbers_endpoints_only"],
    }
