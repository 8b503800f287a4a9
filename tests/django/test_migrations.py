"""Migrations are complete (``makemigrations --check``) and apply on PostgreSQL and SQLite."""

from __future__ import annotations

import sqlite3
import subprocess
import sys

import pytest

from tests.conftest import ROOT, subprocess_env


def _django(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "django", *args], check=False, cwd=ROOT, capture_output=True,
        text=True,
        timeout=120, env=subprocess_env({"DJANGO_SETTINGS_MODULE": "tests.django.settings",
                                         **env}),
    )


@pytest.mark.parametrize("database", ["postgresql", "sqlite"])
def test_makemigrations_check_is_clean(database, tmp_path):
    done = _django("makemigrations", "--check", "--dry-run", "jobbers",
                   JOBBERS_TEST_DATABASE=database,
                   JOBBERS_TEST_DB_NAME=str(tmp_path / "x.sqlite3") if database == "sqlite"
                   else "test")
    assert done.returncode == 0, done.stdout + done.stderr


def test_migrate_on_sqlite(tmp_path):
    db = tmp_path / "jobbers.sqlite3"
    done = _django("migrate", "--noinput", JOBBERS_TEST_DATABASE="sqlite",
                   JOBBERS_TEST_DB_NAME=str(db))
    assert done.returncode == 0, done.stdout + done.stderr
    with sqlite3.connect(db) as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        indexes = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='index'")}
    assert {"jobbers_deadletterentry", "jobbers_deadletterfailure", "jobbers_failuregroup",
            "jobbers_deadletteraudit"} <= tables
    assert {"jobbers_dle_name", "jobbers_dle_recent", "jobbers_dle_fp"} <= indexes


@pytest.mark.django_db
def test_postgresql_has_the_list_indexes():
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT indexname FROM pg_indexes WHERE tablename = %s",
                       ["jobbers_deadletterentry"])
        names = {r[0] for r in cursor.fetchall()}
    assert {"jobbers_dle_recent", "jobbers_dle_name", "jobbers_dle_name_ver", "jobbers_dle_queue",
            "jobbers_dle_status", "jobbers_dle_status_name", "jobbers_dle_reason", "jobbers_dle_exc", "jobbers_dle_fp",
            "jobbers_dle_pending"} <= names
