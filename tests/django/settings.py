"""Django settings for the jobbers_django tests (PostgreSQL) and their worker subprocesses.

``JOBBERS_TEST_DATABASE``: ``postgresql`` (default; 127.0.0.1:5432, trust auth) or ``sqlite``.
``JOBBERS_TEST_DB_NAME``: the database a worker subprocess uses (the test database pytest-django
created), so that it writes where the test reads.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

SECRET_KEY = "jobbers-tests-only"
DEBUG = False
ALLOWED_HOSTS = ["*"]
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
]
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "tests.django.urls"
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
STATIC_URL = "/static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast tests only

DATABASES: dict[str, dict[str, Any]]
if os.environ.get("JOBBERS_TEST_DATABASE", "postgresql") == "sqlite":
    DATABASES = {"default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("JOBBERS_TEST_DB_NAME")
        or os.path.join(tempfile.gettempdir(), "jobbers-tests.sqlite3"),
    }}
else:
    DATABASES = {"default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ.get("JOBBERS_TEST_DB_NAME", "jobbers"),
        "USER": os.environ.get("JOBBERS_TEST_DB_USER", "postgres"),
        "HOST": "127.0.0.1",
        "PORT": "5432",
        # another name lets two test sessions run side by side
        "TEST": {"NAME": os.environ.get("JOBBERS_TEST_PG_NAME", "test_jobbers")},
    }}

REST_FRAMEWORK = {
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
}
SPECTACULAR_SETTINGS = {"TITLE": "jobbers test API"}

JOBBERS_CELERY_APP = "tests.django.celery_app.app"
