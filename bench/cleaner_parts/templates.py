"""Template records: for each task, one record published through Celery (the real
``before_task_publish`` records ``submitted`` with the real ``msg`` payload), then
``JobbersTask``'s own ``_start``, ``heartbeat`` and ``_complete`` under a pushed request as
in worker 0; read back (hash, every index that holds it, TTL) and generalised into what the
loader writes per copy."""

from __future__ import annotations

import contextlib
import json
import random
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from cleaner_parts.scenario import BATCH, FETCH, HB_INTERVAL_S, LiveWorker, Scene, ns_of

#: Marks: the per-record times a template field, history entry or index score derives from.
MARKS = ("sub", "start", "hb", "done")
M_SUB, M_START, M_HB, M_DONE = range(4)
#: Record fields that hold a mark's absolute time (ms).
MARK_FIELDS = {"sub_at": M_SUB, "start_at": M_START, "hb_at": M_HB, "done_at": M_DONE}


@dataclass
class Template:
    """One real record, generalised: what the loader writes per copy."""

    kind: str  # completed / running
    name: str
    task_id: str
    worker: LiveWorker
    marks: list[int]
    #: The namespace (``{tag}``) of the template's shard: every key in ``zsets`` starts with it.
    ns: str = ""
    fields: list[list[Any]] = field(default_factory=list)
    zsets: list[list[Any]] = field(default_factory=list)
    ttl: int = 0
    raw_hash: dict[str, str] = field(default_factory=dict)
    raw_zsets: dict[str, float] = field(default_factory=dict)

    @property
    def history(self) -> list[str]:
        return [self.raw_hash[f"h{n}"] for n in range(1, int(self.raw_hash.get("hn", 0)) + 1)]

    def spec(self, ns: str) -> str:
        """The loader's template for copies in the shard whose namespace is ``ns``: the
        template's own shard tag replaced by that one in every key (never in a field)."""
        return json.dumps({"task": f"{ns}:task:", "fields": self.fields,
                           "zsets": [[self.move(z[0], ns), *z[1:]] for z in self.zsets],
                           "ttl": self.ttl})

    def move(self, key: str, ns: str) -> str:
        """``key`` of the template's shard, in the shard whose namespace is ``ns``."""
        if not key.startswith(self.ns + ":"):
            raise RuntimeError(f"{key} is not in the template's shard {self.ns}")
        return ns + key[len(self.ns):]

    def generalise(self, text: str) -> str:
        return (text.replace(self.worker.wid, "<<WID>>")
                .replace(self.worker.hostname, "<<WORKER>>")
                .replace(self.task_id, "<<ID>>"))


def index_keys_now(scene: Scene) -> list[str]:
    """Every index of the store (SCAN). Template phase only, on this benchmark's private,
    nearly empty server: discover which indexes the real code wrote instead of assuming the
    layout (SCAN, like anything that walks a keyspace; the library itself never does); every
    shard's and the global keys (``{<prefix>`` starts all of them)."""
    match = "{" + scene.keys.prefix + "*"
    return sorted(set(scene.client.scan_iter(match=match, count=1000, _type="zset")))


class TemplateMaker:
    """Runs the real code for each (kind, task) in worker ``w`` and reads the result back."""

    def __init__(self, scene: Scene) -> None:
        self.scene = scene

    def _publish(self, name: str) -> str:
        """Publish through Celery: the real ``before_task_publish`` records ``submitted``."""
        task_id = str(uuid.uuid4())
        task = self.scene.tasks[name]
        if name == FETCH:
            task.apply_async(
                args=[f"https://files.example.com/exports/{task_id}.csv"],
                kwargs={"timeout": 30, "tags": ["sync", "nightly"]}, task_id=task_id)
        else:
            task.apply_async(
                args=[random.randint(10**5, 10**6), "s3://bench-data/incoming/2026-11"],
                kwargs={"options": {"dedupe": True, "chunk": 500}}, task_id=task_id)
        return task_id

    @contextlib.contextmanager
    def _as_worker(self, name: str, task_id: str, w: LiveWorker) -> Iterator[Any]:
        """``JobbersTask``'s own methods, as they run in worker ``w`` for ``task_id``."""
        from jobbers_celery.lifecycle import liveness

        task = self.scene.tasks[name]
        saved = liveness._wid
        liveness._wid = w.wid  # what liveness.worker_id() returns in that worker
        task.push_request(id=task_id, hostname=w.hostname, called_directly=False,
                          is_eager=False, retries=0, delivery_info={})
        try:
            yield task
        finally:
            task.pop_request()
            liveness._wid = saved

    def make(self, w: LiveWorker) -> dict[tuple[str, str], Template]:
        templates = {}
        for kind in ("completed", "running"):
            for name in (FETCH, BATCH):
                task_id = self._publish(name)
                time.sleep(0.003)  # distinct times, so each field maps to one mark
                with self._as_worker(name, task_id, w) as task:
                    task._start()  # the start step, exactly as a worker makes it
                    if not task.attempt:
                        raise RuntimeError(f"template start step failed for {name}")
                    time.sleep(0.003)
                    if name == FETCH:  # a heartbeating task heartbeats
                        task.heartbeat()
                        time.sleep(0.003)
                    if kind == "completed":
                        task._complete(None)  # the completion step (no result backend)
                templates[kind, name] = self._read(kind, name, task_id, w)
        # the templates' messages: nobody consumes them; start the queues empty
        self.scene.client.delete("io", "celery")
        return templates

    @staticmethod
    def _mark_of(marks: list[int], at: int, what: str) -> int:
        if at not in marks:
            raise RuntimeError(f"{what}: time {at} is none of the marks {marks}")
        return marks.index(at)

    def _read(self, kind: str, name: str, task_id: str, w: LiveWorker) -> Template:
        scene = self.scene
        client = scene.client
        k = scene.store.keys_of(task_id)  # the template's shard
        raw = client.hgetall(k.task(task_id))
        start = int(raw["start_at"])
        marks = [int(raw["sub_at"]), start, int(raw.get("hb_at") or start),
                 int(raw.get("done_at") or 0)]
        t = Template(kind, name, task_id, w, marks, ns=ns_of(k), raw_hash=raw)
        for f, v in raw.items():
            if f in MARK_FIELDS:
                t.fields.append([f, "", MARK_FIELDS[f], 0, 0])
            elif f[:1] == "h" and f[1:].isdigit():
                # <to>|<ms since sub_at>|<attempt>|<worker or =>|<reason>: the delta is
                # recomputed from the copy's own marks (so it agrees with its start_at ...)
                to, delta, attempt, worker, reason = v.split("|", 4)
                mark = self._mark_of(marks, marks[M_SUB] + int(delta), f"{kind} {name} {f}")
                text = "|".join([to, "<<T>>", attempt, t.generalise(worker),
                                 t.generalise(reason)])
                t.fields.append([f, text, mark, 0, 1])
            else:
                if any(str(m) in v for m in marks if m):
                    raise RuntimeError(f"{kind} {name} field {f} holds one of the record's "
                                       f"times, which the loader would not shift: {v!r}")
                t.fields.append([f, t.generalise(v), -1, 0, 0])
        for key in index_keys_now(scene):
            score = client.zscore(key, task_id)
            if score is None:
                continue
            if not key.startswith(t.ns + ":"):
                raise RuntimeError(f"{kind} {name}: {key} holds the template, outside its "
                                   f"shard {t.ns}; the loader writes in one shard")
            t.raw_zsets[key] = score
            if key == k.heartbeat_due:
                mark, add = M_HB, int(score) - marks[M_HB]
                assert add == HB_INTERVAL_S * 1000, (key, add)
            else:
                mark, add = self._mark_of(marks, int(score), f"{kind} {name} in {key}"), 0
            t.zsets.append([t.generalise(key), mark, add])
        ttl = client.ttl(k.task(task_id))
        if kind == "completed":
            t.ttl = scene.store.retention_s + 3600  # what the step sets (retention + slack)
            assert abs(ttl - t.ttl) <= 2, (ttl, t.ttl)
        else:
            assert ttl == -1, ttl
        return t
