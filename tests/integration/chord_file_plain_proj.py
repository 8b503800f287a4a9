"""``celery -A tests.integration.chord_file_plain_proj``: the chord tests' app on plain
``celery.Task``, without jobbers, on a filesystem result backend (see ``chord_build``)."""

from __future__ import annotations

from celery import Task

from tests.integration.chord_build import build, file_backend

app = build("chordpf", Task, tracked=False, backend=file_backend())
