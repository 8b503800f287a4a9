"""Redis memory per record: ``INFO memory`` ``used_memory`` before and after loading a phase,
per record; ``MEMORY USAGE`` of sampled hashes and of every index split it up. And the
what-if variants: fewer indexes, a longer worker hostname."""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable
from typing import Any

from _common import Load

from cleaner_parts.loader import LOADER, Loader
from cleaner_parts.scenario import LiveWorker
from cleaner_parts.templates import Template


class Memory:
    """What the loaded records cost in Redis."""

    def __init__(self, loader: Loader, load: Load) -> None:
        self.loader = loader
        self.scene = loader.scene
        self.client = loader.scene.client
        self.load = load

    def used_memory(self) -> int:
        return int(self.client.info("memory")["used_memory"])

    def index_keys(self) -> list[str]:
        """Every index a loaded record is in, in every shard (from the templates; no
        keyspace walk)."""
        keys: set[str] = set()
        for t in self.loader.templates.values():
            for key, _, _ in t.zsets:
                for ns in self.scene.ns:
                    moved = t.move(key, ns)
                    keys.update(moved.replace("<<WID>>", w.wid) for w in self.loader.workers)
        return sorted(keys)

    def index_sizes(self) -> dict[str, int]:
        keys = self.index_keys()
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            pipe.memory_usage(key, samples=0)
        return {key: int(n or 0) for key, n in zip(keys, pipe.execute(), strict=True)}

    def sample_sizes(self, ids: list[str], n: int = 200) -> tuple[float, dict[str, int]]:
        of = self.scene.store.keys_of
        sample = random.sample(ids, min(n, len(ids)))
        pipe = self.client.pipeline(transaction=False)
        for task_id in sample:
            pipe.memory_usage(of(task_id).task(task_id), samples=0)
            pipe.object("encoding", of(task_id).task(task_id))
        out = pipe.execute()
        enc: dict[str, int] = {}
        for e in out[1::2]:
            enc[e] = enc.get(e, 0) + 1
        return statistics.mean(out[0::2]), enc

    def load_phase(self, kind: str, count: int) -> dict[str, Any]:
        """Load ``count`` records of ``kind``; what they cost, per record."""
        before_mem, before_idx = self.used_memory(), self.index_sizes()
        with self.load.span():
            seconds, ids = self.loader.load(kind, count)
        after_mem, after_idx = self.used_memory(), self.index_sizes()
        hash_b, enc = self.sample_sizes(ids)
        idx: dict[str, float] = {}
        for key in after_idx:
            short = key.rsplit("}:", 1)[1]  # summed over the shards
            if short.startswith("wtasks:"):
                short = f"wtasks:* ({len(self.loader.workers) * len(self.scene.ns)} keys)"
            idx[short] = idx.get(short, 0.0) + (after_idx[key] - before_idx.get(key, 0)) / count
        idx = {key: v for key, v in idx.items() if v > 0.5}
        per = (after_mem - before_mem) / count
        indexes = sum(idx.values())
        return {
            "records": count, "seconds": seconds, "records_per_s": count / seconds,
            "used_memory_delta": after_mem - before_mem, "bytes_per_record": per,
            "hash_bytes": hash_b, "hash_encodings": enc,
            "index_bytes": indexes, "index_bytes_by_key": idx,
            "other_bytes": per - hash_b - indexes,
        }

    def what_if(self, n: int) -> dict[str, dict[str, Any]]:
        """Memory per completed record with fewer indexes (suggestions), and with a longer
        worker hostname (an EC2-style one: the started history entry then exceeds
        ``hash-max-listpack-value``, 64 B, and the hash is no longer a listpack).

        Each variant loads ``n`` completed records into its own database of the server."""
        import copy

        import redis

        def without(*names: str) -> Callable[[Template], None]:
            def drop(t: Template) -> None:
                t.zsets = [z for z in t.zsets
                           if not any(z[0].startswith(f"{t.ns}:{nm}") for nm in names)]
            return drop

        workers0 = self.loader.workers
        ec2 = [LiveWorker(f"celery@ip-172-31-{i}-{100 + i}.eu-west-1.compute.internal",
                          w.wid) for i, w in enumerate(workers0, start=10)]
        variants: list[tuple[str, list[Callable[[Template], None]], list[LiveWorker] | None]] = [
            ("as written", [], None),
            ("no all index", [without("all")], None),
            ("no all and no name:* index (state index only)", [without("all", "name:")], None),
            (f"worker hostname of {len(ec2[0].hostname)} chars (EC2 style)", [], ec2),
        ]
        out = {}
        base_url = self.scene.srv.url.rsplit("/", 1)[0]
        for db, (label, changes, workers) in enumerate(variants, start=1):
            client = redis.Redis.from_url(f"{base_url}/{db}", decode_responses=True)
            templates = {}
            for key, t in self.loader.templates.items():
                t2 = copy.deepcopy(t)
                for change in changes:
                    change(t2)
                templates[key] = t2
            before = self.used_memory()
            _, ids = self.loader.load("completed", n, templates=templates, workers=workers,
                                      loader=client.register_script(LOADER))
            per = (self.used_memory() - before) / n
            sample = ids[:: max(1, n // 50)]
            encodings = {client.object("encoding", self.scene.store.keys_of(i).task(i))
                         for i in sample}
            out[label] = {"bytes_per_record": per, "hash_encoding": "/".join(sorted(encodings)),
                          "worker": (workers or workers0)[0].hostname}
            client.flushdb()
            client.close()
        return out
