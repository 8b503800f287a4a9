"""The shards' hash tags and which shard holds a task (pure: no Redis)."""

from __future__ import annotations

import zlib

import pytest
import redis
from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

from jobbers_celery.core.config import MAX_SHARDS, JobbersConfig
from jobbers_celery.core.errors import ConfigurationError
from jobbers_celery.store.keys import Keys, Shards, shard_tags


@pytest.mark.parametrize("count", [2, 3, 16, 64, 256])
def test_each_shard_tag_falls_in_its_own_equal_slot_range(count: int) -> None:
    tags = shard_tags("jobbers", count)
    assert len(set(tags)) == count
    for i, tag in enumerate(tags):
        assert tag.startswith(f"jobbers.{i}.")
        slot = key_slot(tag.encode())
        assert slot * count // REDIS_CLUSTER_HASH_SLOTS == i, (tag, slot)
        # every key of the shard hashes on the tag alone
        assert key_slot(Keys("jobbers", tag).task("x").encode()) == slot


def test_one_shard_is_the_global_tag_of_datasets_written_before_shards() -> None:
    shards = Shards("jobbers", 1)
    assert len(shards.keys) == 1
    assert shards.keys[0].epoch == Keys("jobbers").epoch == "{jobbers}:epoch"
    assert shards.of("any").task("t1") == "{jobbers}:task:t1"
    assert shards.index("whatever") == 0


def test_a_task_is_in_shard_crc32_of_its_id_modulo_s_and_they_spread() -> None:
    shards = Shards("jobbers", 16)
    ids = [f"id-{i}" for i in range(1600)]
    for task_id in ids[:50]:
        assert shards.index(task_id) == zlib.crc32(task_id.encode()) % 16
        assert shards.of(task_id).task(task_id).startswith(
            "{" + shard_tags("jobbers", 16)[shards.index(task_id)] + "}:task:")
    per = [sum(1 for t in ids if shards.index(t) == i) for i in range(16)]
    assert min(per) > 60, per  # 100 each on average


@pytest.mark.parametrize("value", [0, -1, MAX_SHARDS + 1, 2.5, "16", True])
def test_the_setting_must_be_a_whole_number_in_range(value: object) -> None:
    with pytest.raises(ConfigurationError, match="jobbers_store_shards must be a whole number"):
        JobbersConfig(redis_url="redis://h", store_shards=value).validate()  # type: ignore[arg-type]


def test_the_setting_defaults_to_the_datasets_own() -> None:
    assert JobbersConfig.from_mapping({}, "redis://h").store_shards is None
    assert JobbersConfig.from_mapping({"jobbers_store_shards": 4}, "redis://h").store_shards == 4


class _CrossSlotRefusingScript:
    """A scan script behind an endpoint that refuses several slots in one script."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def __call__(self, keys: list[str], args: list[str]) -> list[str]:
        self.calls.append(keys)
        raise redis.ResponseError("CROSSSLOT Keys in request don't hash to the same slot")

    def many(self, calls: list[tuple[list[str], list[str]]]) -> list[list[str]]:
        self.calls += [keys for keys, _ in calls]
        return [[keys[0]] for keys, _ in calls]


def test_a_scan_falls_back_to_one_shard_per_call_where_one_call_may_not_span_slots() -> None:
    from jobbers_celery.store import RedisStore

    store = RedisStore(redis.Redis(port=1), shards=2)  # never connects here
    script = _CrossSlotRefusingScript()
    per_shard = [["{a}:x", "{a}:y"], ["{b}:x", "{b}:y"]]
    assert store._scan(script, per_shard, []) == ["{a}:x", "{b}:x"]  # type: ignore[arg-type]
    assert store._scan(script, per_shard, []) == ["{a}:x", "{b}:x"]  # type: ignore[arg-type]
    # the one refused call spanning both, then one call per shard, twice
    assert script.calls == [["{a}:x", "{a}:y", "{b}:x", "{b}:y"], *per_shard, *per_shard]
