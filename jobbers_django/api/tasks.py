"""Live tasks, read from jobbers (Redis) through :mod:`jobbers_django.bridge`: the ones
waiting for a delayed retry, one task's record with its transitions and dead-letter entry,
and cancelling one."""

from __future__ import annotations

import dataclasses

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
    ScheduledQuerySerializer,
)
from jobbers_django.api.serializers.responses import (
    CancelResultSerializer,
    ScheduledTasksSerializer,
    TaskDetailSerializer,
)
from jobbers_django.models import Source
from jobbers_django.permissions import CanCancel
from jobbers_django.redaction import shown

__all__ = ["CancelTaskView", "ScheduledTasksView", "TaskDetailView"]


class ScheduledTasksView(JobbersAPIView):
    @documented(
        operation_id="scheduled_tasks_list",
        summary="Tasks waiting for a delayed retry",
        description="Soonest `run_at` first.",
        parameters=[ScheduledQuerySerializer],
        responses={200: ScheduledTasksSerializer, **error_responses(400, 401, 403)},
    )
    def get(self, request: Request) -> Response:
        from jobbers_celery import TaskState

        query = read_query(ScheduledQuerySerializer, request)
        jobbers = bridge.get_jobbers()
        records = jobbers.scheduled(limit=query["limit"])
        count = jobbers.counts().get(TaskState.SCHEDULED, len(records))
        return Response(ScheduledTasksSerializer({"count": count, "results": records}).data)


class TaskDetailView(JobbersAPIView):
    @documented(
        operation_id="task_retrieve",
        summary="A task's record, transitions and dead-letter entry",
        description="404 when jobbers has neither a record (records expire after "
        "jobbers_retention) nor a dead-letter entry for the id.",
        parameters=[TASK_ID_PARAM],
        responses={200: TaskDetailSerializer, **error_responses(400, 401, 403, 404)},
    )
    def get(self, request: Request, task_id: str) -> Response:
        check_task_id(task_id)
        read_query(NoQuerySerializer, request)
        detail = bridge.task_detail(task_id)
        if detail.record is None and detail.entry is None:
            raise exceptions.NotFound(f"no task {task_id}: no record and no dead-letter entry")
        # what the task put in its record (error, progress) in a form JSON renders, as pages
        detail = dataclasses.replace(
            detail, record=shown(detail.record) if detail.record else None,
            transitions=[shown(t) for t in detail.transitions])
        return Response(TaskDetailSerializer(detail).data)


class CancelTaskView(JobbersAPIView):
    permission_classes = (CanCancel,)

    @documented(
        operation_id="task_cancel",
        summary="Cancel a task",
        description="A submitted or scheduled task is cancelled at once (it never runs). "
        "A started one is asked to stop: it raises TaskCancelled at its next heartbeat "
        "(`outcome` requested; with `terminate` its worker also interrupts it after "
        "jobbers_cancel_grace). 404 for an unknown task; 409 for a finished one.",
        parameters=[TASK_ID_PARAM],
        request=CancelRequestSerializer,
        responses={200: CancelResultSerializer,
                   409: OpenApiResponse(CancelResultSerializer,
                                        description="already finished: nothing to cancel"),
                   **error_responses(400, 401, 403, 404)},
    )
    def post(self, request: Request, task_id: str) -> Response:
        check_task_id(task_id)
        read_query(NoQuerySerializer, request)
        body = CancelRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        terminate = body.validated_data["terminate"]
        jobbers = bridge.get_jobbers()
        if jobbers.get(task_id) is None:
            raise exceptions.NotFound(f"no task {task_id} in jobbers (unknown or expired)")
        done = bridge.cancel_task(task_id, terminate=terminate, user=request.user,
                                  source=Source.API)
        after = jobbers.get(task_id)
        state = after.state.value if after is not None else None
        outcome = ("refused" if not done else
                   "cancelled" if state == "cancelled" else "requested")
        answer = CancelResultSerializer({"task_id": task_id, "cancelled": done,
                                         "outcome": outcome, "state": state,
                                         "terminate": terminate}).data
        return Response(answer, status=status.HTTP_200_OK if done else status.HTTP_409_CONFLICT)
