"""URLs of the REST API (DESIGN.md section 3): ``path("jobbers/", include("jobbers_django.urls"))``."""

from __future__ import annotations

from django.urls import URLPattern, URLResolver

app_name = "jobbers"

urlpatterns: list[URLPattern | URLResolver] = []
