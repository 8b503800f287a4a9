"""What ``overhead.py`` measures: a no-op task in plain Celery (the baseline), with
``task_track_started`` (Celery's own extra write, for scale) and as a ``JobbersTask`` (the
defaults, the result write folded, the sharded layout), on a prefork and a solo worker."""

from __future__ import annotations

from dataclasses import dataclass

POOLS = ("prefork", "solo")


@dataclass(frozen=True)
class Variant:
    name: str
    module: str
    env: dict[str, str]
    what: str


def variants(result_url: str) -> dict[str, Variant]:
    return {v.name: v for v in (
        Variant("plain", "bench_plain", {}, "plain Celery, no jobbers in the app"),
        Variant("track_started", "bench_plain", {"BENCH_TRACK_STARTED": "1"},
                "plain Celery, task_track_started=True"),
        Variant("jobbers", "bench_app", {},
                "JobbersTask, defaults (jobbers on db 0, results on db 1; one shard)"),
        Variant("jobbers_sharded", "bench_app",
                {"BENCH_SHARDS": "16", "BENCH_KEY_PREFIX": "jb16"},
                "JobbersTask, jobbers_store_shards=16 (the sharded layout on one server)"),
        Variant("jobbers_folded", "bench_app", {"BENCH_JOBBERS_URL": result_url},
                "JobbersTask, jobbers_redis_url on the result db (write folded)"),
        Variant("plain_installed", "bench_app", {"BENCH_PLAIN_TASK": "1"},
                "a plain task in an app with jobbers installed (the old baseline)"),
    )}
