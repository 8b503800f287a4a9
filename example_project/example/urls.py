"""The admin at ``/admin/`` (dead letters, failure groups, live tasks, audit) and the
jobbers REST API at ``/jobbers/`` (its OpenAPI schema at ``/jobbers/schema``)."""

from __future__ import annotations

from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView

urlpatterns = [
    path("", RedirectView.as_view(url="/admin/", permanent=False)),
    path("admin/", admin.site.urls),
    path("jobbers/", include("jobbers_django.urls")),
]
