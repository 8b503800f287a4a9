"""The integration app (``tests.integration.proj``) plus a task that takes a password:
``celery -A tests.integration.secrets_proj`` (the raw-publisher redaction tests)."""

from __future__ import annotations

import time

from jobbers_celery import JobbersTask
from tests.integration.proj import _redis, app

__all__ = ["LoginError", "app", "login"]


class LoginError(Exception):
    """Its message hides its argument; Celery's log line shows its ``repr()``."""

    def __str__(self) -> str:
        return "login refused"


@app.task(base=JobbersTask, bind=True, name="secrets.login")
def login(self: JobbersTask, user: str, password: str = "", key: str = "",
          hold: float = 0.0, fail: bool = False) -> str:
    """Writes the password it received to the list ``key``, holds, then fails if asked."""
    _redis().rpush(key, password)
    time.sleep(hold)
    if fail:
        raise LoginError(password)
    return user
