#!/usr/bin/env python
"""The Django dead-letter queue at scale: 1,000,000 entries in PostgreSQL.

Issue requirement: with 1,000,000 entries in PostgreSQL, the filtered list endpoint (by task
name, newest first, page of 50) and the fingerprint groups page; bulk resubmit of 1,000
entries end to end. Targets: list p95 under 50 ms, groups under 200 ms, 1,000 resubmits
under 2 s.

Uses a database of its own on the local PostgreSQL (``jobbers_bench``, 127.0.0.1:5432, user
postgres), loaded server-side (``INSERT ... SELECT`` over ``generate_series``) with
1,000,000 entries, their per-attempt failure rows and ~2,000 failure groups with consistent
counters; a second run reuses it. Django runs in this process (``bench/dlq_settings.py``:
admin, DRF, ``jobbers_django``); requests go through Django's test ``Client`` as a logged-in
staff user (URL routing, middleware, session and user lookup, permissions, view,
serialisation: everything but the HTTP server). Resubmission publishes through the real
Celery app with jobbers installed (``bench/dlq_app.py``) to a private ``redis-server``.

    .venv/bin/python bench/dlq.py              # 1,000,000 entries (first run: ~70 s loading)
    .venv/bin/python bench/dlq.py --reload     # drop the database and load it again
    .venv/bin/python bench/dlq.py --quick      # 100,000 entries in jobbers_bench_quick

The parts are in ``bench/dlq_parts/`` (data, database, load, measure, reads, charts,
resubmit, report, cli). See bench/README.md for how to read the output.
"""

from __future__ import annotations

import sys

from _common import on_sys_path  # bench/ is on sys.path (the script's directory)
from dlq_parts.cli import main

on_sys_path()  # jobbers, from this checkout

if __name__ == "__main__":
    sys.exit(main())
