"""``celery -A tests.integration.beat_proj beat``: the test app with a one-second schedule."""

from __future__ import annotations

from tests.integration.proj import app

app.conf.beat_schedule = {
    "add-every-second": {"task": "proj.add", "schedule": 1.0, "args": (20, 22)},
}

__all__ = ["app"]
