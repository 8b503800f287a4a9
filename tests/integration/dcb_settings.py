"""Django settings for ``test_beat_django.py`` (django-celery-beat's database scheduler).

Only the subprocesses that test starts use them (``DJANGO_SETTINGS_MODULE`` is set in their
environment, never in the pytest process). The sqlite file lives where
``JOBBERS_DCB_DB`` says.
"""

from __future__ import annotations

import os

SECRET_KEY = "jobbers-tests-only"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
INSTALLED_APPS = ["django_celery_beat"]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ["JOBBERS_DCB_DB"],
        # beat writes while the test reads the same file
        "OPTIONS": {"timeout": 20},
    },
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

CELERY_TIMEZONE = "UTC"
CELERY_BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
CELERY_JOBBERS_CLEANER_INTERVAL = 1
# the dataset tests.integration.proj shares (same Redis, same prefix): its layout
CELERY_JOBBERS_STORE_SHARDS = 16
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
