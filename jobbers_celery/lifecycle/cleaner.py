"""The cleaner: finds stalled tasks and tasks whose worker died, and recovers them.

One pass (``Jobbers.clean()``, the ``jobbers.clean`` beat task, or a worker's catch-up when
beat is down) costs a few round trips and walks only due index entries: the heartbeat
deadlines that have passed and the worker incarnations not seen for
``jobbers_worker_lost_after``. Every verdict is a compare-and-set inside ``stall.lua``
(state, attempt fence and the evidence are re-read there, by the Redis clock), so two
cleaners at once, or a cleaner racing a completion, never both win.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from jobbers_celery.alerts import links
from jobbers_celery.alerts.events import AlertEvent, AlertKind
from jobbers_celery.core.printable import escaped_logger
from jobbers_celery.core.records import from_ms
from jobbers_celery.core.timefmt import iso_time
from jobbers_celery.lifecycle import liveness, payload
from jobbers_celery.lifecycle.publisher import UnpublishablePayload
from jobbers_celery.store import StallVerdict

if TYPE_CHECKING:
    from jobbers_celery.alerts.service import Alerts
    from jobbers_celery.core.config import JobbersConfig
    from jobbers_celery.lifecycle.publisher import Publisher
    from jobbers_celery.lifecycle.recorder import Recorder
    from jobbers_celery.store import CleanerStore

__all__ = ["CleanReport", "Cleaner", "CleanerStatus"]

log = escaped_logger("jobbers.cleaner")

#: Most index entries one pass judges; the rest wait for the next pass.
PASS_LIMIT = 1000
#: How long a pass republishes recovered tasks itself before handing the rest over.
PUBLISH_BUDGET_S = 0.2
#: Candidates judged per ``stall.lua`` call (~10-20 ms of Redis time each).
STALL_CHUNK = 200
#: A catch-up pass runs in a worker when the last pass is older than this many intervals.
CATCH_UP_AFTER_INTERVALS = 3
#: Task names one pass's stall alerts name at most (one alert each; the rest are counted).
STALL_ALERT_NAMES = 20


@dataclass(frozen=True, slots=True)
class CleanReport:
    """What one cleaner pass did."""

    at: datetime
    duration_ms: float
    by: str
    examined: int = 0
    stalled: int = 0
    recovered: list[str] = field(default_factory=list)
    dead_lettered: list[str] = field(default_factory=list)
    #: Candidates left alone: heartbeat refreshed meanwhile, or silence within the grace
    #: that follows a Redis outage or pause.
    kept: int = 0
    #: Redis time when the last outage or pause ended (silence before it does not count).
    resumed_at: datetime | None = None

    def as_dict(self, max_ids: int | None = None) -> dict[str, Any]:
        """Plain data (times as every JSON output writes them: ISO 8601 UTC, ``Z``);
        ``max_ids`` keeps only the first ids of each list."""
        return {
            "at": iso_time(self.at), "duration_ms": round(self.duration_ms, 3), "by": self.by,
            "examined": self.examined, "stalled": self.stalled,
            "recovered": self.recovered[:max_ids], "recovered_count": len(self.recovered),
            "dead_lettered": self.dead_lettered[:max_ids],
            "dead_lettered_count": len(self.dead_lettered), "kept": self.kept,
            "resumed_at": iso_time(self.resumed_at),
        }


@dataclass(frozen=True, slots=True)
class CleanerStatus:
    """When the last pass ran, how long it took, and whether one is overdue."""

    last_run_at: datetime | None
    last_duration_ms: float | None
    by: str | None
    overdue: bool
    last_report: dict[str, Any] | None = None


class Cleaner:
    """Judges stalled tasks and recovers them: resubmitted through ``publisher`` while
    ``max_stall_recoveries`` allows, else dead-lettered through ``recorder``.

    ``pass_limit``, ``stall_chunk`` and ``publish_budget_s`` bound one pass (see the module
    constants of the same names, their defaults). ``alerts``: where stalls and an overdue
    cleaner are told (``AlertKind.STALL``, ``AlertKind.CLEANER_OVERDUE``).
    """

    def __init__(self, store: CleanerStore, config: JobbersConfig, recorder: Recorder,
                 publisher: Publisher, *, pass_limit: int = PASS_LIMIT,
                 stall_chunk: int = STALL_CHUNK,
                 publish_budget_s: float = PUBLISH_BUDGET_S,
                 alerts: Alerts | None = None) -> None:
        self.store = store
        self.alerts = alerts
        self.config = config
        self.recorder = recorder
        self.publisher = publisher
        self.pass_limit = pass_limit
        self.stall_chunk = stall_chunk
        self.publish_budget_s = publish_budget_s

    def run(self, by: str = "api") -> CleanReport:
        """One pass. Safe to run anywhere, any number at once."""
        store, config = self.store, self.config
        pass_limit, stall_chunk = self.pass_limit, self.stall_chunk
        started = time.perf_counter()
        lost_ms = int(config.worker_lost_after * 1000)
        scans = store.cleaner_due(liveness.gaps(config), lost_ms, pass_limit)
        recovered_items: list[dict[str, str]] = []
        dead_items: list[dict[str, str]] = []
        stalled = kept = examined = 0
        lease_ms = int(config.publish_lease * 1000)
        room = pass_limit  # bounds the whole pass, not each shard: the rest is next pass's
        cancel: list[str] = []
        candidates: dict[int, list[tuple[str, str, str]]] = {}
        for scan in scans:
            cancel += scan.cancel
            take = scan.hb[:room]
            room -= len(take)
            candidates[scan.shard] = [(i, "hb", "") for i in take]
        dead = {scan.shard: scan.dead for scan in scans if scan.dead}
        if dead and room > 0:
            # nor each dead worker: an incarnation is forgotten (in a shard) only once it
            # has no tasks left there; their tasks in every shard in one read
            for shard, tasks in store.worker_tasks(dead, room).items():
                for wid, ids in tasks.items():
                    take = ids[:room]
                    room -= len(take)
                    candidates[shard] += [(i, "worker", wid) for i in take]
        flat = [c for shard in candidates.values() for c in shard]
        meta = store.fields([c[0] for c in flat], ("wid", "name")) if flat else []
        at = 0
        for scan in scans:
            mine = candidates[scan.shard]
            items = [(task_id, kind, wid or rec_wid or "", name or "")
                     for (task_id, kind, wid), (rec_wid, name)
                     in zip(mine, meta[at:at + len(mine)], strict=True)]
            at += len(mine)
            examined += len(items)
            # one script call per chunk, so that Redis is never blocked long by a big pass
            chunks = [items[i:i + stall_chunk] for i in range(0, len(items), stall_chunk)]
            forget = dead.get(scan.shard, [])
            if forget and not chunks:
                chunks = [[]]  # only forget dead incarnations that have no tasks left
            for n, chunk in enumerate(chunks):
                last = n == len(chunks) - 1
                part = store.stall(chunk, lost_ms, lease_ms, forget if last else (),
                                   shard=scan.shard)
                recovered_items += part.recovered
                dead_items += part.dead
                stalled += part.stalled
                kept += part.kept
        recovered, dead_lettered = self._settle(StallVerdict(recovered_items, dead_items,
                                                             stalled, kept))
        if cancel:
            store.tidy_cancelling(cancel)
        duration = (time.perf_counter() - started) * 1000
        resumed = max(scan.resumed_at_ms for scan in scans)
        now_ms = max(scan.now_ms for scan in scans)
        report = CleanReport(
            at=from_ms(now_ms),  # type: ignore[arg-type]
            duration_ms=duration, by=by, examined=examined,
            stalled=stalled, recovered=recovered, dead_lettered=dead_lettered,
            kept=kept, resumed_at=from_ms(resumed) if resumed else None,
        )
        store.record_pass(now_ms, duration, by, report.as_dict(max_ids=20))
        if report.stalled:
            log.warning("cleaner: %d stalled task(s), %d resubmitted, %d dead-lettered",
                        report.stalled, len(recovered), len(dead_lettered))
        return report

    def recover_orphans(self, wid: str, ids: list[str]) -> CleanReport:
        """Stall the tasks a live worker incarnation ``wid`` is recorded as running but
        does not run (see ``alive.lua``): the step that ended them was lost (a failover or a
        restart lost the write), so their outcome is unknown. Recovered as any stalled
        task: resubmitted while ``max_stall_recoveries`` allows, else dead-lettered."""
        store, config = self.store, self.config
        started = time.perf_counter()
        names = [name or "" for (name,) in store.fields(ids, ("name",))]
        items = [(i, "gone", wid, name) for i, name in zip(ids, names, strict=True)]
        part = store.stall(items, int(config.worker_lost_after * 1000),
                           int(config.publish_lease * 1000))
        recovered, dead_lettered = self._settle(part)
        if part.stalled:
            log.warning("worker %s does not run %d task(s) recorded as running there (their "
                        "end was lost): %d resubmitted, %d dead-lettered", wid,
                        part.stalled, len(recovered), len(dead_lettered))
        return CleanReport(at=from_ms(store.now_ms()) or datetime.now(UTC),
                           duration_ms=(time.perf_counter() - started) * 1000,
                           by=f"liveness {wid}", examined=len(items),
                           stalled=part.stalled, recovered=recovered,
                           dead_lettered=dead_lettered, kept=part.kept)

    def _settle(self, verdict: StallVerdict) -> tuple[list[str], list[str]]:
        """What follows a stall verdict: each ended attempt's metrics, then the resubmitted
        tasks republished and the others dead-lettered; returns both lists of ids."""
        recorder = self.recorder
        recorder.stalled((*verdict.recovered, *verdict.dead))
        done = (self._publish(verdict.recovered), recorder.dead_letter_stalled(verdict.dead))
        if self.alerts is not None and (verdict.recovered or verdict.dead):
            self._tell_stalls(verdict)
        return done

    def _tell_stalls(self, verdict: StallVerdict) -> None:
        """One STALL alert per task name that stalled (its key: the name)."""
        alerts = self.alerts
        assert alerts is not None
        by_name: dict[str, list[int]] = {}
        for n, items in enumerate((verdict.recovered, verdict.dead)):
            for item in items:
                counts = by_name.setdefault(item.get("name") or "", [0, 0])
                counts[n] += 1
        for name, (again, dead) in list(by_name.items())[:STALL_ALERT_NAMES]:
            shown = name or "(no name recorded)"
            alerts.emit(AlertEvent(
                AlertKind.STALL, name, f"{again + dead} task(s) of {shown} stalled",
                f"The cleaner found {again + dead} task(s) of {shown} stalled (heartbeat "
                f"missed or worker lost): {again} resubmitted, {dead} dead-lettered.",
                links.LIVE, name or None))

    def _publish(self, recovered: list[dict[str, str]]) -> list[str]:
        """Republish the resubmitted tasks; returns their ids.

        For at most ``publish_budget_s``: what is left is handed to the in-worker schedulers
        (its publish lease is made due, so every worker's next poll claims and publishes
        some), which keeps a pass short however many tasks it recovers.
        """
        done: list[str] = []
        publisher = self.publisher
        now_ms = self.store.now_ms() if recovered else 0
        deadline = time.monotonic() + self.publish_budget_s
        for n, item in enumerate(recovered):
            if time.monotonic() > deadline:
                rest = [i["id"] for i in recovered[n:]]
                self.store.release_publish_leases(rest)
                log.info("cleaner: %d recovered task(s) left for the workers' schedulers to "
                         "publish", len(rest))
                break
            try:
                if not item["name"]:
                    raise UnpublishablePayload("no task name was recorded")
                publisher.republish(item["id"], item["name"], publisher.payload_of(item["msg"]),
                                    int(item["retries"] or 0), now_ms)
                done.append(item["id"])
            except Exception:
                log.exception("could not publish stalled task %s for recovery; the scheduler "
                              "publishes it again when its lease expires", item["id"])
        self.store.confirm_published(done)
        return [item["id"] for item in recovered]

    # ------------------------------------------------------------------ health
    def status(self) -> CleanerStatus:
        clock = self.store.clock()
        last = int(clock["last_at"]) if clock.get("last_at") else None
        interval_ms = self.config.cleaner_interval * 1000
        overdue = (last is None
                   or self.store.now_ms() - last > CATCH_UP_AFTER_INTERVALS * interval_ms)
        report = payload.loads(clock["report"]) if clock.get("report") else None
        return CleanerStatus(
            last_run_at=from_ms(last) if last else None,
            last_duration_ms=float(clock["last_ms"]) if clock.get("last_ms") else None,
            by=clock.get("by"), overdue=overdue, last_report=report,
        )

    def catch_up(self, by: str) -> CleanReport | None:
        """Run a pass if beat has not run one for three intervals (one worker at a time)."""
        if not self.status().overdue:
            return None
        lock_ms = int(self.config.cleaner_interval * 1000)
        if not self.store.try_lock("cleaner-catch-up", lock_ms):
            return None
        log.info("cleaner: no pass for %d intervals (is celery beat running?); catching up",
                 CATCH_UP_AFTER_INTERVALS)
        if self.alerts is not None:  # ongoing: told once while the catch-ups go on
            self.alerts.emit(AlertEvent(
                AlertKind.CLEANER_OVERDUE, "cleaner", "The jobbers cleaner is overdue",
                f"No cleaner pass for {CATCH_UP_AFTER_INTERVALS} intervals of "
                f"{self.config.cleaner_interval:g} s: is celery beat running? The workers run "
                "catch-up passes meanwhile.", links.LIVE, ongoing=True))
        return self.run(by=by)
