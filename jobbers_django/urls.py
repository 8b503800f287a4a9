"""URLs of the REST API (docs/howto/rest-api.md):
``path("jobbers/", include("jobbers_django.urls"))``.

Paths have no trailing slash. Task ids are matched loosely here and validated by the views,
so a malformed id is a 400 naming ``task_id``, not a 404.
"""

from __future__ import annotations

from django.urls import URLPattern, URLResolver, path

from jobbers_django import views
from jobbers_django.setaside import SetAsideView

app_name = "jobbers"

urlpatterns: list[URLPattern | URLResolver] = [
    path("dead-letter-queue", views.DeadLetterListView.as_view(), name="dead-letter-queue"),
    path("dead-letter-queue/resubmit", views.DeadLetterResubmitView.as_view(),
         name="dead-letter-resubmit"),
    path("dead-letter-queue/discard", views.DeadLetterDiscardView.as_view(),
         name="dead-letter-discard"),
    path("dead-letter-queue/set-aside", SetAsideView.as_view(), name="dead-letter-set-aside"),
    path("dead-letter-queue/resubmit-runs", views.ResubmitRunListView.as_view(),
         name="resubmit-runs"),
    path("dead-letter-queue/resubmit-runs/<int:run_id>", views.ResubmitRunDetailView.as_view(),
         name="resubmit-run"),
    path("dead-letter-queue/resubmit-runs/<int:run_id>/<str:control>",
         views.ResubmitRunControlView.as_view(), name="resubmit-run-control"),
    path("dead-letter-queue/<str:task_id>/history", views.DeadLetterHistoryView.as_view(),
         name="dead-letter-history"),
    path("scheduled-tasks", views.ScheduledTasksView.as_view(), name="scheduled-tasks"),
    path("tasks/<str:task_id>", views.TaskDetailView.as_view(), name="task-detail"),
    path("tasks/<str:task_id>/cancel", views.CancelTaskView.as_view(), name="task-cancel"),
    path("schema", views.SchemaView.as_view(), name="schema"),
]
