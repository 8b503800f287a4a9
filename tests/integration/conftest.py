"""Integration-test fixtures and hooks: separate RedisStore clients; worker logs on failure."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from jobbers_celery.store import RedisStore
from tests.integration.store_helpers import store_factory


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.failed and call.when == "call":
        tmp = getattr(item, "funcargs", {}).get("tmp_path")
        if isinstance(tmp, Path):
            for log in sorted(tmp.glob("w-*.log")):
                text = log.read_text(errors="replace")
                report.sections.append((f"worker log {log.name}", text[-20000:]))
    return report


@pytest.fixture
def make_store(redis_url: str) -> Iterator[Callable[..., RedisStore]]:
    """Build separate RedisStore clients on the test database; closed afterwards."""
    with store_factory(redis_url) as make:
        yield make
