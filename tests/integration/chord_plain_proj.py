"""``celery -A tests.integration.chord_plain_proj``: the chord tests' app on plain
``celery.Task``, without jobbers (see ``chord_build``)."""

from __future__ import annotations

from celery import Task

from tests.integration.chord_build import build

app = build("chordp", Task, tracked=False)
