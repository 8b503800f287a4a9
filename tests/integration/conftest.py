"""Integration-test fixtures: separate RedisStore clients, a plain Redis client."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import redis

from jobbers_celery.store import RedisStore
from tests.integration.store_helpers import store_factory


@pytest.fixture
def make_store(redis_url: str) -> Iterator[Callable[..., RedisStore]]:
    """Build separate RedisStore clients on the test database; closed afterwards."""
    with store_factory(redis_url) as make:
        yield make


@pytest.fixture
def r(redis_url: str) -> Iterator[redis.Redis]:
    """A redis-py client of the test database (strings decoded); closed afterwards."""
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    yield client
    client.close()
