"""Workflows: a canvas (chain, group, chord) as one unit, read from jobbers (Redis) through
:mod:`jobbers_django.bridge` by any of its members' ids; cancelling it, and resubmitting its
failed members (:func:`jobbers_django.dlq.actions.resubmit_workflow`)."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

from drf_spectacular.utils import OpenApiResponse
from rest_framework import exceptions, status
from rest_framework.request import Request
from rest_framework.response import Response

from jobbers_django import bridge
from jobbers_django.api.base import (
    TASK_ID_PARAM,
    JobbersAPIView,
    check_task_id,
    documented,
    error_responses,
    read_query,
)
from jobbers_django.api.serializers.requests import (
    CancelRequestSerializer,
    NoQuerySerializer,
    WorkflowResubmitRequestSerializer,
)
from jobbers_django.api.serializers.responses import (
    WorkflowCancelResultSerializer,
    WorkflowResubmitResultSerializer,
    WorkflowSerializer,
)
from jobbers_django.dlq.actions import resubmit_workflow
from jobbers_django.models import DeadLetterEntry, Source
from jobbers_django.permissions import CanCancel, CanRead, CanResubmit
from jobbers_django.redaction import shown

__all__ = ["CancelWorkflowView", "ResubmitWorkflowView", "WorkflowDetailView", "workflow_data"]


def workflow_data(detail: bridge.WorkflowDetail) -> dict[str, Any]:
    """What :class:`WorkflowSerializer` answers: the counts, the members (their records
    redacted as a task's answer has them, each with its elapsed time on the Redis clock)
    and the history."""
    flow = detail.workflow
    blocking = set(flow.blocking)
    members = [{"task_id": m.record.task_id, "role": m.role, "parent_id": m.parent_id,
                "group_id": m.group_id, "blocking": m.record.task_id in blocking,
                "elapsed_seconds": _seconds(detail.elapsed(m.record)),
                "record": shown(m.record)} for m in flow.members]
    return {
        **{f.name: getattr(flow, f.name) for f in dataclasses.fields(flow)
           if f.name not in ("members", "elapsed", "state")},
        "task_id": detail.task_id, "state": flow.state.value,
        "progress": f"{flow.completed} of {flow.total} completed",
        "elapsed_seconds": _seconds(flow.elapsed), "members": members,
        "history": [shown(t) for t in flow.history],
    }


def _seconds(delta: timedelta | None) -> float | None:
    return round(delta.total_seconds(), 3) if delta is not None else None


def _found(task_id: str) -> bridge.WorkflowDetail:
    detail = bridge.workflow_detail(task_id)
    if detail is None:
        raise exceptions.NotFound(f"no workflow has the id {task_id} (no such task, or its "
                                  "record expired)")
    return detail


class WorkflowDetailView(JobbersAPIView):
    # the read rule for the live task records, as tasks/<id> (a workflow is its records)
    permission_classes = (CanRead,)
    read_model = DeadLetterEntry

    @documented(
        operation_id="workflow_retrieve",
        summary="A workflow: a canvas as one unit",
        description="The chain, group or chord the id belongs to (any member's id, the "
        "root's, or a group's): its state, progress (k of n completed; failed, running, "
        "pending, cancelled), elapsed time, the members that block it, its members with "
        "their records (the first 1,000 by submission time: `truncated` says there are "
        "more), and its own history. 404 when jobbers knows no workflow for the "
        "id (records expire after jobbers_retention).",
        parameters=[TASK_ID_PARAM],
        responses={200: WorkflowSerializer, **error_responses(400, 401, 403, 404)},
    )
    def get(self, request: Request, task_id: str) -> Response:
        check_task_id(task_id)
        read_query(NoQuerySerializer, request)
        detail = _found(task_id)
        return Response(WorkflowSerializer(workflow_data(detail)).data)


class CancelWorkflowView(JobbersAPIView):
    permission_classes = (CanCancel,)

    @documented(
        operation_id="workflow_cancel",
        summary="Cancel a workflow",
        description="Every member not finished yet is cancelled: a submitted or scheduled "
        "one at once, a started one at its next heartbeat (with `terminate`, its worker "
        "also interrupts it after jobbers_cancel_grace). 404 for an unknown workflow; 409 "
        "when no member was left to cancel.",
        parameters=[TASK_ID_PARAM],
        request=CancelRequestSerializer,
        responses={200: WorkflowCancelResultSerializer,
                   409: OpenApiResponse(WorkflowCancelResultSerializer,
                                        description="nothing left to cancel"),
                   **error_responses(400, 401, 403, 404)},
    )
    def post(self, request: Request, task_id: str) -> Response:
        check_task_id(task_id)
        read_query(NoQuerySerializer, request)
        body = CancelRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        terminate = body.validated_data["terminate"]
        before = _found(task_id)
        done = bridge.cancel_workflow(task_id, terminate=terminate, user=request.user,
                                      source=Source.API)
        after = bridge.workflow_detail(task_id)
        answer = WorkflowCancelResultSerializer({
            "task_id": task_id, "root_id": before.workflow.root_id, "cancelled": done,
            "state": (after or before).workflow.state.value, "terminate": terminate}).data
        return Response(answer, status=status.HTTP_200_OK if done else status.HTTP_409_CONFLICT)


class ResubmitWorkflowView(JobbersAPIView):
    permission_classes = (CanResubmit,)

    @documented(
        operation_id="workflow_resubmit",
        summary="Resubmit a workflow's failed members",
        description="Every failed, stalled or dropped member goes back to the broker with "
        "its id (each at most once, however many requests race); a chord whose header "
        "member failed runs its callback once they complete. Their dead-letter entries "
        "become `resubmitted`, and the action is audited. 404 for an unknown workflow; 409 "
        "when no member was failed.",
        parameters=[TASK_ID_PARAM],
        request=WorkflowResubmitRequestSerializer,
        responses={200: WorkflowResubmitResultSerializer,
                   409: OpenApiResponse(WorkflowResubmitResultSerializer,
                                        description="no failed member to resubmit"),
                   **error_responses(400, 401, 403, 404)},
    )
    def post(self, request: Request, task_id: str) -> Response:
        check_task_id(task_id)
        read_query(NoQuerySerializer, request)
        body = WorkflowResubmitRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        reset = body.validated_data["reset_retry_count"]
        before = _found(task_id)
        done = resubmit_workflow(task_id, reset_retry_count=reset, user=request.user,
                                 source=Source.API)
        after = bridge.workflow_detail(task_id)
        answer = WorkflowResubmitResultSerializer({
            "task_id": task_id, "root_id": before.workflow.root_id, "resubmitted": done,
            "state": (after or before).workflow.state.value,
            "reset_retry_count": reset}).data
        return Response(answer, status=status.HTTP_200_OK if done else status.HTTP_409_CONFLICT)
