"""Integration-test fixtures: separate RedisStore clients."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from jobbers_celery.store import RedisStore
from tests.integration.store_helpers import store_factory


@pytest.fixture
def make_store(redis_url: str) -> Iterator[Callable[..., RedisStore]]:
    """Build separate RedisStore clients on the test database; closed afterwards."""
    with store_factory(redis_url) as make:
        yield make
