"""The example's Celery app: configured from Django settings, with jobbers installed.

``celery -A example worker`` and ``celery -A example beat`` run it. Beat runs the jobbers
cleaner (the ``jobbers.clean`` task) every ``CELERY_JOBBERS_CLEANER_INTERVAL`` seconds.
"""

from __future__ import annotations

import os

from celery import Celery

from jobbers_celery import install

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example.settings")

app = Celery("example")
app.config_from_object("django.conf:settings", namespace="CELERY")
jobbers = install(app)
app.autodiscover_tasks()

__all__ = ["app", "jobbers"]
