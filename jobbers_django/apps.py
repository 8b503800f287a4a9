"""The Django app. Its label is ``jobbers``, so its permissions read ``jobbers.<codename>``."""

from __future__ import annotations

from django.apps import AppConfig


class JobbersConfig(AppConfig):
    name = "jobbers_django"
    label = "jobbers"
    verbose_name = "Jobbers"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # registers the paced-resubmit step task on every Celery app (shared_task)
        from jobbers_django import tasks  # noqa: F401
