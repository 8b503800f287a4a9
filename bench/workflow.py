#!/usr/bin/env python
"""What recording canvases as workflows costs (no Celery, no worker).

A canvas member's ``submitted`` step also enters it in its workflow's index, maps the ids
that name the workflow (a nested group's, a chord callback's, a chain's last link's) and
checks the workflow's cancel mark, in the same script. This runs the step N times against
a private ``redis-server`` for a task published alone, a group member and a nested member
(three aliases), on one shard and on 16, and prints per step the server time of the script
(``INFO commandstats``), the client's CPU and the requests sent (one per step, whatever the
fields). Then it reads a workflow of N completed members (``Jobbers.workflow``'s store read
and its derivation) at a few limits.

    .venv/bin/python bench/workflow.py            # 5000 steps per case
    .venv/bin/python bench/workflow.py -n 20000
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository: jobbers

import redis
import redis.connection
from _common import PrivateRedis, commandstats, common_options, ping, wait_for

from jobbers_celery.core.states import TaskState
from jobbers_celery.core.workflow import derive
from jobbers_celery.store import RedisStore

S = TaskState
MSG = '{"args":[],"kwargs":{},"options":{"queue":"celery","headers":{}}}'


def cases(task_id: str, group: str) -> dict[str, dict[str, str]]:
    """The extra record fields of each case (what ``core.workflow.links`` gives)."""
    return {
        "alone": {},
        "group member": {"wf": group, "root": task_id, "grp": group},
        "nested member": {"wf": "root-1", "root": "root-1", "par": "root-1", "grp": group,
                          "chd": "callback-1", "end": "last-1", "nxt": "1"},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, default=5000, help="steps per case (default 5000)")
    common_options(ap, json_help=None)
    args = ap.parse_args()
    srv = PrivateRedis(args.redis_server)
    sent = [0]
    original = redis.connection.Connection.send_packed_command

    def counting(self: redis.connection.Connection, *a: object, **kw: object) -> None:
        sent[0] += 1
        original(self, *a, **kw)  # type: ignore[arg-type]

    redis.connection.Connection.send_packed_command = counting  # type: ignore[method-assign]
    try:
        client = redis.Redis(port=srv.port, decode_responses=True)
        wait_for(lambda: ping(client), 10, "redis-server to answer")
        for shards in (1, 16):
            client.flushall()
            store = RedisStore(redis.Redis(port=srv.port, decode_responses=True),
                               prefix=f"b{shards}", shards=shards)
            store.shards  # noqa: B018 - the layout, read once
            group = str(uuid.uuid4())
            for label in ("alone", "group member", "nested member"):
                ids = [str(uuid.uuid4()) for _ in range(args.n)]
                before = commandstats(client)
                sent[0] = 0
                cpu0 = time.process_time()
                for tid in ids:
                    res = store.submit(tid, sources=(S.UNSUBMITTED,), reason="published",
                                       create={"name": "bench.noop", "queue": "celery",
                                               **cases(tid, group)[label]},
                                       fields={"msg": MSG}, name="bench.noop")
                    if not res.applied:
                        raise SystemExit(f"{label} refused: {res}")
                cpu = (time.process_time() - cpu0) / args.n * 1e6
                after = commandstats(client)
                calls, usec = after.get("evalsha", (0, 0))
                c0, u0 = before.get("evalsha", (0, 0))
                print(f"shards={shards:2d} {label:14s} server {(usec - u0) / (calls - c0):5.1f}"
                      f" us/step | client CPU {cpu:5.1f} us/step | requests/step "
                      f"{sent[0] / args.n:.2f}")
            # a workflow of n completed members (the group's), read at a few limits
            ids = [str(i) for k in store.shards.keys
                   for i in client.zrange(k.workflow(group), 0, -1)]
            for tid in ids:
                store.step(tid, S.STARTED, start=True, wid="w1", worker="w@bench")
                store.step(tid, S.COMPLETED, sources=(S.STARTED,), worker="w@bench")
            for limit in (100, 1000, 10000):
                t0 = time.perf_counter()
                read = store.workflow(group, limit)
                t1 = time.perf_counter()
                assert read is not None
                wf = derive(read, datetime.now(UTC))
                t2 = time.perf_counter()
                print(f"shards={shards:2d} workflow of {read.total} members, limit {limit:5d}: "
                      f"store read {(t1 - t0) * 1000:6.1f} ms, derive {(t2 - t1) * 1000:6.1f}"
                      f" ms ({wf.state.value}, {len(wf.members)} members)")
    finally:
        redis.connection.Connection.send_packed_command = original  # type: ignore[method-assign]
        srv.stop()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    raise SystemExit(main())
