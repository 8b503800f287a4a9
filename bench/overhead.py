#!/usr/bin/env python
"""What does ``base=JobbersTask`` cost a user, against plain Celery?

One run measures, on a private ``redis-server`` (Redis broker on db 0, result backend on
db 1), a no-op task in four variants:

- ``plain``: plain Celery in an app **without** jobbers (``bench_plain.py``);
- ``track_started``: the same with ``task_track_started=True``;
- ``jobbers``: ``base=JobbersTask`` with jobbers' defaults (its records on the broker's db 0,
  Celery's results on db 1: jobbers' ``completed`` and Celery's result are two writes);
- ``jobbers_folded``: ``jobbers_redis_url`` on the result db, so ``completed`` carries
  Celery's result write (one script call instead of Celery's GET + MULTI/EXEC);
- ``jobbers_sharded`` (on request, ``--variants``): ``jobbers`` with
  ``jobbers_store_shards=16``, the sharded layout (a cluster's default) on this one server,
  to compare it with the one-tag layout (``jobbers``: one shard, the default on one server)
  in the same run;

on a prefork ``-c 2`` worker and on a solo worker (``--pool``). Every round starts, for each
(pool, variant) in turn (order rotated from round to round), a fresh worker and a fresh
client process; the client publishes N tasks with ``.delay()`` in a loop, then ``.get()``s
every result. Measured per round: throughput from the first publish to the last result the
client received, the client's enqueue rate, CPU per task of every process (client, worker
main process, pool children including reaped ones, redis-server) from ``/proc``, Redis
commands and script time per task (``INFO commandstats`` deltas), Redis requests per task
(counted in redis-py in every process), the CPU used by other processes on the machine
(foreign CPU), then the serial round-trip latency (one task at a time). Prints medians with
min-max over the rounds, the ratios to ``plain`` and a verdict against jobbers' cost targets.

    .venv/bin/python bench/overhead.py             # 3000 tasks x 4 rounds, both pools (~7 min)
    .venv/bin/python bench/overhead.py --quick     # smoke run (~1.5 min)
    .venv/bin/python bench/overhead.py --pool solo --rounds 6 --json out.json

Exit code 0 if every target is met, 2 if one is missed, 1 if the benchmark failed.
The parts are in ``bench/overhead_parts/`` (variants, rounds, figures, report, cli).
See bench/README.md for the method and how to read the output.
"""

from __future__ import annotations

import sys

from overhead_parts.cli import main  # bench/ is on sys.path (the script's directory)

if __name__ == "__main__":
    sys.exit(main())
