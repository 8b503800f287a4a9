"""The Celery app of the rate-limit tests (``celery -A tests.integration.rate_proj``):
broker, results and state on ``RATE_PROJ_URL`` (default ``JOBBERS_TEST_REDIS_URL``; broker and
results on ``RATE_PROJ_BROKER`` if set), with
``RATE_PROJ_SHARDS`` shards under the prefix ``RATE_PROJ_PREFIX``. ``rl.call`` is limited
to 4 starts a second per ``account``; its body only returns. A test process builds the same
app on its own server with :func:`build`."""

from __future__ import annotations

import os

from celery import Celery

from jobbers_celery import JobbersTask, RateLimit, install
from tests.testapp import make_app

RATE = "4/s"


def build(url: str, shards: int, prefix: str, broker: str | None = None) -> Celery:
    """The app: its jobbers store on ``url``, its broker and results there too, or on
    ``broker`` (a test that restarts the store keeps its messages apart)."""
    app = make_app("rate_proj", url, broker=broker, backend=broker,
                   jobbers_store_shards=shards, jobbers_key_prefix=prefix,
                   jobbers_scheduler_interval=0.05)
    install(app)

    @app.task(base=JobbersTask, name="rl.call", rate_limit_by=RateLimit(RATE, on="account"),
              shared=False)
    def call(account: str, n: int) -> int:
        return n

    @app.task(base=JobbersTask, name="rl.plain", shared=False)
    def plain(n: int) -> int:
        """No rate_limit_by: an override of its name would never apply."""
        return n

    return app


_URL = os.environ.get("RATE_PROJ_URL") or os.environ.get("JOBBERS_TEST_REDIS_URL")
if _URL:  # a worker's (the tests import build() before any server is known)
    app = build(_URL, int(os.environ.get("RATE_PROJ_SHARDS", "1")),
                os.environ.get("RATE_PROJ_PREFIX", "rl"), os.environ.get("RATE_PROJ_BROKER"))
