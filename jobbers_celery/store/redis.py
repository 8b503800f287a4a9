"""RedisStore: every part of the store over one sharded connection.

Each concern is a module of functions of the connection (:class:`~.sharded.Sharded`):
``steps``, ``running``, ``reads``, ``housekeeping``, ``scheduling``, ``runs`` and
``deadletters``, each behind a Protocol of :mod:`jobbers_celery.store.parts`. ``RedisStore``
binds them as its methods, so a call is the function itself (no added layer, no added
round trip: every lifecycle step is still one Lua call), and satisfies every Protocol. A
consumer is typed on the Protocol of what it uses, never on ``RedisStore``.
"""

from __future__ import annotations

from jobbers_celery.store import (
    alerts,
    deadletters,
    fairshare,
    housekeeping,
    ratelimits,
    reads,
    running,
    scheduling,
    search,
    series,
    steps,
    unique,
    workflows,
)
from jobbers_celery.store import pauses as held
from jobbers_celery.store import periodic as beatwatch
from jobbers_celery.store import runs as paced
from jobbers_celery.store.errors import UNREACHABLE, WritesRefused, is_outage
from jobbers_celery.store.sharded import Sharded

__all__ = ["UNREACHABLE", "RedisStore", "WritesRefused", "is_outage"]


class RedisStore(Sharded):
    """Typed access to the lifecycle records of one jobbers namespace (see the module)."""

    # steps (StepStore)
    submit = steps.submit
    submit_many = steps.submit_many
    start = steps.start
    complete = steps.complete
    end = steps.end
    unstarted = steps.unstarted
    step = steps.step
    cancel = steps.cancel
    epoch = steps.epoch
    epochs = housekeeping.epochs
    # unique tasks' locks
    unique_holder = unique.unique_holder
    unique_of = unique.unique_of
    # running tasks (RunningStore)
    heartbeat = running.heartbeat
    alive = running.alive
    # reads (ReadStore)
    get = reads.get
    started_by = reads.started_by
    get_raw = reads.get_raw
    history = reads.history
    fields = reads.fields
    counts = reads.counts
    sample_counts = reads.sample_counts
    count_history = reads.count_history
    scheduled = reads.scheduled
    tasks = reads.tasks
    refused_counts = reads.refused_counts
    # the per-minute series (SeriesStore)
    series_hours = series.series_hours
    series_names = series.series_names
    series_configure = series.series_configure
    # the argument search (SearchStore)
    indexed = search.indexed
    recent = search.recent
    # canvases as units (WorkflowStore)
    workflow = workflows.workflow
    mark_workflow_cancelled = workflows.mark_workflow_cancelled
    # the cleaner and pruning (HousekeepingStore)
    cleaner_due = housekeeping.cleaner_due
    workers = housekeeping.workers
    worker_tasks = housekeeping.worker_tasks
    drop_payloads = housekeeping.drop_payloads
    without_payload = housekeeping.without_payload
    stall = housekeeping.stall
    tidy_cancelling = housekeeping.tidy_cancelling
    record_pass = housekeeping.record_pass
    clock = housekeeping.clock
    last_pass_age_ms = housekeeping.last_pass_age_ms
    remove_terminal = housekeeping.remove_terminal
    purge = housekeeping.purge
    prune = housekeeping.prune
    maxmemory_policy = housekeeping.maxmemory_policy
    # the scheduler (SchedulingStore)
    due = scheduling.due
    claim = scheduling.claim
    release_publish_leases = scheduling.release_publish_leases
    confirm_published = scheduling.confirm_published
    # fair shares (FairStore)
    fair_release = fairshare.release
    fair_unreleased = fairshare.unreleased
    fair_held = fairshare.held
    # pauses of a task name or a queue, and the held tasks (PauseStore)
    pause = held.pause
    unpause = held.unpause
    pauses = held.pauses
    hold = held.hold
    held_ids = held.held_ids
    held_count = held.held_count
    # rate limits keyed by arguments (RateLimitStore)
    rate_overrides = ratelimits.overrides
    set_rate_override = ratelimits.set_override
    clear_rate_override = ratelimits.clear_override
    rate_held = ratelimits.held
    release = held.release
    oldest_submitted = held.oldest_submitted
    # the beat watch (PeriodicStore)
    periodic_learn = beatwatch.periodic_learn
    periodic_remove = beatwatch.periodic_remove
    periodic_publish = beatwatch.periodic_publish
    periodic_start = beatwatch.periodic_start
    periodic_end = beatwatch.periodic_end
    periodic_missed = beatwatch.periodic_missed
    periodic_late = beatwatch.periodic_late
    periodic_names = beatwatch.periodic_names
    periodic_state = beatwatch.periodic_state
    periodic_schedules = beatwatch.periodic_schedules
    # paced resubmits (RunStore)
    run_keys = paced.run_keys
    create_run = paced.create_run
    active_runs = paced.active_runs
    runs = paced.runs
    run = paced.run
    run_fields = paced.run_fields
    claim_run = paced.claim_run
    run_unsettled = paced.run_unsettled
    settle_run = paced.settle_run
    control_run = paced.control_run
    # the dead-letter queue's entries, outbox and set-aside list (DeadLetterStore)
    put_entries = deadletters.put_entries
    entry_count = deadletters.entry_count
    entry_text = deadletters.entry_text
    entry_texts = deadletters.entry_texts
    entries_matching = deadletters.entries_matching
    remove_entries = deadletters.remove_entries
    outbox_push = deadletters.outbox_push
    outbox_head = deadletters.outbox_head
    outbox_remove = deadletters.outbox_remove
    set_aside_push = deadletters.set_aside_push
    set_aside_read = deadletters.set_aside_read
    # the alerts' dedupe marks and rate counters (AlertStore)
    alert_mark = alerts.alert_mark
    alert_extend = alerts.alert_extend
    alert_unmark = alerts.alert_unmark
    alert_count = alerts.alert_count
