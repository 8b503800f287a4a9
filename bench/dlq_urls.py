"""URLs of ``bench/dlq.py``: the admin and the jobbers API, as a project mounts them."""

from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("jobbers/", include("jobbers_django.urls")),
]
