"""A worker process in a state-store outage: said once, outcomes held, deliveries given back.

- :class:`OutageLog` is the one way an outage is logged: once when it begins and once when
  it is over, not at every try (the task's outage, a message held while the broker is away
  too, the main process's loops).
- :class:`Ending` is the outage policy of the steps that end an attempt, which the task
  runs around the recorder's call (the recorder only calls down, to the store): the outcome
  is held and sent again until the store answers, and a start the store lost is recorded
  again.
- :class:`Handover` gives a delivery back to the broker when its start cannot be recorded,
  and takes back, at a later delivery, a start that was recorded with its reply lost.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

from celery.exceptions import Ignore
from kombu.exceptions import OperationalError

from jobbers_celery.core.printable import escaped_logger
from jobbers_celery.core.states import TaskState
from jobbers_celery.lifecycle import liveness
from jobbers_celery.lifecycle import payload as pl
from jobbers_celery.store import UNREACHABLE, Giver, StepResult, is_outage

if TYPE_CHECKING:
    from celery.canvas import Signature

    from jobbers_celery.lifecycle.publisher import Publisher
    from jobbers_celery.lifecycle.recorder import Recorder
    from jobbers_celery.store import ClockStore, ReadStore

__all__ = ["GIVERS_KEPT", "HEADER_GIVEN_BACK", "ORPHAN_STALL", "OUTAGE_RESEND_FIRST_PAUSE_S",
           "OUTAGE_RESEND_MAX_PAUSE_S", "WRITE_PROBE", "Delivery", "Ending", "Handover",
           "LoopOutage", "OutageLog", "broker_away", "givers", "givers_header",
           "loop_outage_log", "resend_until_recorded", "write_probe"]

#: The task's outage lines keep the logger they always had.
log = escaped_logger("jobbers.task")
S = TaskState

#: In the reason of a stall the worker's liveness thread decided (stall.lua, kind "gone").
ORPHAN_STALL = "its end was not recorded"
#: The header of a message a worker gave back during a store outage:
#: "<incarnation>[,<incarnation>...]/<retries>", every worker incarnation that gave this
#: delivery back (at most ``GIVERS_KEPT``, the first ones), any of which may hold its start.
HEADER_GIVEN_BACK = "jobbers_given_back"
GIVERS_KEPT = 16
#: The header is a claim, never proof: a start it names is taken back only if the store
#: says so (the giver's incarnation is gone, or its own liveness refresh said it does not
#: run that attempt). While the giver lives and may still say so, the delivery is put back
#: (published again this many refresh periods later, at least a second) and asks again.
TAKE_BACK_ASK_AGAIN_PERIODS = 1.0
#: Refresh periods a giver's liveness refresh is given, after it could first have found the
#: attempt not running there, before its silence means it runs it.
TAKE_BACK_MARGIN_PERIODS = 3
#: Pauses between tries of a finished task's outcome while the store is unreachable
#: (doubling from the first to the last; each try also waits out the outage itself).
OUTAGE_RESEND_FIRST_PAUSE_S, OUTAGE_RESEND_MAX_PAUSE_S = 0.5, 5.0


class OutageLog:
    """An outage said once: a warning when it begins (``began``), one when it is over
    (``over``, with how long it lasted), and at most a debug line for each try between.

    ``args`` go first in every line (what met it); ``began`` adds the details of the try
    that met it, ``over`` the seconds it lasted."""

    __slots__ = ("_args", "_began", "_logger", "_over", "_still", "since")

    def __init__(self, logger: logging.Logger, began: str, over: str, *args: object,
                 still: str | None = None) -> None:
        self._logger = logger
        self._began = began
        self._over = over
        self._still = still
        self._args = args
        self.since: float | None = None

    def began(self, *details: object) -> None:
        if self.since is None:
            self.since = time.monotonic()
            self._logger.warning(self._began, *self._args, *details)
        elif self._still is not None:
            self._logger.debug(self._still, *self._args, *details)

    def over(self) -> None:
        if self.since is not None:
            self._logger.warning(self._over, *self._args, time.monotonic() - self.since)
            self.since = None


def loop_outage_log(logger: logging.Logger, what: str) -> OutageLog:
    """The outage log of a loop of the worker's main process (liveness refresh, scheduler
    pass): ``began(exc)`` at every pass the store does not answer, ``over()`` at one it does."""
    return OutageLog(logger, "%s: the jobbers state store cannot be reached (%s); retrying "
                     "until it answers", "%s: the jobbers state store answers again "
                     "(unreachable for %.1f s)", what,
                     still="%s: the jobbers state store still cannot be reached (%s)")


#: The lock a loop's write probe takes, for a millisecond (see :func:`write_probe`).
WRITE_PROBE = "write-probe"


def write_probe(store: ClockStore) -> Callable[[], object]:
    """Writes refused whenever the store refuses writes (``SET NX``: ``OOM``, ``READONLY``,
    ``MASTERDOWN``...), that :class:`LoopOutage` sends before it says the store answers
    again: a lock in the global slot (it lasts a millisecond; whether it was taken is no
    matter), and, on a store with shards, every shard's epoch (``epochs``, one pipeline),
    so that each Redis Cluster node holding jobbers' keys is probed, not the global slot's
    only. Sent only in an outage, never on a pass that goes through."""
    every = getattr(store, "epochs", None)

    def probe() -> object:
        taken = store.try_lock(WRITE_PROBE, 1)
        if callable(every):
            every()
        return taken

    return probe


class LoopOutage:
    """The outage of a loop of the worker's main process, said once (:func:`loop_outage_log`):
    ``failed(exc)`` after a pass the store did not answer, ``passed()`` after one it did.

    A store out of memory or read-only refuses writes but still serves reads, and many passes
    only read (the scheduler's, between its housekeeping, catch-up and periodic checks; a
    pause poll): such a pass going through does not end the outage, or it would be said over
    and begun again at every pass that writes. So ``passed()``, in an outage, first sends
    ``probe`` (:func:`write_probe`), which raises the outage if writes are still refused:
    the caller handles that as a pass that failed (``failed``: a debug line)."""

    __slots__ = ("log", "probe")

    def __init__(self, logger: logging.Logger, what: str,
                 probe: Callable[[], object] | None = None) -> None:
        self.log = loop_outage_log(logger, what)
        self.probe = probe

    def failed(self, exc: BaseException) -> None:
        self.log.began(exc)

    def passed(self) -> None:
        """The pass went through: the outage is over if the store takes a write too
        (raises what the probe raises, the store still refusing writes)."""
        if self.log.since is None:
            return
        if self.probe is not None:
            self.probe()
        self.log.over()


#: This worker process in a store outage (tasks it cannot start, outcomes it holds).
STORE_OUTAGE = OutageLog(
    log, "the jobbers state store cannot be reached: until it answers, this worker process "
    "gives the tasks it receives back to the broker (not run), and holds the outcomes of the "
    "tasks it ran until they are recorded",
    "the jobbers state store answers again (unreachable for %.1f s): tasks start and their "
    "outcomes are recorded")
#: This worker process holding a message it could neither start (the store is away) nor give
#: back (the broker is away too: one Redis for both, or both down): ``began(name, id, exc)``.
HELD_MESSAGE = OutageLog(
    log, "the broker cannot take the message of %s[%s] back either (%s): this worker process "
    "holds it (not run) and publishes it again, with a pause, until the broker takes it",
    "the broker took back the message this worker process held for %.1f s")


def resend_until_recorded(step: Callable[[], StepResult],
                          outage: OutageLog = STORE_OUTAGE) -> StepResult:
    """The step that ends an attempt could not be written: the store is unreachable (each
    try waits up to ``jobbers_worker_lost_after``). The task's body has finished, so its
    outcome is held and sent again, with a backoff up to ``OUTAGE_RESEND_MAX_PAUSE_S``
    between tries, until the store answers, however long the outage lasts: never recorded
    failed, never run again because of it. The step is fenced by the attempt, so if an
    earlier try applied (its reply lost), this one is refused (the task is already in the
    end state) and nothing is applied twice. Meanwhile this pool slot takes no other task."""
    outage.began()
    pause = OUTAGE_RESEND_FIRST_PAUSE_S
    while True:
        try:
            res = step()
        except UNREACHABLE:
            time.sleep(pause)
            pause = min(2 * pause, OUTAGE_RESEND_MAX_PAUSE_S)
            continue
        outage.over()
        return res


class Ending:
    """The outage policy of the steps that end one attempt, run around the recorder's call
    (``step``: the whole call, which does nothing unless its store step applied): run the
    step, held through a store outage (:func:`resend_until_recorded`); if the store no
    longer knows the attempt started (the record is back at ``submitted`` with the attempt
    before: a failover or restart lost that write), record the start again (``restart``)
    and run the step once more, so that the outcome is not lost with it."""

    __slots__ = ("attempt", "name", "restart", "task_id")

    def __init__(self, name: str, task_id: str, attempt: int,
                 restart: Callable[[], StepResult]) -> None:
        self.name = name
        self.task_id = task_id
        self.attempt = attempt
        self.restart = restart

    def __call__(self, step: Callable[[], StepResult]) -> StepResult:
        try:
            res = step()
        except UNREACHABLE:
            res = resend_until_recorded(step)
        if (not res.applied and res.previous == S.SUBMITTED
                and res.attempt == self.attempt - 1):
            log.warning("the start of %s[%s] attempt %s was lost by the store (failover or "
                        "restart); recording it again", self.name, self.task_id, self.attempt)
            again = self.restart()
            if again.applied and again.state is S.STARTED and again.attempt == self.attempt:
                res = step()
        return res


def givers(header: Any, retries: int) -> list[str]:
    """The worker incarnations a ``jobbers_given_back`` header names for the delivery with
    ``retries`` (none for another retry: a retry's message copies the header)."""
    names, _, of = str(header or "").rpartition("/")
    return [n for n in names.split(",") if n] if of == str(retries) else []


def givers_header(header: Any, retries: int) -> str:
    """The ``jobbers_given_back`` header of a message this worker gives back: the givers
    before it (a message can bounce between workers while the store is away; the start that
    applied with its reply lost may be any of theirs) and this incarnation."""
    names = givers(header, retries)
    me = liveness.worker_id()
    if me not in names and len(names) < GIVERS_KEPT:
        names.append(me)
    return f"{','.join(names)}/{retries}"


def broker_away(exc: BaseException) -> bool:
    """``exc``, raised by a publish, means the broker cannot be reached or take the message
    for now: kombu's ``OperationalError`` (a connection error, once the publish's own retries
    are spent), or a Redis broker refusing writes (``OOM`` and the like)."""
    return isinstance(exc, OperationalError) or is_outage(exc)


@dataclass(slots=True)
class Delivery:
    """What the start of one delivery reads of its task and request."""

    name: str
    task_id: str
    retries: int
    worker: str | None  # the worker's hostname, shown on the record
    request: Any  # Celery's request: its headers, and its arguments for a late submission
    signature: Callable[[], Signature[Any]]  # its message, to publish it again unchanged
    run: Callable[..., Any] | None = None  # the task's function (its rate-limit key's names)

    def header(self, name: str) -> Any:
        return pl.request_header(self.request, name)


class Handover:
    """Gives a delivery back to the broker when its start cannot be recorded (the store
    does not answer), and judges, at a later delivery of that message, whether a giver holds
    a start it never ran (then it is taken back). Handed what it uses: the store's reads of
    a start, the recorder's take-back steps, the publisher's give-back, and
    ``jobbers_worker_lost_after`` (the liveness timing a giver is judged by)."""

    def __init__(self, store: ReadStore, recorder: Recorder, publisher: Publisher,
                 lost_after: float) -> None:
        self.store = store
        self.recorder = recorder
        self.publisher = publisher
        self.lost_after = lost_after
        lost_ms = int(lost_after * 1000)
        margin_ms = int(TAKE_BACK_MARGIN_PERIODS * liveness.refresh_period(lost_after) * 1000)
        # How a take-back judges the giver a header names: gone after ``worker_lost_after``
        # unseen; alive, it has had its chance to say it does not run the attempt (its
        # liveness refresh reports the attempts older than ``worker_lost_after`` it does not
        # run) once seen that long after the attempt started, plus a margin of a few refreshes.
        self.judge = Giver(gone_ms=lost_ms, settle_ms=lost_ms + margin_ms)

    def give_back(self, delivery: Delivery) -> NoReturn:
        """The store did not answer within ``jobbers_worker_lost_after``: the start is not
        recorded (or not known to be), so this delivery does not run, and its message is not
        consumed and dropped either: it is published again, unchanged (same id, arguments,
        headers and retry count), without asking the store, for this worker or another to
        run once the store answers, and this delivery ends (acknowledged: early ack already
        did, ``acks_late`` does now, after the publish). The new message names this worker
        incarnation (``jobbers_given_back``, after the givers of earlier deliveries of the
        same message): should the start have been recorded after all (its reply was lost),
        the delivery of the new message takes the task back from it.
        The outage is logged once per worker process, not per task.

        If the broker refuses the publish too (one Redis for both, or both away), the
        message is held here, never dropped, and published again, with a pause growing
        from ``OUTAGE_RESEND_FIRST_PAUSE_S`` to ``OUTAGE_RESEND_MAX_PAUSE_S``, until the
        broker takes it. The task is not started here meanwhile, even if the store answers
        first: a refused publish may have reached the broker (its reply lost), and the copy,
        naming this incarnation, would take back a start made here and run the task twice."""
        STORE_OUTAGE.began()
        sig = delivery.signature()
        headers = dict(sig.options.get("headers") or {})
        headers[HEADER_GIVEN_BACK] = givers_header(delivery.header(HEADER_GIVEN_BACK),
                                                   delivery.retries)
        sig.options["headers"] = headers
        pause = OUTAGE_RESEND_FIRST_PAUSE_S
        while True:
            try:
                self.publisher.give_back(sig)
            except Exception as exc:
                if not broker_away(exc):
                    raise
                HELD_MESSAGE.began(delivery.name, delivery.task_id, exc)
                time.sleep(pause)
                pause = min(2 * pause, OUTAGE_RESEND_MAX_PAUSE_S)
                continue
            HELD_MESSAGE.over()
            log.debug("gave %s[%s] back to the broker (published again): the state store "
                      "cannot be reached", delivery.name, delivery.task_id)
            raise Ignore()

    def take_back(self, delivery: Delivery, res: StepResult) -> TaskState | None:
        """The start of a message given back during an outage (see :meth:`give_back`) was
        refused: the task is ``started``, or ``stalled``. The header only names who may hold
        that start; the store decides, in the step itself. If a worker incarnation that gave
        it back holds that start (its ``started`` step applied, but its reply was lost, and
        the task never ran) and that incarnation is gone, or its liveness refresh said it
        does not run that attempt, the attempt is ended (``started -> unsubmitted``, fenced
        by its attempt and worker): returns ``unsubmitted`` (the caller records the
        submission and starts the task); while the giver is alive and has not said so yet,
        the delivery asks again later (:meth:`_ask_again_later`). The same if that worker's
        liveness thread stalled the attempt meanwhile as an end that was not recorded
        (``stalled -> submitted``, fenced the same way and by the store's mark of that
        verdict): returns ``submitted`` (the caller starts it). A giver alive that still
        holds the start after its liveness had its chance runs it (a copied or crafted
        header): the refusal stands (``None``), as it does otherwise."""
        names = givers(delivery.header(HEADER_GIVEN_BACK), delivery.retries)
        if res.previous == S.STALLED:
            return self._take_back_stall(delivery, res, names)
        for giver in names:
            found = self.store.started_by(delivery.task_id, giver)
            if found is not None and found.attempt == res.attempt:
                break
        else:
            return None
        back = self.recorder.take_back(delivery.task_id, delivery.name, attempt=found.attempt,
                                       giver=giver, worker=delivery.worker, judge=self.judge)
        if back.why == "giver_alive":
            self._ask_again_later(delivery, giver)
        if not (back.applied and back.state is S.UNSUBMITTED):
            if back.why == "giver_runs_it":
                log.warning("not running %s[%s]: its jobbers_given_back header names worker "
                            "incarnation %s, which is alive and runs it (a copied or crafted "
                            "header is not taken for a give-back)", delivery.name,
                            delivery.task_id, giver)
            return None
        log.info("%s[%s]: its start was recorded during a state store outage but it never "
                 "ran there; starting it now", delivery.name, delivery.task_id)
        return S.UNSUBMITTED

    def _ask_again_later(self, delivery: Delivery, giver: str) -> NoReturn:
        """The giver of this given-back message holds the start and is alive: its liveness
        refresh may still say it does not run that attempt (then the next delivery takes it
        back), or the giver runs it (a copied or crafted header: the next delivery is
        refused for good). This delivery does not run: its message is published again,
        unchanged, as Celery's ETA message (not recorded), to ask again a little later."""
        sig = delivery.signature()
        headers = dict(sig.options.get("headers") or {})
        headers[HEADER_GIVEN_BACK] = str(delivery.header(HEADER_GIVEN_BACK) or "")
        sig.options["headers"] = headers
        sig.options["countdown"] = max(1.0, TAKE_BACK_ASK_AGAIN_PERIODS * liveness.refresh_period(
            self.lost_after))
        try:
            self.publisher.give_back(sig)
        except Exception:
            log.exception("not running %s[%s]: worker incarnation %s, alive, holds its start; "
                          "its message could not be put back to ask again (the cleaner ends "
                          "that attempt if it does not run it)", delivery.name,
                          delivery.task_id, giver)
            raise Ignore() from None
        log.info("not running %s[%s] yet: worker incarnation %s, alive, holds its start; "
                 "asking again in %.1f s", delivery.name, delivery.task_id, giver,
                 sig.options["countdown"])
        raise Ignore()

    def _take_back_stall(self, delivery: Delivery, res: StepResult,
                         names: list[str]) -> TaskState | None:
        """See :meth:`take_back`: the attempt a giver held was stalled by its worker as an
        end not recorded (the giver's request was over, the task not running there)."""
        task_id = delivery.task_id
        raw = self.store.get_raw(task_id)
        giver = raw.get("wid") or ""
        if giver not in names or raw.get("state") != S.STALLED.value \
                or int(raw.get("attempt") or 0) != res.attempt:
            return None
        history = self.store.history(task_id)
        if not history or ORPHAN_STALL not in (history[-1].reason or ""):
            return None
        back = self.recorder.take_back_stall(task_id, delivery.name, attempt=res.attempt,
                                             giver=giver, worker=delivery.worker)
        if not (back.applied and back.state is S.SUBMITTED):
            return None
        log.warning("%s[%s]: its start was recorded during a state store outage but it never "
                    "ran there, and it was stalled as an end not recorded meanwhile; starting "
                    "it now", delivery.name, task_id)
        return S.SUBMITTED
