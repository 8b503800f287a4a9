"""Finding tasks from tooling: the live tasks by state, name, queue or worker, the tasks
whose argument holds a value (:meth:`jobbers_celery.Jobbers.search`: an indexed path, or the
bounded search of the newest records), the failure groups, and the counts. Reads only,
each behind the read rule (:class:`~jobbers_django.permissions.CanRead`); live task
records are read from Redis through :mod:`jobbers_django.bridge`, groups with
:mod:`jobbers_django.querysets`."""

from __future__ import annotations

from rest_framework.request import Request
from rest_framework.response import Response

from jobbers_celery import SearchError, TaskState
from jobbers_django import bridge, querysets
from jobbers_django.api.base import (
    JobbersAPIView,
    bad,
    documented,
    error_responses,
    read_query,
)
from jobbers_django.api.serializers.requests import NoQuerySerializer
from jobbers_django.api.serializers.search import (
    CountsSerializer,
    FailureGroupListQuerySerializer,
    FailureGroupPageSerializer,
    TaskListQuerySerializer,
    TaskListSerializer,
    TaskSearchQuerySerializer,
    TaskSearchSerializer,
)
from jobbers_django.models import FailureGroup
from jobbers_django.redaction import shown

__all__ = ["COUNT_CAP", "CountsView", "FailureGroupListView", "TaskListView",
           "TaskSearchView"]

#: A group list's ``count`` stops here (a bounded subquery).
COUNT_CAP = 1_000
#: What a search's error names, by the query parameter that holds it.
_PARAMETER = {"argument": "arg", "value": "value", "name": "name", "limit": "limit"}


class TaskListView(JobbersAPIView):
    @documented(
        operation_id="tasks_list",
        summary="Live tasks by state, name, queue or worker",
        description="Newest submission first, from jobbers' records (Redis): the state or "
        "name index is walked when given, the other criteria filter (at most 10,000 "
        "records are examined). Records expire jobbers_retention after they end.",
        parameters=[TaskListQuerySerializer],
        responses={200: TaskListSerializer, **error_responses(400, 401, 403)},
    )
    def get(self, request: Request) -> Response:
        query = read_query(TaskListQuerySerializer, request)
        state = TaskState(query["state"]) if "state" in query else None
        records = bridge.get_jobbers().tasks(state, query.get("name"), query.get("queue"),
                                              query["limit"], query.get("worker"))
        return Response(TaskListSerializer({"results": [shown(r) for r in records]}).data)


class TaskSearchView(JobbersAPIView):
    @documented(
        operation_id="tasks_search",
        summary="Tasks whose argument holds a value",
        description="Through the index for the paths jobbers_indexed_arguments names "
        "(exact, completed tasks too); any other path is looked for in the newest "
        "jobbers_search_scan_limit records (5,000 by default) that still hold their "
        "arguments: `examined` of `of` says how many were read. A path through a redacted "
        "key (jobbers_redact_keys) is a 400. Newest first. See docs/howto/search.md.",
        parameters=[TaskSearchQuerySerializer],
        responses={200: TaskSearchSerializer, **error_responses(400, 401, 403)},
    )
    def get(self, request: Request) -> Response:
        query = read_query(TaskSearchQuerySerializer, request)
        try:
            found = bridge.get_jobbers().search(query["arg"], query["value"],
                                                name=query.get("name"), limit=query["limit"])
        except SearchError as exc:
            raise bad(_PARAMETER.get(exc.field, exc.field), exc.message) from None
        answer = {"argument": found.path, "value": found.value, "name": found.name,
                  "indexed": list(found.indexed), "examined": found.examined, "of": found.of,
                  "more": found.more, "how": found.how,
                  "results": [shown(r) for r in found.tasks]}
        return Response(TaskSearchSerializer(answer).data)


class FailureGroupListView(JobbersAPIView):
    read_model = FailureGroup

    @documented(
        operation_id="failure_groups_list",
        summary="Failure groups",
        description="Dead letters grouped by fingerprint (task name, exception type, "
        "normalised message and innermost frame), newest last failure first by default; "
        f"`count` stops at {COUNT_CAP:,}. A group's entries: the dead-letter list's "
        "`fingerprint` filter.",
        parameters=[FailureGroupListQuerySerializer],
        responses={200: FailureGroupPageSerializer, **error_responses(400, 401, 403)},
    )
    def get(self, request: Request) -> Response:
        query = read_query(FailureGroupListQuerySerializer, request)
        groups = querysets.failure_groups(FailureGroup.objects.all(), query, query["ordering"])
        count = querysets.count_at_most(groups, COUNT_CAP + 1)
        page = {"count": min(count, COUNT_CAP), "count_capped": count > COUNT_CAP,
                "results": list(groups[:query["limit"]])}
        return Response(FailureGroupPageSerializer(page).data)


class CountsView(JobbersAPIView):
    @documented(
        operation_id="counts_retrieve",
        summary="Counts: tasks per state, dead letters, failure groups",
        description="Tasks per state from jobbers' state indexes (Redis); dead letters and "
        "groups from the failure groups (one aggregate over a small table).",
        responses={200: CountsSerializer, **error_responses(400, 401, 403)},
    )
    def get(self, request: Request) -> Response:
        read_query(NoQuerySerializer, request)
        counts = bridge.get_jobbers().counts()
        tasks = {state.value: counts.get(state, 0) for state in TaskState}
        dead, groups = querysets.dead_totals(FailureGroup.objects.all())
        return Response(CountsSerializer({
            "tasks": tasks, "total": sum(tasks.values()),
            "dead_letters": dead, "failure_groups": groups}).data)
