"""The argument search on a real Redis (16 shards) with a real worker: a task published with
``order_id=91800`` is indexed by its own submit step, found by ``Jobbers.search`` and by
``celery jobbers find`` after it completed (its payload gone), a path that is not indexed is
found among the newest records that still hold arguments, a secret is never indexed nor
printed, each value's index keeps its newest entries, and the index goes with its records
(prune and purge)."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
import redis

from jobbers_celery import TaskState
from jobbers_celery.core.search import digest
from tests.conftest import ROOT, RedisServer, Worker, start_worker, subprocess_env
from tests.integration.lifecycle_helpers import wait_state

pytestmark = [pytest.mark.redis]

S = TaskState
CARD = "4111111111111111"
PASSWORD = "hunter22-" + uuid.uuid4().hex[:6]


@pytest.fixture(scope="module")
def search_proj(redis_server: RedisServer) -> Iterator[ModuleType]:
    client = redis.Redis.from_url(redis_server.url())
    client.flushdb()
    yield importlib.import_module("tests.integration.search_proj")
    client.flushdb()
    client.close()


@pytest.fixture(scope="module")
def worker(search_proj: ModuleType, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[Worker]:
    started = start_worker(search_proj.app, "tests.integration.search_proj",
                           tmp_path_factory.mktemp("search"), pool="threads", concurrency=4)
    yield started
    started.kill()


def _key(search_proj: ModuleType, task_id: str, path: str, value: str) -> str:
    store = search_proj.jobbers.store
    return str(store.keys_of(task_id).argument_index(digest(path, value)))


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tests.integration.search_proj", "jobbers",
         *args], cwd=ROOT, env=subprocess_env({"NO_COLOR": "1", "COLUMNS": "250"}), capture_output=True,
        text=True, timeout=180, check=False)
    for secret in (CARD, PASSWORD):
        assert secret not in proc.stdout + proc.stderr
    return proc


@pytest.mark.worker
def test_an_order_number_is_found_after_its_task_completed(search_proj: ModuleType,
                                                           worker: Worker) -> None:
    j = search_proj.jobbers
    ref = f"R-{uuid.uuid4().hex[:8]}"
    done = search_proj.import_order.apply_async(
        (ref,), {"order_id": 91800, "customer": {"id": 5}, "card_number": CARD})
    other = search_proj.import_order.apply_async((f"{ref}-b",), {"order_id": 91801})
    wait_state(j, done.id, S.COMPLETED, worker=worker)
    wait_state(j, other.id, S.COMPLETED, worker=worker)
    client = j.store.client
    raw = client.hgetall(j.store.keys_of(done.id).task(done.id))
    assert "msg" not in raw  # completed: no arguments left to scan
    assert len(raw["ix"].split()) == 3  # order_id, 0 and customer.id; never card_number
    assert client.zscore(_key(search_proj, done.id, "order_id", "91800"), done.id)

    found = j.search("order_id", "91800")
    assert [r.task_id for r in found.tasks] == [done.id]
    assert found.indexed == ("search.import_order",)
    assert [r.task_id for r in j.search("0", ref).tasks] == [done.id]
    assert done.id in {r.task_id for r in j.search("customer.id", "5").tasks}
    assert j.search("order_id", "91800", name="search.ship").tasks == []

    run = cli("find", "--arg", "order_id=91800")
    assert run.returncode == 0, run.stderr
    assert done.id in run.stdout
    assert other.id not in run.stdout
    assert "1 found: indexed argument (for search.import_order)." in run.stdout
    answer = json.loads(cli("find", "--arg", "order_id=91800", "--json").stdout)
    assert [t["task_id"] for t in answer["results"]] == [done.id]
    assert answer["indexed"] == ["search.import_order"]
    for bad in (("--arg", "order_id"), ("--arg", "a b=1"), ("--arg", "card_number=1"),
                ("--arg", "order_id=")):
        refused = cli("find", *bad)
        assert refused.returncode == 2, (bad, refused.stdout, refused.stderr)


def test_a_path_that_is_not_indexed_is_searched_in_the_newest_records(
        search_proj: ModuleType) -> None:
    j = search_proj.jobbers
    # published to a queue no worker reads: their records hold their arguments
    ids = [search_proj.ship.apply_async((f"S-{n % 3}",), queue="search-nobody").id
           for n in range(7)]
    found = j.search("sku", "S-1", name="search.ship")
    assert [r.task_id for r in found.tasks] == [ids[4], ids[1]]
    assert (found.indexed, found.examined, found.of) == ((), 7, 7)
    assert found.how == "searched the arguments of the last 7 of 7 tasks named search.ship"
    run = cli("find", "--arg", "0=S-1", "--name", "search.ship")
    assert run.returncode == 0, run.stderr
    assert ids[4] in run.stdout
    assert "searched the arguments of the last 7 of 7 tasks named search.ship" in run.stdout


def test_a_secret_parameter_is_never_indexed_nor_searched(search_proj: ModuleType) -> None:
    j = search_proj.jobbers
    sent = search_proj.login.apply_async(("ann", PASSWORD), queue="search-nobody")
    raw = j.store.get_raw(sent.id)
    assert raw["ix"].split() == [digest("0", "ann")]  # the user; the password never
    assert PASSWORD not in json.dumps({k: v for k, v in raw.items() if k != "msg"})
    with pytest.raises(ValueError, match="redacted key"):
        j.search("1", PASSWORD, name="search.login")
    assert j.search("1", PASSWORD).tasks == []  # not in any index
    assert [r.task_id for r in j.search("0", "ann").tasks] == [sent.id]


def test_each_value_keeps_its_newest_entries(search_proj: ModuleType,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from jobbers_celery.store import steps

    monkeypatch.setattr(steps, "MAX_PER_VALUE", 3)
    j = search_proj.jobbers
    value = uuid.uuid4().hex[:8]
    # one shard's key holds them all only if their ids share a shard: read them all
    ids = [search_proj.import_order.apply_async((value,), queue="search-nobody").id
           for _ in range(40)]
    kept = sum(j.store.client.zcard(k.argument_index(digest("0", value)))
               for k in j.store.shards.keys)
    assert kept <= 3 * len(j.store.shards.keys)
    assert kept < len(ids)
    newest = {r.task_id for r in j.search("0", value, limit=1000).tasks}
    assert ids[-1] in newest


def test_the_index_goes_with_its_records(search_proj: ModuleType) -> None:
    j = search_proj.jobbers
    value = uuid.uuid4().hex[:8]
    sent = search_proj.import_order.apply_async((value,), {"order_id": value},
                                                queue="search-nobody")
    key = _key(search_proj, sent.id, "order_id", value)
    client: Any = j.store.client
    assert client.zcard(key) == 1
    assert j.cancel(sent.id)  # terminal now
    assert j.store.remove_terminal([sent.id]) == 1  # what prune and purge call
    assert client.exists(key) == 0
    assert client.exists(_key(search_proj, sent.id, "0", value)) == 0
    assert j.search("order_id", value).tasks == []
