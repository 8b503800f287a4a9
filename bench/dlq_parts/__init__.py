"""The parts of ``bench/dlq.py`` (run that script; see bench/README.md), one concern each:

- :mod:`.data`: the scenario: task names, kinds of failure and their popularity, a past
  incident, task names that stopped failing; the failure groups with real fingerprints;
- :mod:`.database`: the benchmark's own PostgreSQL database (create, reuse, drop) and what
  is in it;
- :mod:`.load`: the server-side load of the entries, failure rows and groups;
- :mod:`.measure`: the operator's session and the measuring tools (timed requests, every
  SQL statement of a request, ``EXPLAIN ANALYZE``);
- :mod:`.reads`: the list endpoint, the groups page, the admin's entry list;
- :mod:`.charts`: the admin's charts (sparklines, the live page);
- :mod:`.resubmit`: bulk resubmits, checked, split into their parts, and restored;
- :mod:`.report`: the targets and the summary;
- :mod:`.cli`: the options and ``main``.

The pages and endpoints measured, and the tables they read, are here.
"""

from __future__ import annotations

LIST_URL = "/jobbers/dead-letter-queue"
RESUBMIT_URL = "/jobbers/dead-letter-queue/resubmit"
GROUPS_URL = "/admin/jobbers/failuregroup/"
ENTRIES_ADMIN_URL = "/admin/jobbers/deadletterentry/"
TABLES = ("jobbers_deadletterentry", "jobbers_deadletterfailure", "jobbers_failuregroup")
