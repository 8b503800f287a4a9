"""The state store away for longer than a worker waits for it, under a load of a few hundred
tasks: no task is lost, none runs twice because of it, and the outage is logged once per
worker process, not per task.

Each fault, killed (SIGKILL) and restarted, paused (SIGSTOP, then SIGCONT) or out of
memory (``maxmemory`` reached, ``noeviction``), lasts ``OUTAGE_S``: longer than
``jobbers_worker_lost_after`` (``LOST_AFTER_S``, the time a worker's step waits out an
outage before giving the message back). It meets three layouts:

- jobbers' Redis separate from a Redis broker: every fault (the kill under load and idle,
  early ack and ``acks_late``; also with tasks that retry);
- jobbers' Redis separate from a RabbitMQ broker (results on a third server): every fault;
- one shared Redis for the broker, the results and jobbers: every fault. The broker fails
  with the store, and Celery and kombu meet it too: see the tests' docstrings and the
  plain-Celery reproduction (no jobbers) at the end.

With the store alone failing, more tasks are published while it is away (their submissions
cannot be recorded; the worker records them late); with a shared Redis the broker refuses
them (out of memory: counted as refused, the client gets the error) or nothing is published
(killed). Executions are counted from marker files, not from the Redis that fails, and the
messages given back from markers written when the broker took them. The figures are
printed (``pytest -s`` shows them).
"""

from __future__ import annotations

import gc
import json
import os
import re
import signal
import time
import uuid
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

from jobbers_celery import TaskState, get_jobbers, install
from jobbers_celery.core.states import TERMINAL
from jobbers_celery.lifecycle import publisher
from jobbers_celery.worker.task import HEADER_GIVEN_BACK
from tests.conftest import Worker, start_worker, wait_for
from tests.integration import fault_proj, plain_fault_proj
from tests.integration.beat_helpers import Beat
from tests.integration.topology_servers import (
    BatchOutcome,
    RestartableRedis,
    executions,
    restartable_redis,
)
from tests.rabbitmq import RabbitVhost

pytestmark = [pytest.mark.redis, pytest.mark.worker]

S = TaskState
CONCURRENCY = 4
#: Tasks published before the fault, and while the store is away (kill only).
LOAD, DURING = 240, 60
#: A step waits out an outage this long, then as long again to learn whether a step that
#: may have been sent was applied; the outage lasts longer than both.
LOST_AFTER_S = 1.0
OUTAGE_S = 5.0
#: Each test's app has task names of its own: a publish is recorded by the first installed
#: app that knows the task's name (see fault_proj.build).
#: What a worker process logs once when it finds the store away.
OUTAGE_LINE = "the jobbers state store cannot be reached: until it answers"
ACKS = pytest.mark.parametrize("acks_late", [False, True], ids=["early_ack", "acks_late"])


@dataclass
class Figures(BatchOutcome):
    #: deliveries given back (published again) for want of the store
    given_back: int = 0
    #: deliveries of a message whose task had already started or ended, refused at start
    #: (a broker restored a message it could not mark acknowledged, or taken twice)
    duplicates: int = 0
    #: other deliveries beyond one per task run: messages the broker delivered again
    #: (restored after the worker's connection to it was lost)
    redelivered: int = 0
    #: publishes the broker refused during the fault (the client got the error; the task
    #: is not counted as published)
    refused: int = 0
    #: times the worker exited and was started again (``run(supervised=True)``)
    restarts: int = 0
    #: stalled by the ``on_shutdown=stop`` policy of a worker that exited (``restarts``)
    shutdown_stalls: int = 0
    #: lost tasks no worker ever received (their message never reached Celery)
    never_received: int = 0
    #: messages kombu took off the queue but could not record as delivered (the write of
    #: its ``unacked`` bookkeeping failed: only that worker held them, never handed to
    #: Celery; gone from the broker)
    dropped_by_kombu: int = 0
    outage_logs: int = 0
    #: lines the worker's main process logged about the outage (liveness refresh and
    #: scheduler: once each when it begins, once each when it ends), and failures it
    #: logged in full ("... failed; retrying")
    main_logs: int = 0
    main_failures: int = 0
    seconds: float = 0.0

    def line(self, what: str) -> str:
        return (f"{what}: published {self.published}, completed {self.completed}, other "
                f"terminal {self.other_terminal}, lost {self.lost}, ran once too often "
                f"{self.ran_twice}, stalled {self.stalled} (end lost {self.lost_ends}; "
                f"{self.stalls_taken_back} more taken back); "
                f"{self.given_back} deliveries given back, {self.redelivered} delivered "
                f"again by the broker, {self.duplicates} duplicate deliveries refused, "
                f"{self.refused} publishes refused, {self.restarts} worker restarts "
                f"({self.shutdown_stalls} stalled by on_shutdown=stop, "
                f"{self.dropped_by_kombu} messages dropped by kombu, {self.never_received} "
                f"tasks never received); "
                f"outage logged {self.outage_logs}x by {CONCURRENCY} pool processes, "
                f"{self.main_logs} lines by the main process ({self.main_failures} failures "
                f"in full); all "
                f"terminal {self.seconds:.1f} s after the fault began")


def _reconnect(app: Celery) -> None:
    """Let the app's pooled broker connections that a killed broker closed fail once here,
    not in the ping that tells a (re)started worker is up: redis-py reconnects them at
    their next use."""
    for _ in range(3):
        try:
            app.control.ping(timeout=0.05)
            return
        except Exception:  # noqa: BLE001,S112 - a connection closed by the broker's death
            continue


def run(tmp_path: Path, app: Celery, env: dict[str, str],
        fault: Callable[[Callable[[], list[str]]], None], idle: bool = False,
        task: str = "short", runs: int = 1, supervised: bool = False,
        drained: Callable[[], bool] | None = None) -> Figures:
    """Publish ``LOAD`` short tasks to a real prefork worker; once a quarter finished (all
    of them with ``idle``: then the pool processes meet the outage starting tasks, not
    ending them), run
    ``fault(publish)`` (``publish()`` sends ``DURING`` more); wait until all are terminal.
    ``supervised``: a worker that exits is started again (as systemd or Kubernetes would),
    otherwise it must not exit. ``drained()``: the broker holds no message any more (queued
    or unacknowledged); the wait then ends once it has been so, with no task ending, for
    ``RESTORE_S``: tasks still not terminal then can no longer run (the broker lost them)."""
    marks, given = tmp_path / "marks", tmp_path / "given"
    marks.mkdir()
    given.mkdir()
    jobbers = install(app)
    short = app.tasks[f"{app.main}.{task}"]
    figures = Figures()

    def start() -> Worker:
        _reconnect(app)
        return start_worker(app, "tests.integration.fault_proj", tmp_path,
                            concurrency=CONCURRENCY,
                            env={**env, "FAULT_PROJ_MARKS": str(marks),
                                 "FAULT_PROJ_GIVEN": str(given),
                                 "FAULT_PROJ_LOST_AFTER": str(LOST_AFTER_S)})

    workers = [start()]

    def supervise() -> None:
        if workers[-1].proc.poll() is not None:
            assert supervised, f"the worker exited:\n{workers[-1].log[-3000:]}"
            workers.append(start())
            figures.restarts += 1

    try:
        with Beat(jobbers, interval=0.5):
            # ignore_result: a publish does not subscribe to its result (the Redis result
            # backend would unsubscribe when the handle is collected, after the servers stop)
            ids = [short.apply_async((0.02,), ignore_result=True).id for _ in range(LOAD)]

            def finished() -> int:
                return sum(1 for i in ids
                           if (r := jobbers.get(i)) is not None and r.state in TERMINAL)

            def publish() -> list[str]:
                more = []
                for _ in range(DURING):
                    try:
                        more.append(short.apply_async((0.02,), ignore_result=True).id)
                    except Exception:  # noqa: BLE001 - a broker that refuses: counted
                        figures.refused += 1
                ids.extend(more)
                return more

            wait_for(lambda: finished() >= (LOAD if idle else LOAD // 4), timeout=30,
                     interval=0.1, message="the load to be under way")
            began = time.monotonic()
            fault(publish)
            progress = [0, time.monotonic()]

            def settled() -> bool:
                supervise()
                done = finished()
                if done == len(ids):
                    return True
                if done != progress[0] or drained is None or not drained():
                    progress[:] = [done, time.monotonic()]
                return time.monotonic() - progress[1] > RESTORE_S

            try:
                wait_for(settled, timeout=60, interval=0.25,
                         message="every task to be terminal")
            except AssertionError as exc:
                runs_of = executions(marks)
                left = [(i, r.state.value if (r := jobbers.get(i)) else "no record",
                         runs_of.get(i, 0)) for i in ids
                        if (r := jobbers.get(i)) is None or r.state not in TERMINAL]
                raise AssertionError(f"{exc}: (id, state, runs) of the {len(left)} not "
                                     f"terminal: {left[:20]}") from None
            figures.seconds = time.monotonic() - began
    finally:
        for worker in workers:
            worker.stop()
    figures.count(jobbers, ids, marks, runs)
    text = "".join(worker.log for worker in workers)
    figures.outage_logs = text.count(OUTAGE_LINE)
    figures.duplicates = text.count("(duplicate or stale delivery)")
    figures.given_back = sum(1 for _ in given.iterdir())
    figures.redelivered = (text.count(" received\n") - figures.published * runs
                           - figures.duplicates - figures.given_back)
    figures.main_logs = sum(text.count(f"{what}: the jobbers state store")
                            for what in ("liveness refresh", "scheduler pass"))
    figures.main_failures = text.count("failed; retrying")
    figures.shutdown_stalls = sum(1 for i in ids for t in jobbers.history(i)
                                  if t.to_state is S.STALLED
                                  and "(on_shutdown=stop)" in (t.reason or ""))
    runs_of = executions(marks)
    figures.never_received = sum(1 for i in ids if runs_of.get(i, 0) == 0
                                 and f"[{i}] received" not in text)
    # a logged error (its traceback up to the next log line) out of kombu's bookkeeping of
    # a message it had taken off the queue (QoS.append, Redis transport)
    figures.dropped_by_kombu = sum(
        1 for record in re.finditer(r"\n\[20\d\d-[^\n]*\n((?:(?!\[20\d\d-).*\n)*)", text)
        if re.search(r'kombu/transport/redis\.py", line \d+, in append\n', record.group(1)))
    _close_clients(jobbers)
    return figures


def _close_clients(jobbers: Any) -> None:
    """Close the store's connections of this process to the servers the test is about to
    stop, and collect what kombu dropped without closing it (a channel that met a killed
    broker forgets its connection pool, sockets open): otherwise a later garbage
    collection, in another test, reports the unclosed sockets. (The app's own broker pools
    are kombu's, shared by every app of the same broker URL: left alone.)"""
    jobbers.store.client.connection_pool.disconnect()
    _collect_dropped()


def _collect_dropped() -> None:
    """Collect the connection pools kombu dropped, sockets open, when its broker died."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()


def check(figures: Figures, killed: bool, logged: bool = True,
          gave_back: bool = True, refused: bool = False) -> None:
    assert figures.lost == 0, figures
    if not refused:
        assert figures.refused == 0, figures
    assert figures.ran_twice == 0, figures
    # a kill may lose the last second of writes (AOF fsync every second): an end lost so is
    # found and the task stalled; nothing else ends other than completed
    assert figures.completed + figures.lost_ends == figures.published, figures
    if not killed:
        assert figures.lost_ends == 0, figures
    assert (1 if logged else 0) <= figures.outage_logs <= CONCURRENCY, figures
    assert figures.main_logs <= 4, figures
    if gave_back:
        assert figures.given_back > 0, figures
    assert figures.main_failures == 0, figures


def kill_and_restart(store: RestartableRedis, during: bool = True
                     ) -> Callable[[Callable[[], list[str]]], None]:
    """``during``: publish ``DURING`` more while the store is away (not when it is the
    broker too: a publish then fails)."""
    def fault(publish: Callable[[], list[str]]) -> None:
        started = time.monotonic()
        store.kill()
        if during:
            publish()  # their submissions cannot be recorded: the worker records them
        time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - started)))  # the outage itself
        store.restart()

    return fault


def pause(store: RestartableRedis) -> Callable[[Callable[[], list[str]]], None]:
    def fault(publish: Callable[[], list[str]]) -> None:
        pid = store.server.proc.pid if store.server.proc else 0
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(OUTAGE_S)  # the outage itself: nothing to poll meanwhile
        finally:
            os.kill(pid, signal.SIGCONT)

    return fault


def _redis_layout(store: RestartableRedis, broker: RestartableRedis, name: str,
                  acks_late: bool, query: str = "",
                  restore: float | None = None) -> tuple[Celery, dict[str, str]]:
    url = store.url() + query
    app = fault_proj.build(broker.url(), store=url, name=name,
                           lost_after=LOST_AFTER_S, acks_late=acks_late, restore=restore)
    return app, {"FAULT_PROJ_BROKER": broker.url(), "FAULT_PROJ_STORE": url,
                 "FAULT_PROJ_NAME": name, "FAULT_PROJ_ACKS_LATE": "1" if acks_late else "",
                 "FAULT_PROJ_RESTORE": str(restore) if restore else ""}


def _rabbit_layout(store: RestartableRedis, results: RestartableRedis, rabbitmq: RabbitVhost,
                   name: str, acks_late: bool, query: str = "") -> tuple[Celery, dict[str, str]]:
    url = store.url() + query
    app = fault_proj.build(rabbitmq.url, store=url, name=name,
                           backend=results.url(), lost_after=LOST_AFTER_S,
                           acks_late=acks_late)
    return app, {"FAULT_PROJ_BROKER": rabbitmq.url, "FAULT_PROJ_STORE": url,
                 "FAULT_PROJ_BACKEND": results.url(), "FAULT_PROJ_NAME": name,
                 "FAULT_PROJ_ACKS_LATE": "1" if acks_late else ""}


#: When the fault begins: under load (the pool processes meet it mostly as their tasks end:
#: they hold the outcomes), or with the worker idle (the tasks published meanwhile meet it
#: as they start: they are given back).
WHEN = pytest.mark.parametrize("idle", [False, True], ids=["busy", "idle"])


@WHEN
@ACKS
def test_store_killed_and_restarted_redis_broker(tmp_path: Path, acks_late: bool,
                                                 idle: bool) -> None:
    with restartable_redis() as store, restartable_redis() as broker:
        app, env = _redis_layout(store, broker, f"outkill{int(acks_late)}{int(idle)}",
                                 acks_late)
        figures = run(tmp_path, app, env, kill_and_restart(store), idle)
    print("\n" + figures.line(f"Redis broker, store killed {OUTAGE_S:g} s, "
                              f"acks_late={acks_late}, {'idle' if idle else 'busy'}"))
    check(figures, killed=True, gave_back=idle)


# serial: whether a step meets the pause depends on timing that parallel tests upset (the paused
# store met no step, or a task was stalled, twice under pytest-xdist; scripts/test)
@pytest.mark.serial
@pytest.mark.parametrize("socket_timeout", [None, 1], ids=["no_timeout", "socket_timeout"])
def test_store_paused_redis_broker(tmp_path: Path, socket_timeout: int | None) -> None:
    """Without a socket timeout a step waits, blocked, until the store answers again;
    with one, the steps in flight time out (their start may be applied when the server
    resumes: the given-back message takes it back) and the next ones are given back."""
    with restartable_redis() as store, restartable_redis() as broker:
        query = f"?socket_timeout={socket_timeout}" if socket_timeout else ""
        app, env = _redis_layout(store, broker, f"outpause{socket_timeout or 0}", False,
                                 query)
        figures = run(tmp_path, app, env, pause(store))
    print("\n" + figures.line(f"Redis broker, store paused {OUTAGE_S:g} s, "
                              f"socket_timeout={socket_timeout}"))
    check(figures, killed=False, logged=socket_timeout is not None, gave_back=False)


def test_one_shared_redis_paused(tmp_path: Path) -> None:
    """One Redis for the broker, the results and jobbers (the quickstart's layout), paused
    for ``OUTAGE_S``: Celery's consumer and jobbers' steps meet the same outage."""
    with restartable_redis() as shared:
        app, env = _redis_layout(shared, shared, "outsharedpause", False)
        figures = run(tmp_path, app, env, pause(shared))
    print("\n" + figures.line(f"one shared Redis paused {OUTAGE_S:g} s"))
    check(figures, killed=False, logged=False, gave_back=False)


def out_of_memory(store: RestartableRedis) -> Callable[[Callable[[], list[str]]], None]:
    """``publish()`` runs during the fault: with the store alone full, the tasks are
    published unrecorded (the worker records them); with the broker full too, the broker
    refuses them (counted as refused, not published)."""
    def fault(publish: Callable[[], list[str]]) -> None:
        started = time.monotonic()
        client = redis.Redis(port=store.port)
        try:
            client.config_set("maxmemory", 1)  # noeviction: every write refused with OOM
            publish()
            time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - started)))
            client.config_set("maxmemory", 0)
        finally:
            client.close()

    return fault


@WHEN
def test_store_killed_and_restarted_under_retries(tmp_path: Path, idle: bool) -> None:
    """Tasks that retry once (an immediate retry: ``started -> unsubmitted``, then a new
    message): a retry step the store cannot take is held like an end, not lost."""
    with restartable_redis() as store, restartable_redis() as broker:
        app, env = _redis_layout(store, broker, f"outretry{int(idle)}", False)
        figures = run(tmp_path, app, env, kill_and_restart(store), idle, "retrying", runs=2)
    print("\n" + figures.line(f"Redis broker, store killed {OUTAGE_S:g} s, tasks retrying "
                              f"once, {'idle' if idle else 'busy'}"))
    check(figures, killed=True, gave_back=idle)


def test_store_out_of_memory_redis_broker(tmp_path: Path) -> None:
    """The store refusing writes (``maxmemory``, ``noeviction``): the worker counts the
    refusal as an outage (``jobbers_celery.store.UNREACHABLE`` lists it)."""
    with restartable_redis() as store, restartable_redis() as broker:
        app, env = _redis_layout(store, broker, "outoom", False)
        figures = run(tmp_path, app, env, out_of_memory(store))
    print("\n" + figures.line(f"Redis broker, store out of memory {OUTAGE_S:g} s"))
    # a refused write is known not to have applied, so the steps' own wait may outlast the
    # refusal: whether a message is given back depends on the timing, not checked here
    check(figures, killed=False, gave_back=False)


#: The full acks x timing matrix runs on the Redis broker; RabbitMQ gets its two corners.
RABBIT_CORNERS = pytest.mark.parametrize(("acks_late", "idle"), [(False, False), (True, True)],
                                         ids=["early_ack-busy", "acks_late-idle"])


@pytest.mark.rabbitmq
@RABBIT_CORNERS
def test_store_killed_and_restarted_rabbitmq_broker(tmp_path: Path, rabbitmq: RabbitVhost,
                                                    acks_late: bool, idle: bool) -> None:
    rabbitmq.reset()
    try:
        with restartable_redis() as store, restartable_redis() as results:
            app, env = _rabbit_layout(store, results, rabbitmq,
                                      f"outrkill{int(acks_late)}{int(idle)}", acks_late)
            figures = run(tmp_path, app, env, kill_and_restart(store), idle)
    finally:
        rabbitmq.reset()
    print("\n" + figures.line(f"RabbitMQ broker, store killed {OUTAGE_S:g} s, "
                              f"acks_late={acks_late}, {'idle' if idle else 'busy'}"))
    check(figures, killed=True, gave_back=idle)


# serial: whether a step meets the pause depends on timing that parallel tests upset (the paused
# store met no step, or a task was stalled, twice under pytest-xdist; scripts/test)
@pytest.mark.serial
@pytest.mark.rabbitmq
@pytest.mark.parametrize("socket_timeout", [1], ids=["socket_timeout"])
def test_store_paused_rabbitmq_broker(tmp_path: Path, rabbitmq: RabbitVhost,
                                      socket_timeout: int | None) -> None:
    rabbitmq.reset()
    try:
        with restartable_redis() as store, restartable_redis() as results:
            query = f"?socket_timeout={socket_timeout}" if socket_timeout else ""
            app, env = _rabbit_layout(store, results, rabbitmq,
                                      f"outrpause{socket_timeout or 0}", False, query)
            figures = run(tmp_path, app, env, pause(store))
    finally:
        rabbitmq.reset()
    print("\n" + figures.line(f"RabbitMQ broker, store paused {OUTAGE_S:g} s, "
                              f"socket_timeout={socket_timeout}"))
    check(figures, killed=False, logged=socket_timeout is not None, gave_back=False)


# ---------------------------------------------------------------- a start recorded after all


def _given_back(proj: Any, header: str) -> tuple[Any, str]:
    """A task whose ``started`` step was recorded for worker incarnation ``ghost`` (its
    reply lost in an outage), and the message that incarnation gave back, naming ``header``
    as the giver; published without recording (as a worker gives a message back)."""
    jobbers = get_jobbers(proj.app)
    task_id = uuid.uuid4().hex
    store = jobbers.store
    assert store.step(task_id, S.SUBMITTED, sources=(S.UNSUBMITTED,),
                      create={"name": "proj.add", "queue": "celery"}, name="proj.add").applied
    assert store.step(task_id, S.STARTED, start=True, wid="ghost:1:aaaaaa",
                      worker="ghost@localhost").applied
    with publisher.unrecorded_publish():
        proj.add.apply_async((2, 3), task_id=task_id, ignore_result=True,
                             headers={HEADER_GIVEN_BACK: header})
    return jobbers, task_id


# serial: the take-back and the cleaner's stall are both due at worker_lost_after; with
# the worker starved by parallel tests the cleaner came first once (scripts/test)
@pytest.mark.serial
def test_a_given_back_message_takes_back_the_start_its_giver_recorded(proj: Any,
                                                                      worker_factory: Any) -> None:
    worker_factory()
    jobbers, task_id = _given_back(proj, "ghost:1:aaaaaa/0")
    # its start entered ``ghost`` in the workers set: the take-back waits until it is gone
    # (jobbers_worker_lost_after, 3 s here), the message put back meanwhile
    wait_for(lambda: (r := jobbers.get(task_id)) is not None and r.state is S.COMPLETED,
             timeout=40, message="the given-back task to complete")
    record = jobbers.get(task_id)
    assert record is not None
    assert record.attempt == 2
    steps = [(t.from_state, t.to_state) for t in jobbers.history(task_id)]
    assert steps[-4:] == [(S.STARTED, S.UNSUBMITTED), (S.UNSUBMITTED, S.SUBMITTED),
                          (S.SUBMITTED, S.STARTED), (S.STARTED, S.COMPLETED)], steps


@pytest.mark.parametrize("header", ["other:1:bbbbbb/0", "ghost:1:aaaaaa/1"],
                         ids=["another_giver", "another_retry"])
def test_a_given_back_message_leaves_a_start_it_does_not_hold(proj: Any, worker_factory: Any,
                                                              header: str) -> None:
    worker = worker_factory()
    jobbers, task_id = _given_back(proj, header)
    wait_for(lambda: f"not running proj.add[{task_id}]: it is started" in worker.log,
             message="the delivery to be refused")
    record = jobbers.get(task_id)
    assert record is not None
    assert record.state is S.STARTED
    assert record.attempt == 1



#: A Redis broker's ``visibility_timeout`` in the tests that kill it: the messages the worker
#: had taken when it died come back this long after their delivery (see
#: test_plain_celery_redis_broker_killed_and_restarted).
RESTORE_S = 8.0


def check_shared(figures: Figures, killed: bool, refused: bool = False) -> None:
    """What holds when the Redis that fails is the broker too: Celery's worker may exit
    (once: the test restarts it), kombu may drop a message it was taking; jobbers loses and
    repeats nothing."""
    assert figures.ran_twice == 0, figures
    assert figures.restarts <= 1, figures
    # a task lost is one kombu dropped: no worker received it, and the broker holds it no
    # more (``drained``): a message leaves the queue only by kombu's BRPOP, so kombu took it
    # and never handed it to Celery (its bookkeeping refused, or the server gone before it
    # was written); its record stays submitted
    assert figures.lost == figures.never_received, figures
    assert figures.other_terminal.get("submitted", 0) == figures.lost, figures
    if not figures.restarts and not figures.lost:
        # the pool processes meet the outage only with a task in flight when it began: the
        # consumer stops with the broker
        check(figures, killed=killed, logged=False, gave_back=False, refused=refused)
        return
    # the worker's exit interrupted task bodies: stalled by their on_shutdown=stop policy
    assert set(figures.other_terminal) <= {"stalled", "submitted"}, figures
    assert figures.stalled == figures.shutdown_stalls, figures
    assert (figures.completed + figures.shutdown_stalls + figures.lost
            == figures.published), figures
    if not refused:
        assert figures.refused == 0, figures


def _drained(port: int) -> Callable[[], bool]:
    """The broker on ``port`` holds no message, queued or unacknowledged."""
    def drained() -> bool:
        client = redis.Redis(port=port)
        try:
            return not client.llen("celery") and not client.hlen("unacked")
        finally:
            client.close()

    return drained


def test_one_shared_redis_killed_and_restarted(tmp_path: Path) -> None:
    """One Redis for the broker, the results and jobbers, killed and restarted under load:
    nothing is published meanwhile (the broker is down: a publish fails for the client).

    The messages the worker's consumer had taken but not handed to a pool process when the
    broker died (its prefetch: 16) cannot be restored then (kombu restores them on the dead
    connection) and stay in kombu's ``unacked`` hash until their ``visibility_timeout``, an
    hour by default: plain Celery, see test_plain_celery_redis_broker_killed_and_restarted.
    The worker here uses ``RESTORE_S`` with a sweep every second, as the docs advise. A
    message kombu could not mark acknowledged when the broker died comes back the same way;
    its task has ended, so jobbers refuses it at start (a duplicate, not run twice). A
    message a pool process could not give back (the broker is down) is held until the
    broker takes it.

    Now and then (1 run in 6 or so) the worker exits instead of reconnecting: kombu's
    channel, closed after the connection error, restores its unacknowledged messages
    through a connection pool it has already dropped (``AttributeError: 'NoneType' object
    has no attribute 'hostname'`` in ``_connparams``, "Unrecoverable error"; Celery alone
    too, kombu issues #582, #970). The test restarts it, as a supervisor would; the task
    bodies its shutdown interrupted end ``stalled`` (``on_shutdown=stop``). Should kombu
    drop a message it was taking when the server died (``BRPOP`` answered, its ``unacked``
    bookkeeping not written), that task is lost, by kombu: ``check_shared`` allows exactly
    those.

    The server runs with ``appendfsync always``: a SIGKILL then loses no write Redis
    acknowledged, so the figures count what jobbers and Celery do, not a lost tail of the
    AOF (with ``everysec``, writes Redis postpones during a slow background fsync are lost
    with the process; a lost ``BRPOP`` would put back the message of a task that ran)."""
    with restartable_redis(appendfsync="always") as shared:
        app, env = _redis_layout(shared, shared, "outsharedkill", False, restore=RESTORE_S)
        figures = run(tmp_path, app, env, kill_and_restart(shared, during=False),
                      supervised=True, drained=_drained(shared.port))
    print("\n" + figures.line(f"one shared Redis killed {OUTAGE_S:g} s"))
    check_shared(figures, killed=True)


def test_one_shared_redis_out_of_memory(tmp_path: Path) -> None:
    """One Redis for the broker, the results and jobbers, refusing writes (``maxmemory``,
    ``noeviction``) for ``OUTAGE_S``: publishes meanwhile are refused to the client (counted
    as refused: the client knows). No task runs twice.

    Whether the worker lives through it is Celery's matter, decided by timing: kombu's
    writes in a ``MULTI`` (an early ack, the bookkeeping of a new delivery, the remote
    control mailbox) are refused too, and kombu does not take ``OutOfMemoryError`` for a
    connection error, so the worker exits ("Unrecoverable error"; Celery alone does the
    same). It exited in about half of the runs; the test restarts it, as a supervisor would.
    Then the task bodies its shutdown interrupted end ``stalled`` (``on_shutdown=stop``,
    recorded once memory is freed), the outcomes its pool processes held are recorded, and
    a message it could not give back is held until the broker takes it. And one task can be
    lost, by kombu: when the refused write is the bookkeeping of a delivery, the message
    kombu took off the queue (``BRPOP``) is gone with the worker, never handed to Celery;
    its record stays ``submitted``. The test asserts exactly that: every lost task is one
    no worker received, at most one per such exit, and the broker holds no message."""
    with restartable_redis() as shared:
        app, env = _redis_layout(shared, shared, "outsharedoom", False, restore=RESTORE_S)
        figures = run(tmp_path, app, env, out_of_memory(shared), supervised=True,
                      drained=_drained(shared.port))
    print("\n" + figures.line(f"one shared Redis out of memory {OUTAGE_S:g} s"))
    check_shared(figures, killed=False, refused=True)


@pytest.mark.rabbitmq
def test_store_out_of_memory_rabbitmq_broker(tmp_path: Path, rabbitmq: RabbitVhost) -> None:
    """As test_store_out_of_memory_redis_broker, the broker RabbitMQ (results on another
    Redis)."""
    rabbitmq.reset()
    try:
        with restartable_redis() as store, restartable_redis() as results:
            app, env = _rabbit_layout(store, results, rabbitmq, "outroom", False)
            figures = run(tmp_path, app, env, out_of_memory(store))
    finally:
        rabbitmq.reset()
    print("\n" + figures.line(f"RabbitMQ broker, store out of memory {OUTAGE_S:g} s"))
    check(figures, killed=False, gave_back=False)


# serial: what kombu had prefetched when the broker died depends on the timing of plain
# Celery, which parallel tests upset (stuck was 0 once; scripts/test)
@pytest.mark.serial
@pytest.mark.parametrize("restore", [None, RESTORE_S], ids=["kombu_defaults", "restore"])
def test_plain_celery_redis_broker_killed_and_restarted(tmp_path: Path,
                                                        restore: float | None) -> None:
    """Celery and kombu alone (no jobbers): a Redis broker killed and restarted under load.

    The worker reconnects and consumes again, but the messages its consumer had taken
    (prefetched, up to 4 per pool process, not yet handed to the pool) when the broker
    died are not restored: kombu restores them on the dead connection, and they stay in
    its ``unacked`` hash until their ``visibility_timeout`` (an hour by default), checked
    about every 100 s. With ``restore`` (``visibility_timeout``, swept every second) they
    run ``restore`` seconds after their delivery. A message whose early ack was lost with
    the broker (``Couldn't ack``) comes back the same way, and plain Celery runs it again."""
    marks = tmp_path / "marks"
    marks.mkdir()
    with restartable_redis(appendfsync="always") as broker:
        app = plain_fault_proj.build(broker.url(), restore)
        env = {"PLAIN_PROJ_BROKER": broker.url(), "PLAIN_PROJ_MARKS": str(marks),
               "PLAIN_PROJ_RESTORE": str(restore) if restore else ""}

        def start() -> Worker:
            _reconnect(app)
            return start_worker(app, "tests.integration.plain_fault_proj", tmp_path,
                                concurrency=CONCURRENCY, env=env)

        workers = [start()]
        client = redis.Redis(port=broker.port)

        def unacked() -> set[str]:
            """The tasks of the messages in kombu's unacked hash."""
            return {json.loads(raw)[0]["headers"]["id"] for raw in client.hvals("unacked")}

        try:
            short = app.tasks["plain.short"]
            # tasks of 0.1 s: the kill finds a backlog, so the consumer holds prefetched
            # messages (at 0.02 s a quiet machine had run the whole queue by then)
            ids = [short.delay(0.1).id for _ in range(LOAD // 2)]
            wait_for(lambda: len(executions(marks)) >= LOAD // 8, timeout=30, interval=0.1,
                     message="the load to be under way")
            began = time.monotonic()
            broker.kill()
            time.sleep(OUTAGE_S)
            broker.restart()

            progress = [0, time.monotonic()]

            def settled() -> bool:
                """Nothing left to deliver (with ``restore``, nothing left unacknowledged
                either), and every task ran or its message sits in kombu's unacked hash, or
                nothing ran for 3 s (a message kombu dropped never runs). A worker that exits,
                as kombu's channel close may make it, is started again."""
                if workers[-1].proc.poll() is not None:
                    workers.append(start())
                ran = executions(marks)
                if len(ran) != progress[0] or client.llen("celery") \
                        or (restore and client.hlen("unacked")):
                    progress[:] = [len(ran), time.monotonic()]
                    return False
                return (set(ids) <= set(ran) | unacked()
                        or time.monotonic() - progress[1] > 3.0)

            wait_for(settled, timeout=40, interval=0.25, message="the broker to settle")
            seconds = time.monotonic() - began
            ran = executions(marks)
            held = unacked()  # read once: a message kombu restores meanwhile counts once
            stuck = len(held - set(ran))
            acks_lost = len(held & set(ran))
            # neither run, nor queued, nor unacknowledged: taken off the queue by kombu's
            # BRPOP and never handed to Celery (the broker died before kombu recorded it)
            dropped = len(set(ids) - set(ran) - held)
        finally:
            for worker in workers:
                worker.stop()
            client.close()
    _collect_dropped()
    never, twice = (sum(1 for i in ids if ran.get(i, 0) == 0),
                    sum(1 for i in ids if ran.get(i, 0) > 1))
    text = "".join(worker.log for worker in workers)
    acks_failed = text.count("Couldn't ack")
    print(f"\nplain Celery, Redis broker killed {OUTAGE_S:g} s, "
          f"{'visibility_timeout ' + format(restore, 'g') + ' s' if restore else 'kombu defaults'}"
          f": published {len(ids)}, never ran {never} ({stuck} in kombu's unacked hash, "
          f"{dropped} dropped by kombu), ran twice {twice}; {acks_failed} acks "
          f"lost with the broker ({acks_lost} still unacked); {len(workers) - 1} worker "
          f"restarts; settled {seconds:.1f} s after the kill")
    assert never == stuck + dropped
    assert dropped <= 1  # the one message a BRPOP had taken when the broker died
    if restore:
        assert stuck == 0
        # kombu gives back any message unacknowledged for ``restore`` seconds: one whose ack
        # was lost with the broker, and also one a busy worker had prefetched for that long
        # (seen with the machine loaded: 2 ran twice for 1 lost ack). The price of the
        # setting, documented; plain Celery's, not jobbers', so only counted here.
    else:
        assert stuck > 0  # the prefetched messages: still there, an hour from now
        assert twice <= acks_failed
