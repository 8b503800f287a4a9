"""URLs of the REST API (docs/howto/rest-api.md):
``path("jobbers/", include("jobbers_django.urls"))``.

Paths have no trailing slash. A task id is any string Celery runs: the client
percent-encodes it (``/`` as ``%2F``), the server decodes it before routing, so the id
routes take any decoded text, slashes included (:class:`~jobbers_django.converters.
AnyTaskIdConverter`); the views refuse only an id over the length bound (a 400 naming
``task_id``). An id's own ``/`` makes a path such as ``tasks/x/cancel`` mean either the
task ``x``'s cancel (POST) or the task ``x/cancel`` (GET): the method decides (and so for
``workflows/x/cancel`` and ``workflows/x/resubmit``).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.http import HttpRequest, HttpResponseBase
from django.urls import URLPattern, URLResolver, path

from jobbers_django.api import (
    alerts,
    deadletters,
    fairshares,
    history,
    periodic,
    ratelimits,
    runs,
    schema,
    search,
    tasks,
    workers,
    workflows,
)
from jobbers_django.converters import API_TASK_ID
from jobbers_django.setaside import SetAsideView

app_name = "jobbers"


def _action_or_detail(action: Callable[..., HttpResponseBase],
                      detail: Callable[..., HttpResponseBase],
                      suffix: str) -> Callable[..., HttpResponseBase]:
    """``<id>/<suffix>``: a POST is the action on ``<id>``, a read is the detail of the id
    that ends in ``/<suffix>``."""

    @wraps(action)  # its view class (the schema's), csrf_exempt (DRF checks CSRF itself)
    def view(request: HttpRequest, task_id: str, **kwargs: Any) -> HttpResponseBase:
        if request.method in ("GET", "HEAD"):
            return detail(request, task_id=f"{task_id}/{suffix}", **kwargs)
        return action(request, task_id=task_id, **kwargs)

    return view


_detail = tasks.TaskDetailView.as_view()
_cancel_or_detail = _action_or_detail(tasks.CancelTaskView.as_view(), _detail, "cancel")
_workflow = workflows.WorkflowDetailView.as_view()
_workflow_cancel = _action_or_detail(workflows.CancelWorkflowView.as_view(), _workflow,
                                     "cancel")
_workflow_resubmit = _action_or_detail(workflows.ResubmitWorkflowView.as_view(), _workflow,
                                       "resubmit")


urlpatterns: list[URLPattern | URLResolver] = [
    path("dead-letter-queue", deadletters.DeadLetterListView.as_view(), name="dead-letter-queue"),
    path("dead-letter-queue/resubmit", deadletters.DeadLetterResubmitView.as_view(),
         name="dead-letter-resubmit"),
    path("dead-letter-queue/discard", deadletters.DeadLetterDiscardView.as_view(),
         name="dead-letter-discard"),
    path("dead-letter-queue/set-aside", SetAsideView.as_view(), name="dead-letter-set-aside"),
    # before the runs' routes: the task "resubmit-runs/1" has its history too
    path(f"dead-letter-queue/<{API_TASK_ID}:task_id>/history",
         deadletters.DeadLetterHistoryView.as_view(), name="dead-letter-history"),
    path("dead-letter-queue/resubmit-runs", runs.ResubmitRunListView.as_view(),
         name="resubmit-runs"),
    path("dead-letter-queue/resubmit-runs/<int:run_id>", runs.ResubmitRunDetailView.as_view(),
         name="resubmit-run"),
    path("dead-letter-queue/resubmit-runs/<int:run_id>/<str:control>",
         runs.ResubmitRunControlView.as_view(), name="resubmit-run-control"),
    path("scheduled-tasks", tasks.ScheduledTasksView.as_view(), name="scheduled-tasks"),
    path("periodic-tasks", periodic.PeriodicTasksView.as_view(), name="periodic-tasks"),
    # the list is "tasks" alone: a task id is never empty in a path (the detail's route
    # needs one character); the search has its own resource, so no id is shadowed
    path("tasks", search.TaskListView.as_view(), name="tasks"),
    path("task-search", search.TaskSearchView.as_view(), name="task-search"),
    path("failure-groups", search.FailureGroupListView.as_view(), name="failure-groups"),
    path("counts", search.CountsView.as_view(), name="counts"),
    path(f"tasks/<{API_TASK_ID}:task_id>/cancel", _cancel_or_detail, name="task-cancel"),
    path(f"tasks/<{API_TASK_ID}:task_id>", _detail, name="task-detail"),
    path(f"workflows/<{API_TASK_ID}:task_id>/cancel", _workflow_cancel,
         name="workflow-cancel"),
    path(f"workflows/<{API_TASK_ID}:task_id>/resubmit", _workflow_resubmit,
         name="workflow-resubmit"),
    path(f"workflows/<{API_TASK_ID}:task_id>", _workflow, name="workflow-detail"),
    path("history", history.HistoryView.as_view(), name="history"),
    path("workers", workers.WorkersView.as_view(), name="workers"),
    path("queues", workers.QueuesView.as_view(), name="queues"),
    path("pauses", workers.PausesView.as_view(), name="pauses"),
    path("fair-shares", fairshares.FairSharesView.as_view(), name="fair-shares"),
    path("pauses/pause", workers.PauseView.as_view(), name="pause"),
    path("pauses/resume", workers.ResumeView.as_view(), name="resume"),
    path("rate-limits", ratelimits.RateLimitsView.as_view(), name="rate-limits"),
    path("rate-limits/set", ratelimits.RateLimitSetView.as_view(), name="rate-limit-set"),
    path("alert-rules", alerts.AlertRuleListView.as_view(), name="alert-rules"),
    path("schema", schema.SchemaView.as_view(), name="schema"),
]
