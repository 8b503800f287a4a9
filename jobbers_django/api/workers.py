"""Workers and queues: each worker (pool, queues, running tasks with heartbeat and
progress), each queue (depth, age of its oldest message, paused), the pauses, and pausing
or resuming a task name or a queue on every worker (``Jobbers.pause``/``resume``, see
``docs/howto/workers-queues.md``).

Reading uses the read rule of the live task records; pausing and resuming
``JOBBERS_PAUSE_PERMISSION``. A body names exactly one of ``task`` and ``queue`` (a 400
otherwise, naming the field).
"""

from __future__ import annotations

from typing import Any

from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response

from jobbers_celery import (
    MAX_PAUSE_NAME,
    Pause,
    PauseError,
    PauseKind,
    PauseOutcome,
    QueueInfo,
    WorkerView,
    iso_time,
)
from jobbers_django import bridge
from jobbers_django.api.base import JobbersAPIView, bad, documented, error_responses, read_query
from jobbers_django.api.serializers.fields import StrictSerializer
from jobbers_django.api.serializers.requests import NoQuerySerializer
from jobbers_django.models import DeadLetterEntry
from jobbers_django.permissions import CanPause, CanRead
from jobbers_django.redaction import redact

__all__ = ["PauseView", "PausesView", "QueuesView", "ResumeView", "WorkersView",
           "pause_data", "queue_data", "worker_data"]


def worker_data(w: WorkerView) -> dict[str, Any]:
    live = w.liveness
    return {
        "hostname": w.hostname, "responded": w.responded, "pool": w.pool,
        "concurrency": w.concurrency, "pid": w.pid, "queues": w.queues,
        "last_seen_at": iso_time(live.last_seen_at) if live else None,
        "running": [{"task_id": t.task_id, "name": t.name, "attempt": t.attempt,
                     "started_at": iso_time(t.started_at),
                     "heartbeat_at": iso_time(t.heartbeat_at),
                     "progress": redact(t.progress)} for t in w.running],
    }


def queue_data(q: QueueInfo) -> dict[str, Any]:
    return {"name": q.name, "depth": q.depth, "oldest_age_seconds": q.oldest_age_s,
            "oldest_task_id": q.oldest_task_id, "paused": q.paused,
            "consumers": q.consumers, "note": q.note or None}


def pause_data(p: Pause, held: int | None) -> dict[str, Any]:
    return {"kind": p.kind.value, "target": p.target, "at": iso_time(p.at), "by": p.by,
            "held": held}


def _outcome(o: PauseOutcome) -> dict[str, Any]:
    return {"kind": o.kind.value, "target": o.target, "changed": o.changed,
            "workers": o.workers, "released": o.released}


class PauseRequestSerializer(StrictSerializer):
    task = serializers.CharField(required=False, max_length=MAX_PAUSE_NAME,
                                 trim_whitespace=False,
                                 help_text="a task name: its messages are held until resumed")
    queue = serializers.CharField(required=False, max_length=MAX_PAUSE_NAME,
                                  trim_whitespace=False,
                                  help_text="a queue: no worker consumes it until resumed")

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if ("task" in attrs) == ("queue" in attrs):
            raise serializers.ValidationError({"body": ["give exactly one of task and queue"]})
        return attrs


def _text(**kw: Any) -> serializers.CharField:
    return serializers.CharField(allow_null=True, **kw)


class RunningTaskSerializer(serializers.Serializer[Any]):
    task_id = serializers.CharField()
    name = serializers.CharField()
    attempt = serializers.IntegerField(allow_null=True)
    started_at = _text(help_text="ISO 8601 UTC")
    heartbeat_at = _text(help_text="ISO 8601 UTC; null before the first heartbeat")
    progress = serializers.JSONField(allow_null=True, help_text="as reported, redacted")


class WorkerSerializer(serializers.Serializer[Any]):
    hostname = serializers.CharField()
    responded = serializers.BooleanField(help_text="it answered Celery's inspect")
    pool = _text()
    concurrency = serializers.IntegerField(allow_null=True)
    pid = serializers.IntegerField(allow_null=True)
    queues = serializers.ListField(child=serializers.CharField())
    last_seen_at = _text(help_text="jobbers' liveness; null if jobbers does not see it")
    running = RunningTaskSerializer(many=True)


class QueueSerializer(serializers.Serializer[Any]):
    name = serializers.CharField()
    depth = serializers.IntegerField(allow_null=True)
    oldest_age_seconds = serializers.FloatField(allow_null=True)
    oldest_task_id = _text()
    paused = serializers.BooleanField()
    consumers = serializers.ListField(child=serializers.CharField())
    note = _text()


class PauseSerializer(serializers.Serializer[Any]):
    kind = serializers.ChoiceField(choices=[k.value for k in PauseKind])
    target = serializers.CharField()
    at = serializers.CharField(help_text="ISO 8601 UTC")
    by = serializers.CharField()
    held = serializers.IntegerField(allow_null=True, help_text="a task name's held tasks")


class PauseOutcomeSerializer(serializers.Serializer[Any]):
    kind = serializers.ChoiceField(choices=[k.value for k in PauseKind])
    target = serializers.CharField()
    changed = serializers.BooleanField()
    workers = serializers.ListField(child=serializers.CharField(),
                                    help_text="the workers that applied it at once")
    released = serializers.IntegerField(help_text="a resume: held tasks published again")


def _target(request: Request) -> dict[str, str]:
    body = PauseRequestSerializer(data=request.data)
    body.is_valid(raise_exception=True)
    data = body.validated_data
    return {"name": data["task"]} if "task" in data else {"queue": data["queue"]}


def _by(request: Request) -> str:
    return f"api:{getattr(request.user, 'get_username', lambda: '')()}"[:200]


def _apply(request: Request, *, resume: bool) -> PauseOutcome:
    """Pause (or resume) the task name or queue the request's body names, on behalf of its
    user; a name jobbers refuses is a 400 naming the field."""
    read_query(NoQuerySerializer, request)
    target = _target(request)
    j = bridge.get_jobbers()
    try:
        return (j.resume if resume else j.pause)(**target, by=_by(request))
    except PauseError as exc:
        raise bad("task" if "name" in target else "queue", str(exc)) from None


class WorkersView(JobbersAPIView):
    permission_classes = (CanRead,)
    read_model = DeadLetterEntry  # the live task records' read rule

    @documented(operation_id="workers_list", summary="Workers",
                description="Each worker that answers Celery's inspect (within 1 s) or that "
                "jobbers' liveness sees alive: its pool, concurrency, queues, and running "
                "tasks with their heartbeat and progress (redacted).",
                responses={200: WorkerSerializer(many=True), **error_responses(400, 401, 403)})
    def get(self, request: Request) -> Response:
        read_query(NoQuerySerializer, request)
        return Response([worker_data(w) for w in bridge.get_jobbers().worker_views()])


class QueuesView(JobbersAPIView):
    permission_classes = (CanRead,)
    read_model = DeadLetterEntry

    @documented(operation_id="queues_list", summary="Queues",
                description="Each queue the workers consume, the app declares or a pause "
                "names: its depth, the age of its oldest message in seconds (on RabbitMQ from "
                "jobbers' records, said in `note`), whether it is paused, its consumers.",
                responses={200: QueueSerializer(many=True), **error_responses(400, 401, 403)})
    def get(self, request: Request) -> Response:
        read_query(NoQuerySerializer, request)
        j = bridge.get_jobbers()
        return Response([queue_data(q) for q in j.queues(j.worker_views())])


class PausesView(JobbersAPIView):
    permission_classes = (CanRead,)
    read_model = DeadLetterEntry

    @documented(operation_id="pauses_list", summary="Pauses in force",
                description="Every pause, oldest first; a task name's with the tasks it "
                "holds.", responses={200: PauseSerializer(many=True),
                                      **error_responses(400, 401, 403)})
    def get(self, request: Request) -> Response:
        read_query(NoQuerySerializer, request)
        j = bridge.get_jobbers()
        got = j.pauses()
        return Response([pause_data(p, j.held_count(p.target) if p.kind is PauseKind.TASK
                                    else None) for p in got])


class PauseView(JobbersAPIView):
    permission_classes = (CanPause,)

    @documented(operation_id="pause_create", summary="Pause a task name or a queue",
                description="Durable, on every worker (those started later too). A task "
                "name's messages are held (`scheduled`, reason `paused`, no retry used); a "
                "queue is no longer consumed (its messages stay in the broker). `workers`: "
                "those that applied it at once; 201 when new, 200 when already paused.",
                request=PauseRequestSerializer,
                responses={200: PauseOutcomeSerializer, 201: PauseOutcomeSerializer,
                           **error_responses(400, 401, 403)})
    def post(self, request: Request) -> Response:
        done = _apply(request, resume=False)
        return Response(_outcome(done),
                        status=status.HTTP_201_CREATED if done.changed else status.HTTP_200_OK)


class ResumeView(JobbersAPIView):
    permission_classes = (CanPause,)

    @documented(operation_id="pause_resume", summary="Resume a task name or a queue",
                description="Ends the pause; a task name's held tasks are published again, "
                "each once (`released`). 404 when it was not paused.",
                request=PauseRequestSerializer,
                responses={200: PauseOutcomeSerializer, 404: PauseOutcomeSerializer,
                           **error_responses(400, 401, 403)})
    def post(self, request: Request) -> Response:
        done = _apply(request, resume=True)
        return Response(_outcome(done), status=status.HTTP_200_OK if done.changed
                        else status.HTTP_404_NOT_FOUND)
