"""Settings of the jobbers example project.

Read from the environment (the jobbers libraries themselves read none):

``DATABASE_URL``
    ``postgres://user:password@host:5432/dbname`` (``postgresql://`` too; query parameters
    such as ``?sslmode=require`` become connection options) or ``sqlite:////abs/path.db``.
    Default: SQLite in ``$EXAMPLE_VAR_DIR/db.sqlite3``.
``REDIS_URL``
    Broker, result backend and jobbers state. Default ``redis://127.0.0.1:6379/0``;
    ``run.py`` sets it to the Redis it uses or starts.
``EXAMPLE_VAR_DIR``
    Where the SQLite database, logs and beat schedule go. Default ``example_project/var``.
``DJANGO_DEBUG``
    ``0`` turns debug off (the admin's static files are then not served by runserver).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("EXAMPLE_VAR_DIR") or BASE_DIR / "var")
VAR_DIR.mkdir(parents=True, exist_ok=True)  # SQLite and beat's schedule cannot create it


def database_from_url(url: str | None) -> dict[str, Any]:
    """A ``DATABASES["default"]`` from a URL (no extra dependency: ``urllib`` only)."""
    if not url:
        return sqlite(VAR_DIR / "db.sqlite3")
    parts = urlsplit(url)
    if parts.scheme in {"postgres", "postgresql", "pgsql"}:
        name = unquote(parts.path.lstrip("/"))
        if not name:
            raise ImproperlyConfigured(f"DATABASE_URL names no database: {url!r}")
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": name,
            "USER": unquote(parts.username or ""),
            "PASSWORD": unquote(parts.password or ""),
            "HOST": parts.hostname or "",
            "PORT": str(parts.port or ""),
            "OPTIONS": dict(parse_qsl(parts.query)),
        }
    if parts.scheme == "sqlite":
        # sqlite:////abs/path.db (absolute) or sqlite:///rel/path.db (relative to the cwd)
        path = unquote(parts.path)[1:]
        if not path:
            raise ImproperlyConfigured(f"DATABASE_URL names no file: {url!r}")
        return sqlite(Path(path))
    raise ImproperlyConfigured(
        f"DATABASE_URL must start with postgres:// or sqlite://, got {url.split(':', 1)[0]!r}")


def sqlite(path: Path) -> dict[str, Any]:
    return {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": str(path),
        "OPTIONS": {
            # workers, beat and the web server write to the same file: wait for the lock
            # instead of failing, take it at BEGIN (no deadlock on upgrade), and let
            # readers read while one writes
            "timeout": 20,
            "transaction_mode": "IMMEDIATE",
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        },
    }


SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "jobbers-example-not-secret")
DEBUG = os.environ.get("DJANGO_DEBUG", "1") != "0"
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "[::1]"]
USE_TZ = True
TIME_ZONE = "UTC"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "jobbers_django",
    "shop",
]
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]
ROOT_URLCONF = "example.urls"
WSGI_APPLICATION = "example.wsgi.application"
TEMPLATES = [{
    "BACKEND": "django.template.backends.django.DjangoTemplates",
    "DIRS": [],
    "APP_DIRS": True,
    "OPTIONS": {"context_processors": [
        "django.template.context_processors.request",
        "django.contrib.auth.context_processors.auth",
        "django.contrib.messages.context_processors.messages",
    ]},
}]
DATABASES = {"default": database_from_url(os.environ.get("DATABASE_URL"))}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
STATIC_URL = "/static/"
STATIC_ROOT = VAR_DIR / "static"
LOGIN_URL = "/admin/login/"

REST_FRAMEWORK = {
    # the browser (admin login) and curl -u user:password both work
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.SessionAuthentication",
        "rest_framework.authentication.BasicAuthentication",
    ],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
}
SPECTACULAR_SETTINGS = {"TITLE": "jobbers example API"}

# Everything at INFO with a timestamp (jobbers logs what it decides under "jobbers.*").
# Celery workers and beat replace the root handler with their own, same level.
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "[%(asctime)s: %(levelname)s/%(name)s] %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": "INFO"},
}

# ------------------------------------------------------------------ Celery and jobbers
# Loaded by example/celery.py with app.config_from_object(..., namespace="CELERY").
REDIS_URL = os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0"
CELERY_BROKER_URL = REDIS_URL
CELERY_RESULT_BACKEND = REDIS_URL
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TIMEZONE = "UTC"
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")

# Dead letters go to the database, where the admin and the API triage them.
CELERY_JOBBERS_DEAD_LETTER_SINK = "jobbers_django.sink.DjangoDeadLetterSink"
# Its own key namespace, so that a Redis shared with other projects stays apart.
CELERY_JOBBERS_KEY_PREFIX = "jobbers-example"
# Short, so that the example's frozen and killed tasks are caught within seconds. The
# production defaults are 10 s (cleaner, run by celery beat) and 60 s (worker liveness):
# see docs/howto/long-running.md.
CELERY_JOBBERS_CLEANER_INTERVAL = 1
CELERY_JOBBERS_WORKER_LOST_AFTER = 3
CELERY_JOBBERS_SCHEDULER_INTERVAL = 0.2
# The cleaner's beat task on a queue of its own (the main worker consumes it beside celery):
# a burst on the celery queue never holds a pass back (docs/howto/periodic.md).
CELERY_JOBBERS_CLEANER_QUEUE = "jobbers"

# Alerts (docs/howto/alerts.md) link to this admin; with EXAMPLE_ALERT_WEBHOOK set, every
# kind of alert is posted there (a Slack incoming webhook, or a local receiver). Rules can
# also be added in the admin (Jobbers > Alert rules); their emails go to the console here.
CELERY_JOBBERS_ADMIN_URL = os.environ.get("EXAMPLE_ADMIN_URL") or "http://127.0.0.1:8000/admin/"
CELERY_JOBBERS_ALERTS = [
    {"name": f"example-{kind}", "kind": kind, "min_interval": 60,
     "webhooks": [os.environ["EXAMPLE_ALERT_WEBHOOK"]]}
    for kind in ("new_failure_group", "stall", "cleaner_overdue", "periodic_missed",
                 "periodic_late", "store_emptied")
] if os.environ.get("EXAMPLE_ALERT_WEBHOOK") else []
EMAIL_BACKEND = "django.core.mail.backends.console.EmailBackend"

# jobbers_django: which Celery app the admin and the API act through.
JOBBERS_CELERY_APP = "example.celery.app"
