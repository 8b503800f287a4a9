"""The Celery app of the TLS and ACL tests (``celery -A tests.integration.tls_proj``).

Broker, result backend and the jobbers store all on one TLS-only Redis, as an ACL user.
``TLS_PROJ_URL`` is ``rediss://user:password@host:port/0`` (query: the CA, see below);
``TLS_PROJ_CA`` is the CA file. ``TLS_PROJ_MODE`` chooses how TLS is configured:

- ``url``: the CA in the URL's query (``?ssl_cert_reqs=required&ssl_ca_certs=...``), which
  kombu, Celery's backend and jobbers (taking the broker's URL) each parse;
- ``settings``: a URL without query, and ``broker_use_ssl``, ``redis_backend_use_ssl``,
  ``jobbers_redis_url`` with ``jobbers_redis_use_ssl``.

The test process builds its own apps with ``make_app``; the worker imports ``app``.
"""

from __future__ import annotations

import os
import ssl
import time
from typing import Any

from celery import Celery

from jobbers_celery import DeadLetterPolicy, JobbersTask, install


class Flaky(Exception):
    pass


def make_app(mode: str, url: str, ca: str) -> Celery:
    """An app whose broker, backend and jobbers store are ``url`` over TLS (see module doc)."""
    app = Celery("tls_proj", set_as_current=False)
    app.conf.update(
        task_serializer="json", accept_content=["json"], result_serializer="json",
        broker_connection_retry_on_startup=True, worker_hijack_root_logger=False,
        jobbers_scheduler_interval=0.2, jobbers_worker_lost_after=3,
        jobbers_cleaner_interval=1, jobbers_cancel_grace=1,
        jobbers_store_shards=16,  # the ACL rule must cover the shards' keys
    )
    if mode == "url":
        app.conf.update(broker_url=url, result_backend=url)
    elif mode == "settings":
        plain = url.split("?", 1)[0]
        tls = {"ssl_cert_reqs": ssl.CERT_REQUIRED, "ssl_ca_certs": ca}
        app.conf.update(broker_url=plain, result_backend=plain, broker_use_ssl=tls,
                        redis_backend_use_ssl=tls, jobbers_redis_url=plain,
                        jobbers_redis_use_ssl={"ssl_cert_reqs": "required",
                                               "ssl_ca_certs": ca})
    else:
        raise ValueError(f"TLS_PROJ_MODE must be url or settings, got {mode!r}")
    install(app)
    _register(app)
    return app


def _register(app: Celery) -> None:
    @app.task(base=JobbersTask, bind=True, name="tls.add", shared=False)
    def add(self: JobbersTask, x: int, y: int) -> int:
        return x + y

    @app.task(base=JobbersTask, bind=True, name="tls.retry_later", shared=False,
              max_retries=1, retry_delay=0.3, backoff_strategy="constant",
              expected_exceptions=(Flaky,))
    def retry_later(self: JobbersTask) -> int:
        """Fails its first attempt with an expected exception: retried after 0.3 s by the
        in-worker scheduler (scheduled -> submitted), then succeeds."""
        if self.attempt == 1:
            raise Flaky("once")
        return self.attempt

    @app.task(base=JobbersTask, bind=True, name="tls.beating", shared=False,
              max_heartbeat_interval=5, max_concurrent=2)
    def beating(self: JobbersTask, seconds: float) -> int:
        """Heartbeats with progress and a checkpoint until cancelled (or ``seconds``)."""
        end = time.monotonic() + seconds
        n = 0
        while time.monotonic() < end:
            n += 1
            self.heartbeat(progress={"n": n}, checkpoint=n)
            time.sleep(0.05)
        return n

    @app.task(base=JobbersTask, bind=True, name="tls.boom", shared=False,
              dead_letter_policy=DeadLetterPolicy.SAVE)
    def boom(self: JobbersTask) -> None:
        raise ValueError("boom")

    @app.task(base=JobbersTask, bind=True, name="tls.frozen", shared=False,
              max_heartbeat_interval=1, dead_letter_policy=DeadLetterPolicy.SAVE)
    def frozen(self: JobbersTask, seconds: float) -> str:
        """Never heartbeats: the cleaner finds it stalled once its interval has passed."""
        time.sleep(seconds)
        return "late"

    @app.task(bind=True, name="tls.plain", shared=False)
    def plain(self: Any, x: int) -> int:
        return x


app: Celery | None = None
if os.environ.get("TLS_PROJ_URL"):
    app = make_app(os.environ.get("TLS_PROJ_MODE", "url"), os.environ["TLS_PROJ_URL"],
                   os.environ.get("TLS_PROJ_CA", ""))
