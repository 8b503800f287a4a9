"""The workers and queues as an operator sees them: each queue's depth and the age of its
oldest message, each live worker with its pool, queues and running tasks.

What Celery knows comes from Celery: ``inspect stats``, ``active`` and ``active_queues``
(one broadcast each, sent together, each waiting ``timeout``), joined with jobbers' own
liveness (:meth:`Jobbers.workers`) and the running tasks' records (heartbeat, progress).
The broker is asked through kombu, never by consuming a message:

- **Redis**: a queue is a list per priority step (``<name>``, ``<name>\\x06\\x163``...:
  kombu's ``_q_for_pri``) under the transport's ``global_keyprefix`` (kombu's own channel
  client adds it); a message is pushed at the head and taken from the tail, so the oldest
  is the tail (``LINDEX -1``) of each list. Its age is the message's
  ``jobbers_published_at`` header (the jobbers store's clock), else its record's
  submission.
- **RabbitMQ** (and any other transport): a passive ``queue_declare`` gives the depth. AMQP
  cannot read a message without taking it (and Celery sets no ``timestamp`` property for
  the management API's ``head_message_timestamp``), so the age comes from jobbers' records:
  the oldest task recorded ``submitted`` to that queue and not started, said so in the
  note (a message a worker has fetched but not started counts too).

Every text here came from outside (hostnames, task names, queue names): bounded here,
escaped where it is shown.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from jobbers_celery.core.printable import escaped_logger
from jobbers_celery.core.records import TaskRecord, WorkerInfo
from jobbers_celery.lifecycle.payload import HEADER_PUBLISHED_AT

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from celery import Celery

__all__ = ["QueueInfo", "RunningTask", "WorkerView", "queue_names", "read_queues",
           "read_workers"]

log = escaped_logger("jobbers.fleet")

#: Characters kept of a hostname, task or queue name shown.
MAX_TEXT = 200
#: Queues read at most, running tasks per worker read at most.
MAX_QUEUES = 100
MAX_RUNNING = 50
#: Seconds each ``inspect`` broadcast waits for the workers' replies.
INSPECT_TIMEOUT_S = 1.0
#: What the age of a RabbitMQ queue's oldest message is, and when it is not known.
AGE_FROM_RECORDS = ("oldest: from jobbers' records (the oldest task submitted to it and not "
                    "started); AMQP cannot read a message without taking it")
NO_AGE_AMQP = "age not known: no jobbers record of a task waiting in it"


def _cut(text: object) -> str:
    return str(text)[:MAX_TEXT]


@dataclass(frozen=True, slots=True)
class QueueInfo:
    """A queue: ``depth`` (``None``: the broker did not say; ``note`` says why), the age
    of its oldest message in seconds and that message's task id when known, whether it is
    paused, and the workers consuming it (their ``active_queues``)."""

    name: str
    depth: int | None
    oldest_age_s: float | None = None
    oldest_task_id: str | None = None
    paused: bool = False
    consumers: list[str] = field(default_factory=list)
    note: str = ""


@dataclass(frozen=True, slots=True)
class RunningTask:
    """A task a worker runs now (``inspect active``) with what its record says."""

    task_id: str
    name: str
    started_at: datetime | None
    heartbeat_at: datetime | None
    progress: Any
    attempt: int | None


@dataclass(frozen=True, slots=True)
class WorkerView:
    """A worker: from Celery (``responded``: it answered ``inspect``; its pool, concurrency,
    queues, running tasks) and from jobbers' liveness (``liveness``: its incarnation, last
    seen), either of which may be missing."""

    hostname: str
    responded: bool
    pool: str | None = None
    concurrency: int | None = None
    pid: int | None = None
    queues: list[str] = field(default_factory=list)
    running: list[RunningTask] = field(default_factory=list)
    liveness: WorkerInfo | None = None


def _inspect(app: Celery, timeout: float) -> tuple[dict[str, Any], dict[str, Any],
                                                   dict[str, Any]]:
    """``stats``, ``active`` and ``active_queues`` replies, asked at the same time."""
    def ask(method: str) -> dict[str, Any]:
        try:
            got = getattr(app.control.inspect(timeout=timeout), method)()
        except Exception as exc:  # noqa: BLE001 - the broker is away: no worker answers
            log.warning("inspect %s failed: %s", method, exc)
            return {}
        return got if isinstance(got, dict) else {}

    with ThreadPoolExecutor(3) as pool:
        stats, active, queues = pool.map(ask, ("stats", "active", "active_queues"))
    return stats, active, queues


def read_workers(app: Celery, liveness: list[WorkerInfo],
                 record: Callable[[str], TaskRecord | None],
                 timeout: float = INSPECT_TIMEOUT_S) -> list[WorkerView]:
    """Every worker that answered ``inspect`` or that jobbers' liveness sees alive,
    sorted by hostname (``record``: a task's record, for its heartbeat and progress)."""
    stats, active, queues = _inspect(app, timeout)
    by_host: dict[str, WorkerInfo] = {}
    for info in liveness:
        seen = by_host.get(info.hostname)
        if seen is None or info.last_seen_at > seen.last_seen_at:
            by_host[info.hostname] = info
    out = []
    for host in sorted(set(stats) | set(active) | set(queues) | set(by_host))[:MAX_QUEUES]:
        st = _dict(stats.get(host))
        pool = _dict(st.get("pool"))
        conc = pool.get("max-concurrency")
        running = []
        for item in (active.get(host) or [])[:MAX_RUNNING]:
            if not isinstance(item, dict):
                continue
            task_id = _cut(item.get("id", ""))
            rec = None
            try:
                rec = record(task_id) if task_id else None
            except Exception:  # a bad id, or the store is away: shown without the record
                log.debug("no record for %s", task_id, exc_info=True)
            running.append(RunningTask(
                task_id, _cut(item.get("name", "")),
                (rec.retried_at or rec.started_at) if rec else None,
                rec.heartbeat_at if rec else None, rec.progress if rec else None,
                rec.attempt if rec else None))
        consumed = [_cut(q.get("name", "")) for q in (queues.get(host) or [])
                    if isinstance(q, dict)]
        pid = st.get("pid")
        out.append(WorkerView(
            _cut(host), host in stats or host in active or host in queues,
            _pool_name(pool.get("implementation")),
            conc if isinstance(conc, int) else None,
            pid if isinstance(pid, int) else None, consumed, running, by_host.get(host)))
    return out


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _pool_name(impl: object) -> str | None:
    """``celery.concurrency.prefork:TaskPool`` -> ``prefork``."""
    if not isinstance(impl, str):
        return None
    return _cut(impl.rpartition(":")[0].rpartition(".")[2] or impl)


def queue_names(app: Celery, consumed: Iterable[str], paused: Iterable[str]) -> list[str]:
    """The queues to show: those the workers consume, the app's declared and routed
    queues and its default one, and the paused ones."""
    names = {app.conf.task_default_queue or "celery", *consumed, *paused}
    try:
        names |= set(app.amqp.queues)
    except Exception:  # an odd task_queues setting: the others still show
        log.debug("could not read the app's queues", exc_info=True)
    return sorted(n for n in names if isinstance(n, str) and n)[:MAX_QUEUES]


def read_queues(app: Celery, names: list[str], now_ms: int,
                record: Callable[[str], TaskRecord | None],
                oldest: Callable[[list[str]], dict[str, tuple[int, str]]] | None = None,
                ) -> list[QueueInfo]:
    """Depth and oldest message of each of ``names`` (see the module; ``oldest``: the
    oldest waiting task per queue from jobbers' records, for a broker that cannot say)."""
    try:
        with app.connection_for_read() as conn:
            conn.ensure_connection(max_retries=1)
            if conn.transport.driver_type == "redis":
                return [_redis_queue(conn.default_channel, n, now_ms, record) for n in names]
            infos = [_passive_queue(conn, n) for n in names]
    except Exception as exc:  # noqa: BLE001 - any broker error: shown per queue
        log.warning("could not read the broker's queues: %s", exc)
        why = f"the broker could not be read: {_cut(exc)}"
        return [QueueInfo(n, None, note=why) for n in names]
    return _with_record_ages(infos, now_ms, oldest)


def _with_record_ages(infos: list[QueueInfo], now_ms: int,
                      oldest: Callable[[list[str]], dict[str, tuple[int, str]]] | None,
                      ) -> list[QueueInfo]:
    waiting = [q.name for q in infos if q.depth]
    found = oldest(waiting) if oldest is not None and waiting else {}
    out = []
    for q in infos:
        got = found.get(q.name)
        if got is not None:
            q = QueueInfo(q.name, q.depth, max(0.0, (now_ms - got[0]) / 1000.0), got[1],
                          note=AGE_FROM_RECORDS)
        elif q.depth:
            q = QueueInfo(q.name, q.depth, note=NO_AGE_AMQP)
        out.append(q)
    return out


def _redis_queue(channel: Any, name: str, now_ms: int,
                 record: Callable[[str], TaskRecord | None]) -> QueueInfo:
    keys = [channel._q_for_pri(name, p) for p in channel.priority_steps]
    # kombu's client prefixes the commands kombu sends (LLEN), not LINDEX: that one here
    prefix = getattr(channel, "global_keyprefix", "") or ""
    pipe = channel.client.pipeline()
    for key in dict.fromkeys(keys):
        pipe.llen(key)
        pipe.lindex(prefix + key, -1)
    replies = pipe.execute()
    depth = sum(int(n or 0) for n in replies[0::2])
    oldest: tuple[float, str] | None = None
    for raw in replies[1::2]:
        if raw is None:
            continue
        got = _message_age(raw, now_ms, record)
        if got is not None and (oldest is None or got[0] > oldest[0]):
            oldest = got
    if oldest is None:
        return QueueInfo(name, depth, note="" if depth == 0 else "age not known")
    return QueueInfo(name, depth, oldest[0], oldest[1])


def _message_age(raw: bytes | str, now_ms: int,
                 record: Callable[[str], TaskRecord | None]) -> tuple[float, str] | None:
    """(age s, task id) of a kombu Redis message (its JSON envelope; the body is never
    decoded), or ``None``."""
    try:
        msg = json.loads(raw[:1_000_000])  # an envelope over 1 MB is cut: no age then
        headers = msg.get("headers") or {}
    except (ValueError, AttributeError, TypeError):
        return None
    task_id = _cut(headers.get("id") or "")
    at = headers.get(HEADER_PUBLISHED_AT)
    if isinstance(at, int | float) and not isinstance(at, bool):
        return max(0.0, (now_ms - float(at)) / 1000.0), task_id
    if task_id:
        try:
            rec = record(task_id)
        except Exception:  # noqa: BLE001 - the store is away: no age
            rec = None
        if rec is not None and rec.submitted_at is not None:
            return max(0.0, now_ms / 1000.0 - rec.submitted_at.timestamp()), task_id
    return None


def _passive_queue(conn: Any, name: str) -> QueueInfo:
    channel = conn.channel()  # a passive declare of a missing queue closes its channel
    try:
        _, depth, _ = channel.queue_declare(queue=name, passive=True)
        return QueueInfo(name, int(depth))
    except Exception as exc:  # noqa: BLE001 - a missing queue (404) or a broker error
        return QueueInfo(name, None, note=f"not declared on the broker ({_cut(exc)[:80]})")
    finally:
        try:
            channel.close()
        except Exception:
            log.debug("could not close a channel", exc_info=True)
