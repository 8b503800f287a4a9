"""URLs of the REST API (docs/howto/rest-api.md):
``path("jobbers/", include("jobbers_django.urls"))``.

Paths have no trailing slash. A task id is any string Celery runs: the client
percent-encodes it (``/`` as ``%2F``), the server decodes it before routing, so the id
routes take any decoded text, slashes included (:class:`~jobbers_django.converters.
AnyTaskIdConverter`); the views refuse only an id over the length bound (a 400 naming
``task_id``). An id's own ``/`` makes a path such as ``tasks/x/cancel`` mean either the
task ``x``'s cancel (POST) or the task ``x/cancel`` (GET): the method decides.
"""

from __future__ import annotations

from functools import wraps
from typing import Any

from django.http import HttpRequest, HttpResponseBase
from django.urls import URLPattern, URLResolver, path

from jobbers_django.api import deadletters, runs, schema, tasks
from jobbers_django.converters import API_TASK_ID
from jobbers_django.setaside import SetAsideView

app_name = "jobbers"

_detail = tasks.TaskDetailView.as_view()
_cancel = tasks.CancelTaskView.as_view()


@wraps(_cancel)  # its view class (the schema's), csrf_exempt (DRF checks CSRF itself)
def _cancel_or_detail(request: HttpRequest, task_id: str, **kwargs: Any) -> HttpResponseBase:
    """``tasks/<id>/cancel``: a read is the task whose id ends in ``/cancel``."""
    if request.method in ("GET", "HEAD"):
        return _detail(request, task_id=f"{task_id}/cancel", **kwargs)
    return _cancel(request, task_id=task_id, **kwargs)


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
    path(f"tasks/<{API_TASK_ID}:task_id>/cancel", _cancel_or_detail, name="task-cancel"),
    path(f"tasks/<{API_TASK_ID}:task_id>", _detail, name="task-detail"),
    path("schema", schema.SchemaView.as_view(), name="schema"),
]
