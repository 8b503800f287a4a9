"""publish_claimed, the one "publish the claimed entries, settle the refused ones" that the
Redis sink's paced runs and the Django sink's resubmits and runs use. No network."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from jobbers_celery import DeadLetter, ResubmitVersion, publish_claimed


def entry(task_id: str) -> DeadLetter:
    return DeadLetter(task_id=task_id, name="n", version=None, queue="q", reason="failed",
                      args=[], kwargs={}, exception_type=None, exception_message=None,
                      traceback=None, attempt=1, retry_attempt=0, worker=None,
                      failed_at=datetime(2026, 1, 1, tzinfo=UTC), checkpoint=None,
                      options={})


def test_published_keys_are_returned_and_refused_ones_settled_once() -> None:
    calls: list[tuple[list[str], bool, ResubmitVersion]] = []
    refused: list[list[int]] = []

    def publish(entries: list[DeadLetter], reset: bool, version: ResubmitVersion) -> list[str]:
        calls.append(([e.task_id for e in entries], reset, version))
        return ["b", "d"]

    claimed = {1: entry("a"), 2: entry("b"), 3: entry("c"), 4: entry("d")}
    went = publish_claimed(claimed, publish, reset_retry_count=False, version="current",
                           refused=refused.append)
    assert went == [2, 4]
    assert refused == [[1, 3]]
    assert calls == [(["a", "b", "c", "d"], False, ResubmitVersion.CURRENT)]


def test_nothing_refused_settles_nothing_and_nothing_claimed_publishes_nothing() -> None:
    refused: list[list[str]] = []
    assert publish_claimed({"m": entry("a")}, lambda es, r, v: ["a"], reset_retry_count=True,
                           version="entry", refused=refused.append) == ["m"]
    assert refused == []

    def never(entries: list[DeadLetter], reset: bool, version: ResubmitVersion) -> list[str]:
        raise AssertionError("nothing to publish")

    assert publish_claimed({}, never, reset_retry_count=True, version="entry",
                           refused=refused.append) == []


def test_a_publish_that_raises_settles_nothing() -> None:
    refused: list[list[str]] = []

    def down(entries: list[DeadLetter], reset: bool, version: ResubmitVersion) -> list[str]:
        raise ConnectionError("broker down")

    with pytest.raises(ConnectionError):
        publish_claimed({"m": entry("a")}, down, reset_retry_count=True, version="entry",
                        refused=refused.append)
    assert refused == []
