"""Paced resubmits (``dead-letter-queue/resubmit-runs``): list and start them, follow one,
pause, resume or cancel it. A run is started as the paced form of a resubmit
(:func:`jobbers_django.api.deadletters.start_run`) and controlled by
:mod:`jobbers_django.dlq.runs`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import transaction
from django.utils.decorators import method_decorator
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse
from rest_framework import exceptions, status
from rest_framework.request import Request
from rest_framework.response import Response

from jobbers_django.api.base import (
    ERROR,
    JobbersAPIView,
    bad,
    documented,
    error_responses,
    read_query,
)
from jobbers_django.api.deadletters import start_run
from jobbers_django.api.serializers.requests import (
    NoQuerySerializer,
    ResubmitRunRequestSerializer,
    RunListQuerySerializer,
)
from jobbers_django.api.serializers.responses import (
    ResubmitRunListSerializer,
    ResubmitRunSerializer,
)
from jobbers_django.dlq import runs
from jobbers_django.models import ResubmitRun, Source
from jobbers_django.permissions import CanRead, CanResubmit

__all__ = ["ResubmitRunControlView", "ResubmitRunDetailView", "ResubmitRunListView"]

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

    @documented(
        operation_id="resubmit_runs_list",
        summary="Paced resubmits",
        description="Newest first, with their progress.",
        parameters=[RunListQuerySerializer],
        responses={200: ResubmitRunListSerializer, **error_responses(400, 401, 403)},
    )
    def get(self, request: Request) -> Response:
        query = read_query(RunListQuerySerializer, request)
        qs = ResubmitRun.objects.all()
        if "status" in query:
            qs = qs.filter(status=query["status"])
        return Response(ResubmitRunListSerializer(
            {"results": list(qs.order_by("-created_at", "-id")[: query["limit"]])}).data)

    @documented(
        operation_id="resubmit_runs_create",
        summary="Start a paced resubmit",
        description="As `POST /dead-letter-queue/resubmit`, with `rate` required: the "
        "selected dead entries (taken now, at most `limit`, newest first) are published in "
        "the background at `rate` per second, and the run halts when more than "
        "`halt_after` of the last `of_last` settled tasks failed again. Each entry is "
        "published at most once per run. Needs the resubmit permission.",
        request=ResubmitRunRequestSerializer,
        responses={202: ResubmitRunSerializer, **error_responses(400, 401, 403)},
    )
    def post(self, request: Request) -> Response:
        read_query(NoQuerySerializer, request)
        body = ResubmitRunRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        if body.validated_data["dry_run"]:
            raise bad("dry_run", "a run cannot be a dry run: use POST "
                      "/dead-letter-queue/resubmit with dry_run")
        return start_run(request, body.validated_data)


class ResubmitRunDetailView(JobbersAPIView):
    read_runs = True

    @documented(
        operation_id="resubmit_runs_retrieve",
        summary="A paced resubmit and its progress",
        description="published, completed, failed_again, skipped and remaining are "
        "recounted from the run's items at every step (about every half second).",
        parameters=[_RUN_ID_PARAM],
        responses={200: ResubmitRunSerializer, **error_responses(400, 401, 403, 404)},
    )
    def get(self, request: Request, run_id: int) -> Response:
        read_query(NoQuerySerializer, request)
        return Response(ResubmitRunSerializer(_run(run_id)).data)


_CONTROLS = {"pause": runs.pause, "resume": runs.resume, "cancel": runs.cancel,
             "continue": runs.continue_run}


@method_decorator(transaction.non_atomic_requests, name="dispatch")
class ResubmitRunControlView(JobbersAPIView):
    """``pause``, ``resume``, ``cancel`` or ``continue`` (the URL's ``control``)."""

    permission_classes = (CanResubmit,)

    @documented(
        operation_id="resubmit_runs_control",
        summary="Pause, resume, cancel or continue a paced resubmit",
        description="pause: publish nothing more until resumed (what was published is "
        "still followed); resume: from where it paused, at its pace counted from now; "
        "cancel: publish nothing more, the unpublished entries stay dead; continue: a "
        "halted run goes on (its cause fixed) at its pace counted from now, its stop rule "
        "counting only what settles from then on. 409 when the run's status does not "
        "allow it (a done or cancelled run, resuming a running one, continuing one that "
        "is not halted).",
        parameters=[_RUN_ID_PARAM],
        request=None,
        responses={200: ResubmitRunSerializer,
                   409: OpenApiResponse(ERROR, description="not in a status that allows it"),
                   **error_responses(401, 403, 404)},
    )
    def post(self, request: Request, run_id: int, control: str) -> Response:
        read_query(NoQuerySerializer, request)
        if control not in _CONTROLS:
            raise exceptions.NotFound(f"no such control {control!r}")
        if request.data:
            raise bad("body", "expected no body")
        _run(run_id)
        try:
            run = _CONTROLS[control](run_id, user=request.user, source=Source.API)
        except runs.RunConflict as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
        return Response(ResubmitRunSerializer(run).data)
