"""A dead letter that neither the sink nor Redis takes outlives its worker: kept on local disk,
delivered once by the next worker on the machine, never logged in clear (real workers)."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
import redis

from jobbers_celery.deadletter.spool import DeadLetterSpool, spool_directory
from tests.conftest import start_worker, wait_for
from tests.integration import spool_proj
from tests.integration.topology_servers import restartable_redis

pytestmark = pytest.mark.redis

CARD = "card-4111-9f2c7a"
TOKEN = "tok-live-7d1e0b5a"


def _answers(url: str) -> bool:
    client = redis.Redis.from_url(url, socket_connect_timeout=0.5, socket_timeout=0.5)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


def _logs(directory: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in directory.glob("w-*.log"))


@pytest.mark.parametrize("exit_by", ["warm shutdown", "SIGKILL"])
def test_dead_letter_outlives_sink_and_redis_outage_and_worker_exit(
        redis_url: str, tmp_path: Path, exit_by: str) -> None:
    gate = tmp_path / "gate"
    gate.mkdir()
    root = tmp_path / "spool"
    with restartable_redis() as store:
        app = spool_proj.build(redis_url, store.url(), str(root))
        env = {"SPOOL_PROJ_BROKER": redis_url, "SPOOL_PROJ_STORE": store.url(),
               "SPOOL_PROJ_DIR": str(root), "SPOOL_PROJ_GATE": str(gate)}
        spool = DeadLetterSpool(spool_directory(str(root), "jobbers", store.url()))

        # the sink is down; Redis goes away while the worker writes the dead letter
        (gate / "broken").touch()
        first = start_worker(app, "tests.integration.spool_proj", tmp_path, concurrency=1,
                             env=env)
        try:
            task_id = app.tasks["spool.charge"].delay(CARD, token=TOKEN).id
            wait_for(lambda: (gate / f"writing-{task_id}").exists(), timeout=30,
                     message="the worker to write the dead letter")
            store.server.stop()  # SIGTERM: Redis flushes its AOF (the failed step) and exits
            wait_for(lambda: not _answers(store.url()), timeout=10, message="Redis to stop")
            (gate / "go").touch()
            [path] = wait_for(spool.paths, timeout=30, message="the entry in the spool")
            assert stat.S_IMODE(path.stat().st_mode) == 0o600
            assert stat.S_IMODE(spool.directory.stat().st_mode) == 0o700
            # the file is there before the line that names it: SIGKILL waits for that line
            wait_for(lambda: "spool file" in _logs(tmp_path), timeout=30,
                     message="the log line naming the spool file")
        finally:
            if exit_by == "SIGKILL":
                first.kill()
            else:
                first.stop(timeout=60)
        # the worker is gone; its dead letter is not
        [path] = spool.paths()
        [kept] = [json.loads(line) for line in path.read_text().splitlines()]
        assert kept["task_id"] == task_id
        assert kept["args"] == [CARD]

        # Redis and the sink are back: the next worker on this machine delivers it
        store.restart()
        (gate / "broken").unlink()
        second = start_worker(app, "tests.integration.spool_proj", tmp_path, concurrency=1,
                              env=env)
        try:
            stored = gate / "stored"
            wait_for(lambda: stored.is_dir() and list(stored.iterdir()), timeout=30,
                     message="the entry in the sink")
            wait_for(lambda: not spool.paths(), timeout=30, message="the spool to empty")
            [entry_file] = list(stored.iterdir())
            entry = json.loads(entry_file.read_text())
            assert entry_file.name == f"{task_id}-{entry['attempt']}.json"
            assert entry["args"] == [CARD]
            assert entry["kwargs"] == {"token": TOKEN}
            assert entry["exception_message"] == "card declined"
            client = redis.Redis.from_url(store.url(), decode_responses=True)
            try:
                assert client.llen(app._jobbers.store.keys.dead_letter_outbox) == 0
            finally:
                client.close()
            record = app._jobbers.get(task_id)
            assert record is not None
            assert record.state.value == "failed"
        finally:
            second.stop(timeout=60)

        writes = (gate / "writes").read_text().splitlines()
        print(f"\n{exit_by}: sink write calls for the entry: {len(writes)} "
              f"(stored once); spool file {path.name}")
        logs = _logs(tmp_path)
        assert task_id in logs
        assert "spool file" in logs
        for secret in (CARD, TOKEN):
            assert secret not in logs
