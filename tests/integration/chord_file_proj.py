"""``celery -A tests.integration.chord_file_proj``: the chord tests' app with jobbers on a
filesystem result backend (chords joined by ``celery.chord_unlock`` polls; see
``chord_build``)."""

from __future__ import annotations

from jobbers_celery import JobbersTask
from tests.integration.chord_build import build, file_backend

app = build("chordjf", JobbersTask, tracked=True, backend=file_backend())
