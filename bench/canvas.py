#!/usr/bin/env python
"""How fast does a canvas of many members enqueue with ``base=JobbersTask``, against plain
Celery?

A group of N members (default 10,000), ``chunks(N, 100)``, ``starmap`` of N and a chord whose
header is a group of N: each published with ``apply_async()`` by plain Celery and by
JobbersTask (a group's members recorded ``jobbers_publish_batch`` at a time, see
``jobbers_celery.lifecycle.bulk``), interleaved, each in a fresh process, several rounds, on
a private ``redis-server``; the enqueue rate, the ratio to plain Celery with its spread, the
CPU per member of the client and of the redis-server; every member's record checked after
each jobbers run of a group or chord.

    .venv/bin/python bench/canvas.py             # 10000 members x 5 rounds, 4 canvases
    .venv/bin/python bench/canvas.py --quick     # smoke run: 2000 members x 2 rounds
    .venv/bin/python bench/canvas.py --canvases group --rounds 8 --batch 200

Exit code 0 if every target is met, 2 if one is missed, 1 if the benchmark failed.
The parts are in ``bench/canvas_parts/`` (client, rounds, report, cli).
"""

from __future__ import annotations

import sys

from canvas_parts.cli import main  # bench/ is on sys.path (the script's directory)

if __name__ == "__main__":
    sys.exit(main())
