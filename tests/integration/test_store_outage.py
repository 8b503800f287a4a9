"""The state store away for longer than a worker waits for it, under a load of a few hundred
tasks: no task is lost, none runs twice because of it, and the outage is logged once per
worker process, not per task.

jobbers' Redis is a server of its own, separate from the broker (a Redis broker, or
RabbitMQ), and is either killed (SIGKILL) and restarted, or paused (SIGSTOP, then SIGCONT),
for ``OUTAGE_S``: longer than ``jobbers_worker_lost_after`` (``LOST_AFTER_S``, the time a
worker's step waits out an outage before giving the message back). With the kill, more
tasks are published while the store is away (their submissions cannot be recorded; the
worker records them late). Executions are counted from marker files, not from the Redis
that fails. The figures are printed (``pytest -s`` shows them).
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

from jobbers_celery import TaskState, get_jobbers, install, recorder
from jobbers_celery.states import TERMINAL
from jobbers_celery.task import HEADER_GIVEN_BACK
from tests.conftest import start_worker, wait_for
from tests.integration import fault_proj
from tests.integration.beat_helpers import Beat
from tests.integration.topology_servers import (
    BatchOutcome,
    RestartableRedis,
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
                f"{self.ran_twice}, stalled {self.stalled} (end lost {self.lost_ends}); "
                f"{self.given_back} deliveries given back; "
                f"outage logged {self.outage_logs}x by {CONCURRENCY} pool processes, "
                f"{self.main_logs} lines by the main process ({self.main_failures} failures "
                f"in full); all "
                f"terminal {self.seconds:.1f} s after the fault began")


def run(tmp_path: Path, app: Celery, env: dict[str, str],
        fault: Callable[[Callable[[], list[str]]], None], idle: bool = False,
        task: str = "short", runs: int = 1) -> Figures:
    """Publish ``LOAD`` short tasks to a real prefork worker; once a quarter finished (all
    of them with ``idle``: then the pool processes meet the outage starting tasks, not
    ending them), run
    ``fault(publish)`` (``publish()`` sends ``DURING`` more); wait until all are terminal."""
    marks = tmp_path / "marks"
    marks.mkdir()
    jobbers = install(app)
    short = app.tasks[f"{app.main}.{task}"]
    figures = Figures()
    worker = start_worker(app, "tests.integration.fault_proj", tmp_path,
                          concurrency=CONCURRENCY,
                          env={**env, "FAULT_PROJ_MARKS": str(marks),
                               "FAULT_PROJ_LOST_AFTER": str(LOST_AFTER_S)})
    try:
        with Beat(jobbers, interval=0.5):
            # ignore_result: a publish does not subscribe to its result (the Redis result
            # backend would unsubscribe when the handle is collected, after the servers stop)
            ids = [short.apply_async((0.02,), ignore_result=True).id for _ in range(LOAD)]

            def finished() -> int:
                return sum(1 for i in ids
                           if (r := jobbers.get(i)) is not None and r.state in TERMINAL)

            def publish() -> list[str]:
                more = [short.apply_async((0.02,), ignore_result=True).id
                        for _ in range(DURING)]
                ids.extend(more)
                return more

            wait_for(lambda: finished() >= (LOAD if idle else LOAD // 4), timeout=30,
                     interval=0.1, message="the load to be under way")
            began = time.monotonic()
            fault(publish)
            wait_for(lambda: finished() == len(ids), timeout=60, interval=0.25,
                     message="every task to be terminal")
            figures.seconds = time.monotonic() - began
    finally:
        worker.stop()
    figures.count(jobbers, ids, marks, runs)
    text = worker.log_path.read_text(errors="replace")
    figures.outage_logs = text.count(OUTAGE_LINE)
    figures.given_back = text.count(" received\n") - figures.published * runs
    figures.main_logs = sum(text.count(f"{what}: the jobbers state store")
                            for what in ("liveness refresh", "scheduler pass"))
    figures.main_failures = text.count("failed; retrying")
    return figures


def check(figures: Figures, killed: bool, logged: bool = True,
          gave_back: bool = True) -> None:
    assert figures.lost == 0, figures
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


def kill_and_restart(store: RestartableRedis) -> Callable[[Callable[[], list[str]]], None]:
    def fault(publish: Callable[[], list[str]]) -> None:
        started = time.monotonic()
        store.kill()
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
                  acks_late: bool, query: str = "") -> tuple[Celery, dict[str, str]]:
    url = store.url() + query
    app = fault_proj.build(broker.url(), store=url, name=name,
                           lost_after=LOST_AFTER_S, acks_late=acks_late)
    return app, {"FAULT_PROJ_BROKER": broker.url(), "FAULT_PROJ_STORE": url,
                 "FAULT_PROJ_NAME": name, "FAULT_PROJ_ACKS_LATE": "1" if acks_late else ""}


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
    for ``OUTAGE_S``: Celery's consumer and jobbers' steps meet the same outage. (Killed
    and restarted, the broker goes with it: kombu's worker does not come back by itself on
    this machine's kombu, a broker matter, not tested here.)"""
    with restartable_redis() as shared:
        app, env = _redis_layout(shared, shared, "outsharedpause", False)
        figures = run(tmp_path, app, env, pause(shared))
    print("\n" + figures.line(f"one shared Redis paused {OUTAGE_S:g} s"))
    check(figures, killed=False, logged=False, gave_back=False)


def out_of_memory(store: RestartableRedis) -> Callable[[Callable[[], list[str]]], None]:
    def fault(publish: Callable[[], list[str]]) -> None:
        started = time.monotonic()
        client = redis.Redis(port=store.port)
        try:
            client.config_set("maxmemory", 1)  # noeviction: every write refused with OOM
            publish()  # their submissions cannot be recorded: the worker records them
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
    with recorder.unrecorded_publish():
        proj.add.apply_async((2, 3), task_id=task_id, ignore_result=True,
                             headers={HEADER_GIVEN_BACK: header})
    return jobbers, task_id


def test_a_given_back_message_takes_back_the_start_its_giver_recorded(proj: Any,
                                                                      worker_factory: Any) -> None:
    worker_factory()
    jobbers, task_id = _given_back(proj, "ghost:1:aaaaaa/0")
    wait_for(lambda: (r := jobbers.get(task_id)) is not None and r.state is S.COMPLETED,
             message="the given-back task to complete")
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
