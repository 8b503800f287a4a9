"""Unique tasks' locks follow their task on every layout: the cases of unique_cases.py on
1, 4 and 16 shards (real Redis), and concurrent publishers of one key: exactly one wins."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from jobbers_celery.store import RedisStore
from tests.integration.unique_cases import CASES, digest, publish, uq

pytestmark = [pytest.mark.redis]

LAYOUTS = [1, 4, 16]


@pytest.mark.parametrize("shards", LAYOUTS)
@pytest.mark.parametrize("case", CASES, ids=[c.__name__[5:] for c in CASES])
def test_the_lock_follows_its_task(make_store: Any, shards: int,
                                   case: Callable[[RedisStore], None]) -> None:
    case(make_store(prefix=f"uqs{shards}", shards=shards))


@pytest.mark.parametrize("shards", LAYOUTS)
def test_concurrent_publishers_of_one_key_exactly_one_wins(make_store: Any,
                                                          shards: int) -> None:
    """Eight threads, each its own store client, publish the same key under their own
    ids at once, for 20 keys: one record per key, every other publish refused naming it."""
    stores = [make_store(prefix=f"race{shards}", shards=shards) for _ in range(8)]
    barrier = threading.Barrier(len(stores))
    results: dict[int, list[Any]] = {}

    def run(n: int, store: RedisStore) -> None:
        barrier.wait()
        results[n] = [publish(store, f"{key}-{n}", uq(key=str(key))) for key in range(20)]

    threads = [threading.Thread(target=run, args=(n, s)) for n, s in enumerate(stores)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(results) == len(stores)
    for key in range(20):
        outcomes = [results[n][key] for n in range(len(stores))]
        winners = [f"{key}-{n}" for n, r in enumerate(outcomes) if r.applied]
        assert len(winners) == 1, (key, outcomes)
        assert {r.why for r in outcomes if not r.applied} == {f"duplicate:{winners[0]}"}
        assert stores[0].unique_holder(digest(uq(key=str(key)))) == winners[0]
