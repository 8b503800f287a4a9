"""The jobbers admin: dead-letter triage and live tasks.

Pages (under the admin site, app ``jobbers``), one module each:

- :mod:`~jobbers_django.admin.entries`: dead-letter entries, a read-only changelist with
  filters and search, a detail page with the failure history and the task's lifecycle
  transitions, and the actions resubmit (resetting the retry count or keeping it) and
  discard, each behind a confirmation page.
- :mod:`~jobbers_django.admin.groups`: failure groups (entries grouped by fingerprint, with
  counts and a chart of the last 24 h; each links to its entries and has Resubmit and
  Discard buttons) and the audit of every resubmit, discard and cancel, read-only.
- :mod:`~jobbers_django.admin.live`: live tasks (``deadletterentry/live/``), counts per state
  and their last hour, running tasks (progress as bars), stalled and scheduled tasks from
  Redis, the cleaner's last pass, and a cancel action; the page refreshes itself.
- :mod:`~jobbers_django.admin.history`: throughput, failure rate, runtime and queue latency
  over 1 h, 24 h or 7 d, for every task, a task name or a queue (``deadletterentry/history/``).
- :mod:`~jobbers_django.admin.runs`: paced resubmits, each with its progress (refreshing
  itself) and pause, resume and cancel buttons.
- :mod:`~jobbers_django.admin.alerts`: alert rules, edited by ``JOBBERS_ALERTS_PERMISSION``,
  with a "Send a test alert" action.
- :mod:`~jobbers_django.admin.workers`: workers and queues (``deadletterentry/workers/``),
  queue depths and oldest messages, workers with their running tasks, and pausing or
  resuming a task name or a queue on every worker.
- :mod:`~jobbers_django.admin.aside`: set-aside dead letters (``deadletterentry/set-aside/``),
  the ones the sink refused for a reason of their own, from Redis.

Their parts: :mod:`~jobbers_django.admin.actions` (the confirmation page and what confirming
does, for the bulk actions, a group's and an entry's buttons),
:mod:`~jobbers_django.admin.charts` (inline SVG pictures and their bounded queries),
:mod:`~jobbers_django.admin.filters` (list filters),
:mod:`~jobbers_django.admin.lifecycle` (one task's record and transitions, as two pages show them),
:mod:`~jobbers_django.admin.pagination` (the capped paginator),
:mod:`~jobbers_django.admin.base` (the read-only admin they all are) and
:mod:`~jobbers_django.admin.display` (how values look).

Presentation only: actions go through :mod:`jobbers_django.dlq` and
:mod:`jobbers_django.bridge`, the same code the API calls, lists are read with
:mod:`jobbers_django.querysets`, and who may act is
:func:`jobbers_django.permissions.allowed`. Everything shown is redacted
(:func:`jobbers_django.redaction.redact`).

Made for tables of millions of entries: filter choices come from the failure groups (a
small table) or are text boxes, counts stop at :attr:`BoundedPaginator.cap`, facets are
off, and the only sortable column is the one the indexes are ordered by.
"""

from __future__ import annotations

from jobbers_django.admin.actions import summary
from jobbers_django.admin.alerts import AlertRuleAdmin
from jobbers_django.admin.base import STORE_ERRORS, ReadOnlyAdmin
from jobbers_django.admin.entries import DeadLetterEntryAdmin
from jobbers_django.admin.groups import DeadLetterAuditAdmin, FailureGroupAdmin
from jobbers_django.admin.history import HistoryAdminMixin
from jobbers_django.admin.lifecycle import lifecycle
from jobbers_django.admin.live import LivePagesAdmin
from jobbers_django.admin.pagination import BoundedPaginator
from jobbers_django.admin.periodic import PeriodicPagesAdmin
from jobbers_django.admin.runs import ResubmitRunAdmin
from jobbers_django.admin.workers import WorkersPagesAdmin

__all__ = [
    "STORE_ERRORS",
    "AlertRuleAdmin",
    "BoundedPaginator",
    "DeadLetterAuditAdmin",
    "DeadLetterEntryAdmin",
    "FailureGroupAdmin",
    "HistoryAdminMixin",
    "LivePagesAdmin",
    "PeriodicPagesAdmin",
    "ReadOnlyAdmin",
    "ResubmitRunAdmin",
    "WorkersPagesAdmin",
    "lifecycle",
    "summary",
]
