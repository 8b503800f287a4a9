"""``celery -A tests.integration.chord_proj``: the chord tests' app with jobbers (see
``chord_build``)."""

from __future__ import annotations

from jobbers_celery import JobbersTask
from tests.integration.chord_build import build

app = build("chordj", JobbersTask, tracked=True)
