"""Django settings of ``bench/dlq.py`` (benchmark scaffolding, not library code).

A project as a user would set one up: admin, sessions, auth, Django REST framework,
drf-spectacular and ``jobbers_django``, PostgreSQL on 127.0.0.1:5432 (trust auth). ``dlq.py``
sets the environment before Django starts:

``BENCH_DLQ_DB``
    the benchmark's own database (default ``jobbers_bench``; ``dlq.py`` creates it).
``BENCH_REDIS_URL``
    the private Redis of the run (broker and jobbers store), read by ``dlq_app``.
"""

from __future__ import annotations

import os

SECRET_KEY = "jobbers-bench-only"
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
ROOT_URLCONF = "dlq_urls"
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
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # the bench user only

DATABASES = {"default": {
    "ENGINE": "django.db.backends.postgresql",
    "NAME": os.environ.get("BENCH_DLQ_DB", "jobbers_bench"),
    "USER": "postgres",
    "HOST": "127.0.0.1",
    "PORT": "5432",
    # a production site keeps its connections (or pools them); Django's test Client keeps
    # the connection between requests anyway
    "CONN_MAX_AGE": 600,
}}

REST_FRAMEWORK = {
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
}
SPECTACULAR_SETTINGS = {"TITLE": "jobbers bench API"}

JOBBERS_CELERY_APP = "dlq_app.app"
