#!/usr/bin/env python
"""How long does one cleaner pass take over a large store, and what does a record cost in Redis?

Issue 3, point 10: one cleaner pass over 1,000,000 tracked records of which 100,000 are
running, with none stalled and with 1,000 stalled; Redis memory per tracked record.
Targets: a pass under 50 ms with none stalled, under 500 ms with 1,000 stalled, under
1 KB per completed record.

Starts a private ``redis-server`` (free port, no persistence) and fills it with records
that are byte-for-byte what jobbers writes: a few template records go through the real
code (``apply_async`` -> ``before_task_publish`` -> ``submitted``; then ``JobbersTask``'s
own ``_start``, ``heartbeat`` and ``_complete`` under a pushed request), are read back
(hash with its ``h<n>`` history, every index that holds them, TTL) and are then mass-copied
by a Lua loader, 1,000 per call, with fresh ids, workers and times (absolute times in
``sub_at``/``start_at``/``hb_at``/``done_at`` and the index scores, history deltas from the
copy's own ``sub_at``). The store's keys spread over shards (``jobbers_store_shards``,
``--shards``): each loader call writes into one shard, with ids of that shard, the
template's shard tag replaced by that shard's in every key; the calls cycle over the shards.
A copy made with a template's own times (in another shard than the template's) is checked
against the template (fields, field order, encoding, index scores, TTL, ``MEMORY USAGE``)
before anything is loaded.

Then it runs ``jobbers.cleaner.run()`` (the real pass) with none stalled, and with
1,000 stalled, four ways: heartbeat kind / dead-worker kind, each dead-lettered
(``max_stall_recoveries`` 0, ``dead_letter_policy=save``, default Redis sink) or
recovered (``max_stall_recoveries`` 1: republished through Celery to a queue nobody
consumes).

    .venv/bin/python bench/cleaner.py            # 1,000,000 records, 100,000 running
    .venv/bin/python bench/cleaner.py --quick    # 100,000 / 10,000 / 1,000 stalled
    .venv/bin/python bench/cleaner.py --compare-shards 1,16   # both layouts, interleaved

The parts are in ``bench/cleaner_parts/`` (scenario, templates, loader, memory, passes,
run, layouts, report, cli). See bench/README.md for how to read the output.
"""

from __future__ import annotations

import sys

from _common import on_sys_path  # bench/ is on sys.path (the script's directory)
from cleaner_parts.cli import main

on_sys_path()  # jobbers, from this checkout

if __name__ == "__main__":
    sys.exit(main())
