"""``celery -A tests.integration.dcb_proj``: a Django project's Celery app with jobbers.

Configured the way the Celery docs tell Django projects to do it (settings under the
``CELERY_`` namespace), with django-celery-beat's ``DatabaseScheduler`` as the beat
scheduler. Run only in subprocesses with ``DJANGO_SETTINGS_MODULE`` set, by
``tests/integration/test_beat_django.py``.
"""

from __future__ import annotations

import os

import django
from celery import Celery

from jobbers_celery import install

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.integration.dcb_settings")
django.setup()

REDIS_URL = os.environ["JOBBERS_TEST_REDIS_URL"]

app = Celery("dcb_proj", broker=REDIS_URL, backend=REDIS_URL)
app.config_from_object("django.conf:settings", namespace="CELERY")
jobbers = install(app)

__all__ = ["app", "jobbers"]
