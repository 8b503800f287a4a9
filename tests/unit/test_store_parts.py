"""RedisStore is every part of the store: mypy checks it satisfies each Protocol (an
assignment that would not type-check if a signature drifted), and the test that it binds
each part's functions as its own methods (a call is the function itself: no added layer)."""

from __future__ import annotations

import inspect

import redis

from jobbers_celery.store import (
    CleanerStore,
    ClockStore,
    DeadLetterStore,
    HousekeepingStore,
    LayoutStore,
    MetricsStore,
    PacerStore,
    ReadStore,
    RedisStore,
    RunningStore,
    RunStore,
    SchedulerStore,
    SchedulingStore,
    StepStore,
    TaskStore,
    parts,
)


def _every_part(store: RedisStore) -> list[object]:
    """Each line fails mypy if RedisStore stops satisfying that Protocol."""
    layout: LayoutStore = store
    clock: ClockStore = store
    steps: StepStore = store
    running: RunningStore = store
    reads: ReadStore = store
    housekeeping: HousekeepingStore = store
    scheduling: SchedulingStore = store
    runs: RunStore = store
    scheduler: SchedulerStore = store
    cleaner: CleanerStore = store
    pacer: PacerStore = store
    metrics: MetricsStore = store
    task: TaskStore = store
    dead_letters: DeadLetterStore = store
    return [layout, clock, steps, running, reads, housekeeping, scheduling, runs, scheduler,
            cleaner, pacer, metrics, task, dead_letters]


def _members(protocol: type) -> set[str]:
    return {name for klass in protocol.__mro__ if klass.__module__ == parts.__name__
            for name in vars(klass) if not name.startswith("_")}


def _dead_letters(client: redis.Redis, store: RedisStore) -> DeadLetterStore:
    from jobbers_celery.store.deadletters import RedisDeadLetters

    return RedisDeadLetters(client, store.keys)  # the part alone satisfies it too


def test_redis_store_has_every_member_of_every_part_with_its_signature() -> None:
    store = RedisStore(redis.Redis(port=1))  # never connects here
    assert len(_every_part(store)) == 14
    for name in parts.__all__:
        protocol = getattr(parts, name)
        for member in _members(protocol):
            assert hasattr(RedisStore, member) or member in vars(store), f"{name}.{member}"
            wanted = getattr(protocol, member)
            if inspect.isfunction(wanted):
                mine = inspect.signature(getattr(RedisStore, member))
                theirs = inspect.signature(wanted)
                assert list(mine.parameters)[1:] == list(theirs.parameters)[1:], member
