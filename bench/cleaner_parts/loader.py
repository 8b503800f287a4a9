"""The load: a Lua loader writes 1,000 copies of a template per call (one ``HSET`` of the
final fields, ``EXPIRE``, ``ZADD`` per index) with fresh ids, workers and times, each call
into one shard; and the check, before anything is loaded, that a copy made with a template's
own times is that template."""

from __future__ import annotations

import json
import random
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from cleaner_parts.scenario import BATCH, DAY_MS, FETCH, LiveWorker, Scene, Stalls
from cleaner_parts.templates import Template, index_keys_now

# The loader: one call writes a batch of records from a template (see Template).
# ARGV[1] template JSON: task (key prefix), fields {{name, text, mark, add, rel}} (mark -1:
# text with <<ID>>/<<WORKER>>/<<WID>> placeholders; else T = the mark's time + add, minus the
# record's sub time when rel is 1 (history deltas), and the value is T, or text with <<T>>
# for it), zsets {{key text, mark, add}}, ttl (s, counted from the done mark; 0: none)
# ARGV[2] batch JSON: now, subst {WORKER, WID}, recs {{id, sub, start, hb, done}}
LOADER = r"""
local t = cjson.decode(ARGV[1])
local b = cjson.decode(ARGV[2])
local now = tonumber(b.now)
local function esc(v) return (string.gsub(v, '%%', '%%%%')) end
local function fill(s)  -- the batch's worker (same for every record of the batch)
  for k, v in pairs(b.subst) do s = string.gsub(s, '<<' .. k .. '>>', esc(v)) end
  return s
end
local fields, zkeys, zs = {}, {}, {}
for i, f in ipairs(t.fields) do
  fields[i] = {f[1], fill(f[2]), f[3] + 2, f[4], f[5] == 1,
               string.find(f[2], '<<ID>>', 1, true)}
end
for i, z in ipairs(t.zsets) do zkeys[i] = fill(z[1]); zs[i] = {} end
local function num(x) return string.format('%.0f', x) end
for _, r in ipairs(b.recs) do
  local id = r[1]
  local task = t.task .. id
  local w = {}
  for _, f in ipairs(fields) do
    w[#w + 1] = f[1]
    if f[3] >= 2 then
      local v = r[f[3]] + f[4]
      if f[5] then v = v - r[2] end
      if f[2] == '' then w[#w + 1] = num(v)
      else w[#w + 1] = (string.gsub(f[2], '<<T>>', num(v))) end
    elseif f[6] then w[#w + 1] = (string.gsub(f[2], '<<ID>>', esc(id)))
    else w[#w + 1] = f[2] end
  end
  redis.call('HSET', task, unpack(w))
  if t.ttl > 0 then
    redis.call('EXPIRE', task, t.ttl - math.floor((now - r[5]) / 1000))
  end
  for i, z in ipairs(t.zsets) do
    local a = zs[i]
    a[#a + 1] = num(r[z[2] + 2] + z[3]); a[#a + 1] = id
  end
end
for i, key in ipairs(zkeys) do
  local a = zs[i]
  for j = 1, #a, 1000 do redis.call('ZADD', key, unpack(a, j, math.min(j + 999, #a))) end
end
return #b.recs
"""


def marks_of(kind: str, name: str, now: int) -> list[int]:
    """A copy's times: sub, start, hb, done (0 while running)."""
    r = random.random
    if kind == "completed":  # finished within the last 6 days (retention is 7)
        sub = now - int(r() * 6 * DAY_MS) - 60_000
        start = sub + 5 + int(r() * 2000)
        done = start + 10 + int(r() * 30_000)
        hb = start + int((done - start) * r()) if name == FETCH else start
        return [sub, start, hb, done]
    if name == FETCH:  # running, heartbeat within the last 30 s (deadline 270-300 s away)
        sub = now - 60_000 - int(r() * 3_600_000)
        start = sub + 5 + int(r() * 5000)
        return [sub, start, now - int(r() * 30_000), 0]
    sub = now - 60_000 - int(r() * 3_600_000)
    start = sub + 5 + int(r() * 5000)
    return [sub, start, start, 0]


def batch_spec(w: LiveWorker, recs: list[list[Any]], now: int) -> str:
    return json.dumps({"now": now, "subst": {"WORKER": w.hostname, "WID": w.wid},
                       "recs": recs})


class Loader:
    """Copies of the templates, by the batch, over the shards, names and ``workers``; the
    running copies it loads are the live tasks ``stalls`` takes from."""

    def __init__(self, scene: Scene, stalls: Stalls, workers: list[LiveWorker]) -> None:
        self.scene = scene
        self.stalls = stalls
        self.script = scene.client.register_script(LOADER)
        self.workers = workers
        self.templates: dict[tuple[str, str], Template] = {}
        #: Fresh uuid4s bucketed by shard: a loader batch writes into one shard, so its
        #: ids must all belong to it (none is thrown away, see ``ids_in``).
        self._pools: list[list[str]] = [[] for _ in scene.ns]

    def ids_in(self, shard: int, n: int) -> list[str]:
        """``n`` fresh uuid4s of ``shard`` (those of other shards wait in their pools)."""
        index, pools = self.scene.store.shards.index, self._pools
        pool = pools[shard]
        while len(pool) < n:
            task_id = str(uuid.uuid4())
            pools[index(task_id)].append(task_id)
        out = pool[len(pool) - n:]
        del pool[len(pool) - n:]
        return out

    def copy(self, t: Template, w: LiveWorker, recs: list[list[Any]], shard: int) -> int:
        """Copies of ``t`` in ``shard`` (the shard of every id in ``recs``)."""
        return int(self.script(args=[t.spec(self.scene.ns[shard]),
                                     batch_spec(w, recs, self.scene.now_ms())]))

    def load(self, kind: str, count: int, names: tuple[str, ...] = (FETCH, BATCH),
             workers: list[LiveWorker] | None = None,
             templates: dict[tuple[str, str], Template] | None = None,
             loader: Any = None) -> tuple[float, list[str]]:
        """Load ``count`` records of ``kind``, split evenly between the shards, ``names``
        and ``workers``: each batch (loader call) writes into one shard, with ids of that
        shard; consecutive batches go to the next shard, then the next name, then the next
        worker.

        The next batch is built in a thread while Redis runs the current one."""
        workers = workers or self.workers
        templates = templates or self.templates
        loader = loader or self.script
        ns = self.scene.ns
        shards = len(ns)
        # at most an even share per (shard, name, worker), so that a small count still
        # reaches every one (``--running`` not above ``--batch`` left one name without records)
        batch = min(self.scene.args.batch,
                    max(1, -(-count // (shards * len(names) * len(workers)))))
        ids: list[str] = []
        started = time.perf_counter()
        now0 = self.scene.now_ms()

        def build(i: int) -> tuple[str, list[str], str, str]:
            n = min(batch, count - i)
            b = i // batch
            shard = b % shards
            name = names[(b // shards) % len(names)]
            w = workers[(b // shards // len(names)) % len(workers)]
            now = now0 + int((time.perf_counter() - started) * 1000)
            recs = [[task_id, *marks_of(kind, name, now)]
                    for task_id in self.ids_in(shard, n)]
            return (name, [r[0] for r in recs], templates[kind, name].spec(ns[shard]),
                    batch_spec(w, recs, now))

        with ThreadPoolExecutor(1) as pool:
            nxt = pool.submit(build, 0)
            for i in range(0, count, batch):
                name, batch_ids, template, spec = nxt.result()
                if i + batch < count:
                    nxt = pool.submit(build, i + batch)
                loader(args=[template, spec])
                if kind == "running" and templates is self.templates:
                    self.stalls.running[name].extend(batch_ids)
                ids.extend(batch_ids)
        return time.perf_counter() - started, ids

    def check_fidelity(self) -> list[str]:
        """A copy of each template with the template's own times must equal it. The copy
        goes into another shard than the template's when there are several (one whose tag
        is as long, so the key names, and so ``MEMORY USAGE``, can be equal): the loader's
        move of the keys to the batch's shard is checked too."""
        client, ns = self.scene.client, self.scene.ns
        shards = self.scene.store.shards
        lines = []
        for (kind, name), t in self.templates.items():
            home = shards.index(t.task_id)
            others = [s for s in range(shards.count)
                      if s != home and len(ns[s]) == len(ns[home])]
            shard = others[0] if others else home
            cid = self.ids_in(shard, 1)[0]
            tk, ck = shards.keys[home], shards.keys[shard]
            self.copy(t, t.worker, [[cid, *t.marks]], shard)
            try:
                got = client.hgetall(ck.task(cid))
                want = {f: v.replace(t.task_id, cid) for f, v in t.raw_hash.items()}
                problems = []
                enc = (client.object("encoding", tk.task(t.task_id)),
                       client.object("encoding", ck.task(cid)))
                if got != want or (enc[1] == "listpack" and list(got) != list(want)):
                    problems.append(f"hash differs: {got} != {want}")
                zs = {key: client.zscore(key, cid) for key in index_keys_now(self.scene)}
                want_zs = {t.move(key, ns[shard]): s for key, s in t.raw_zsets.items()}
                if {key: s for key, s in zs.items() if s is not None} != want_zs:
                    problems.append(f"indexes differ: {zs} != {want_zs}")
                if enc[0] != enc[1]:
                    problems.append(f"encoding differs: {enc}")
                size = (client.memory_usage(tk.task(t.task_id), samples=0),
                        client.memory_usage(ck.task(cid), samples=0))
                if size[0] != size[1]:
                    problems.append(f"MEMORY USAGE differs: {size[0]} != {size[1]}")
                ttl = client.ttl(tk.task(t.task_id)), client.ttl(ck.task(cid))
                if abs(ttl[0] - ttl[1]) > 2:
                    problems.append(f"TTL differs: {ttl}")
                if problems:
                    raise RuntimeError(f"loader fidelity check failed for the {kind} {name} "
                                       "template:\n  " + "\n  ".join(problems))
                expected = {"completed": "listpack", "running": "hashtable"}[kind]
                note = "" if enc[0] == expected else f" (expected {expected})"
                where = (f"; copy in shard {shard}, template in {home}" if shard != home
                         else "")
                lines.append(
                    f"{kind:<9} {name:<20} hash {enc[0]}{note} {size[0]} B, {len(t.raw_hash)} "
                    f"fields, {len(t.history)} history entries, {len(t.zsets)} index entries, "
                    f"TTL {'none' if ttl[0] < 0 else f'{ttl[0]} s'}{where}: identical")
                lines.append(f"{'':<10}fields: {' '.join(t.raw_hash)}")
                lines.append(f"{'':<10}history: {'  '.join(t.history)}")
            finally:
                client.delete(ck.task(cid))
                for key in index_keys_now(self.scene):
                    client.zrem(key, cid)
        return lines
