"""What docs/howto/redis-settings.md says about a paused Redis ("A paused Redis"): a store
connection made from a ``jobbers_redis_url`` without ``socket_timeout`` has redis-py's own
default, 5 s from redis-py 8 on and none (a step blocks until the server resumes) before;
one the URL sets is used as is. No server needed: the connection is built, never opened."""

from __future__ import annotations

import redis

from jobbers_celery.core.config import JobbersConfig
from jobbers_celery.store.connect import redis_client


def _socket_timeout(url: str) -> float | None:
    pool = redis_client(JobbersConfig(redis_url=url)).connection_pool
    connection = pool.connection_class(**pool.connection_kwargs)
    timeout: float | None = connection.socket_timeout
    return timeout


def test_without_socket_timeout_a_connection_has_redis_pys_default() -> None:
    major = int(redis.__version__.split(".")[0])
    expected = 5 if major >= 8 else None  # as the page says, per redis-py version
    assert _socket_timeout("redis://127.0.0.1:1/0") == expected


def test_a_socket_timeout_in_the_url_is_used() -> None:
    assert _socket_timeout("redis://127.0.0.1:1/0?socket_timeout=1.5") == 1.5
