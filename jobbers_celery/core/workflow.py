"""A canvas as one unit: which workflow a message belongs to, and the workflow's state,
progress and history, derived from its members' records.

Celery does not name one root for every canvas (checked on Celery 5.7): the members of a
top-level group (or a chord's header) each have themselves as ``root_id`` and share the
``group`` header; a chain's links have the first link as root; a chord's callback has the
header member that completed last as root and parent; a group of chains leaves the group id
only on each chain's last link (its first link carries none). So jobbers names each
workflow by a *key* (:func:`workflow_key`): the ``root_id`` when it is another task, else
the group id (the message's, or its chain's last link's), else the task itself; a message
published by a running task (a chain's next link, a chord's callback, a ``replace``, a task
started from a task body) takes its publisher's key, carried in the ``jobbers_workflow``
header, so a whole nested canvas is one workflow.

State and history are derived on read from the members' records and histories (one logic,
nothing stored that could drift): see :func:`derive`. The one thing stored for the
workflow itself is the time it was cancelled as a whole (``cancelled_at``), so that its
members published later are cancelled as they are recorded.

Pure: the standard library only. Every id taken from a message is bounded here
(:func:`bounded_id`): an id over :data:`~jobbers_celery.core.intake.MAX_ID_CHARS` or with
no UTF-8 form is left out (the message is recorded, not indexed under it).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

from jobbers_celery.core.intake import identity_over_limits
from jobbers_celery.core.records import TaskRecord, Transition
from jobbers_celery.core.states import TaskState

__all__ = [
    "HEADER_WORKFLOW",
    "MAX_SUCCESSOR_SIGNATURES",
    "WORKFLOW_CANCELLED",
    "MemberRead",
    "Workflow",
    "WorkflowMember",
    "WorkflowRead",
    "WorkflowState",
    "WorkflowTransition",
    "aliases",
    "bounded_id",
    "derive",
    "links",
    "links_of_options",
    "role_of",
    "workflow_key",
]

#: The message header carrying the workflow key a member was recorded under, so that what
#: it publishes while it runs (and its retries) stays in the same workflow.
HEADER_WORKFLOW = "jobbers_workflow"
#: The history reason of a member cancelled as it is recorded: its workflow was cancelled.
WORKFLOW_CANCELLED = "its workflow was cancelled"
#: Signatures looked at to tell whether a member's successors are tracked tasks (a chain's
#: next step or a link may be a group or chord of many): past this, assumed not tracked.
MAX_SUCCESSOR_SIGNATURES = 64

S = TaskState
#: Members that failed for good unless resubmitted.
_FAILED = frozenset({S.FAILED, S.STALLED, S.DROPPED})
_RUNNING = frozenset({S.STARTED})
_PENDING = frozenset({S.UNSUBMITTED, S.SUBMITTED, S.SCHEDULED})


class WorkflowState(StrEnum):
    """Where a workflow is: running until nothing is left to run, then completed (its
    callback ran, or its last member completed), failed (a member failed for good) or
    cancelled."""

    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


@dataclass(frozen=True, slots=True)
class WorkflowMember:
    """One member: its record, its Celery parent and group, and its role (``"root"``: the
    task the workflow is named after; ``"header"``: a chord header member; ``"callback"``:
    a chord's body; ``"member"``: any other)."""

    record: TaskRecord
    parent_id: str | None
    group_id: str | None
    role: str


@dataclass(frozen=True, slots=True)
class WorkflowTransition:
    """One entry of a workflow's own history: the state it was in after an event of one
    of its members (``task_id``; ``None`` for the workflow itself, a cancel of the whole)."""

    at: datetime
    state: WorkflowState
    reason: str
    task_id: str | None


@dataclass(frozen=True, slots=True)
class Workflow:
    """A canvas as one unit. ``members`` by submission time, at most the read's limit
    (``truncated`` when there are more). ``state``, ``total`` and the counts cover every
    member, those read or not (counted in the store's indexes), ``pending`` also the
    successors expected but not recorded yet; ``history`` and ``blocking`` come from the
    members read. ``blocking``: the members that hold it up (failed, stalled or dropped
    ones; else the running ones; else the pending ones)."""

    root_id: str
    state: WorkflowState
    members: list[WorkflowMember]
    total: int
    completed: int
    failed: int
    running: int
    pending: int
    cancelled: int
    started_at: datetime | None
    ended_at: datetime | None
    elapsed: timedelta | None
    blocking: list[str]
    history: list[WorkflowTransition]
    truncated: bool


@dataclass(frozen=True, slots=True)
class MemberRead:
    """What the store reads of one member: its record and history, and the workflow
    fields recorded at its publish (``chord``: the id of the chord callback it is a
    header member of; ``successors``: it has tracked successors, a chain's next step or
    a link, that it publishes when it completes)."""

    record: TaskRecord
    history: list[Transition]
    chord: str | None = None
    successors: bool = False


@dataclass(frozen=True, slots=True)
class WorkflowRead:
    """What the store reads of one workflow: its key, its first ``limit`` members by
    submission time, how many it has in all, when it was cancelled as a whole, and, when
    there are more members than were read (``truncated``), how many of all its members are
    in each state (``states``: counted in the store's indexes, no record read)."""

    root_id: str
    members: list[MemberRead]
    total: int
    cancelled_at: datetime | None = None
    truncated: bool = field(default=False)
    states: Mapping[TaskState, int] | None = None


# ---------------------------------------------------------------------------- at publish
def bounded_id(value: Any) -> str | None:
    """``value`` as an id jobbers may record and index (a non-empty string within the
    intake limits), else ``None``."""
    if not isinstance(value, str) or not value:
        return None
    return None if identity_over_limits(value, None) else value


def _options(sig: Any) -> Mapping[str, Any]:
    options = sig.get("options") if isinstance(sig, Mapping) else None
    return options if isinstance(options, Mapping) else {}


def workflow_key(task_id: str, root_id: Any, group_id: Any, chain: Any = None,
                 header: Any = None) -> str:
    """The workflow a message belongs to, from its own headers: ``header`` (a key it was
    given, see :data:`HEADER_WORKFLOW`), else its root when that is another task, else its
    group (or its chain's last link's: a group of chains leaves it there only), else the
    task itself."""
    for candidate in (header, root_id if root_id != task_id else None, group_id):
        key = bounded_id(candidate)
        if key:
            return key
    if isinstance(chain, list) and chain:
        key = bounded_id(_options(chain[0]).get("group_id"))
        if key:
            return key
    return task_id


def _tracked(sigs: Iterable[Any], tracked: Callable[[str], bool]) -> bool:
    """Whether any of the signatures (walking groups, chords and chains, at most
    :data:`MAX_SUCCESSOR_SIGNATURES`) runs a task jobbers records."""
    todo = list(sigs)
    seen = 0
    while todo and seen < MAX_SUCCESSOR_SIGNATURES:
        sig = todo.pop()
        seen += 1
        if not isinstance(sig, Mapping):
            continue
        name = sig.get("task")
        raw = sig.get("kwargs")
        kwargs: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
        if name in ("celery.group", "celery.chain"):
            tasks = kwargs.get("tasks")
            todo.extend(tasks[:MAX_SUCCESSOR_SIGNATURES] if isinstance(tasks, list) else [])
        elif name == "celery.chord":
            header = kwargs.get("header")
            todo.extend(header[:MAX_SUCCESSOR_SIGNATURES] if isinstance(header, list)
                        else [header])
            todo.append(kwargs.get("body"))
        elif isinstance(name, str) and tracked(name):
            return True
    return False


def links(task_id: str, headers: Mapping[str, Any], body: Any, *,
          tracked: Callable[[str], bool] = lambda name: True,
          inherited: str | None = None, untracked_root: bool = False) -> dict[str, str]:
    """The workflow fields of a message about to be published (record field -> value),
    empty for a task that is no canvas member (its root itself, no parent, no group, no
    successor, no chord): ``wf`` its workflow key, ``root``, ``par``, ``grp`` Celery's
    ``root_id``, ``parent_id`` and ``group``, ``chd`` the chord callback's id (a header
    member), ``end`` the id of its chain's last link (what the chain's ``apply_async``
    returned), ``nxt`` ``"1"`` when it has successors jobbers records (``tracked``: whether a
    task name is one). ``inherited``: the key of the running task publishing it (its
    parent), which it joins. ``untracked_root``: its root is a task jobbers does not record
    (Celery's ``chord_unlock``, which publishes a chord's callback where the result backend
    counts no parts): not a key, its group is. Every id is bounded (:func:`bounded_id`)."""
    embed: Mapping[str, Any] = {}
    if isinstance(body, list | tuple) and len(body) == 3 and isinstance(body[2], Mapping):
        embed = body[2]
    root = bounded_id(headers.get("root_id"))
    parent = bounded_id(headers.get("parent_id"))
    group = bounded_id(headers.get("group"))
    found = embed.get("chain")
    chain: list[Any] = found if isinstance(found, list) else []
    found = embed.get("callbacks")
    callbacks: list[Any] = found if isinstance(found, list) else []
    chord = embed.get("chord")
    key = workflow_key(task_id, None if untracked_root and group else root, group, chain,
                       headers.get(HEADER_WORKFLOW) or (inherited if parent else None))
    body_id = (bounded_id(_options(chord).get("task_id"))
               if isinstance(chord, Mapping) and _tracked([chord], tracked) else None)
    successors = _tracked([*chain[-1:], *callbacks[:MAX_SUCCESSOR_SIGNATURES]], tracked)
    # the chain's last link: the id its apply_async returned, not published yet
    end = bounded_id(_options(chain[0]).get("task_id")) if successors and chain else None
    if key == task_id and not (parent or group or body_id or successors):
        return {}
    fields = {"wf": key}
    for name, value in (("root", root), ("par", parent), ("grp", group), ("chd", body_id),
                        ("end", end)):
        if value:
            fields[name] = value
    if successors:
        fields["nxt"] = "1"
    return fields


def links_of_options(task_id: str, options: Mapping[str, Any]) -> dict[str, str]:
    """:func:`links` of a task published again from its recorded publish options (a
    payload's ``options``: ``root_id``, ``parent_id``, ``group_id``, ``chain``, ``link``,
    ``chord`` and the ``headers`` that hold its workflow key)."""
    headers = options.get("headers")
    link = options.get("link")
    return links(task_id, {
        "root_id": options.get("root_id"), "parent_id": options.get("parent_id"),
        "group": options.get("group_id"),
        HEADER_WORKFLOW: headers.get(HEADER_WORKFLOW) if isinstance(headers, Mapping) else None,
    }, ([], {}, {"chain": options.get("chain"), "chord": options.get("chord"),
                 "callbacks": link if isinstance(link, list) else [link] if link else []}))


def aliases(fields: Mapping[str, str]) -> list[str]:
    """The ids besides its members' that name a member's workflow, from its fields: its
    group's (when not the key), its chord callback's and its chain's last link's (ids a
    caller holds before those tasks are recorded)."""
    key = fields.get("wf")
    found = (fields.get("grp"), fields.get("chd"), fields.get("end"))
    return list(dict.fromkeys(a for a in found if a and a != key))


# ---------------------------------------------------------------------------- on read
def role_of(record: TaskRecord, root_id: str, chord: str | None,
            callbacks: frozenset[str] | set[str]) -> str:
    """A member's role: ``callback`` (a chord's body), ``header`` (a chord header
    member), ``root`` (the task the workflow is named after), else ``member``."""
    if record.task_id in callbacks:
        return "callback"
    if chord:
        return "header"
    if record.task_id == root_id:
        return "root"
    return "member"


def _kind(state: TaskState) -> str:
    if state is S.COMPLETED:
        return "completed"
    if state in _FAILED:
        return "failed"
    if state in _RUNNING:
        return "running"
    if state in _PENDING:
        return "pending"
    return "cancelled"


class _Tally:
    """Members' states as events replay, and what is expected but not recorded yet: a
    completed member with successors none of which is recorded yet, and a chord callback
    not recorded yet while its header members are recorded and none failed or was
    cancelled. Kept up to date event by event (no pass over the members per event), so a replay is
    linear in the events."""

    def __init__(self, reads: Sequence[MemberRead]) -> None:
        self.state: dict[str, TaskState] = {}
        self.kinds: Counter[str] = Counter()
        self.successors = {m.record.task_id for m in reads if m.successors}
        self.parent = {m.record.task_id: m.record.parent_id for m in reads}
        self.body_of = {m.record.task_id: m.chord for m in reads if m.chord}
        #: chord callback id -> [header members recorded, failed or cancelled]
        self.bodies: dict[str, list[int]] = {b: [0, 0] for b in self.body_of.values() if b}
        self.bodies_expected = 0
        self.children: dict[str, int] = {}
        self.awaiting: set[str] = set()  # completed, successors not recorded yet

    def _body_expected(self, body: str) -> bool:
        seen, bad = self.bodies[body]
        return body not in self.state and seen > 0 and bad == 0

    def _heads(self, body: str, state: TaskState, n: int) -> None:
        if state in _FAILED or state is S.CANCELLED:
            self.bodies[body][1] += n

    def enter(self, task_id: str, to: TaskState) -> None:
        before = self.state.get(task_id)
        body = self.body_of.get(task_id)
        touched = [b for b in (task_id if task_id in self.bodies else None, body) if b]
        was = [self._body_expected(b) for b in touched]
        if before is None:  # recorded now: its parent's successor has come
            parent = self.parent.get(task_id)
            if parent:
                self.children[parent] = self.children.get(parent, 0) + 1
                self.awaiting.discard(parent)
            if body:
                self.bodies[body][0] += 1
        else:
            self.kinds[_kind(before)] -= 1
            if body:
                self._heads(body, before, -1)
        self.state[task_id] = to
        self.kinds[_kind(to)] += 1
        if body:
            self._heads(body, to, 1)
        for b, expected in zip(touched, was, strict=True):
            self.bodies_expected += self._body_expected(b) - expected
        if task_id in self.successors:
            if to is S.COMPLETED and not self.children.get(task_id):
                self.awaiting.add(task_id)
            else:
                self.awaiting.discard(task_id)

    def expected(self) -> list[str]:
        """Ids expected but not recorded yet (a completed member's successors are named
        by the member)."""
        return sorted(self.awaiting) + sorted(b for b in self.bodies if self._body_expected(b))

    def counts(self) -> tuple[int, int, int, int, int]:
        """completed, failed, running, pending (with the expected), cancelled."""
        k = self.kinds
        return (k["completed"], k["failed"], k["running"],
                k["pending"] + len(self.awaiting) + self.bodies_expected, k["cancelled"])

    def verdict(self, cancelled: bool) -> WorkflowState:
        _, failed, running, pending, stopped = self.counts()
        if cancelled and not running and not self.kinds["pending"]:
            return WorkflowState.CANCELLED  # nothing recorded left: the expected never come
        if running or pending:
            return WorkflowState.RUNNING
        if failed:
            return WorkflowState.FAILED
        if stopped:
            return WorkflowState.CANCELLED
        return WorkflowState.COMPLETED


def _who(record: TaskRecord) -> str:
    return f"{record.name}[{record.task_id}]"


def _event_reason(record: TaskRecord, role: str, t: Transition,
                  before: TaskState | None) -> str | None:
    """What a member's transition means to its workflow (``None``: nothing to say)."""
    who = _who(record)
    to = t.to_state
    if before is None:
        return f"{who} submitted" if role == "root" else None
    if to in _FAILED:
        return f"member {who} {to.value}"
    if to is S.CANCELLED:
        return f"member {who} cancelled"
    if to is S.SUBMITTED and before in _FAILED | {S.CANCELLED}:
        return f"member {who} resubmitted"
    return None


def _final_reason(state: WorkflowState, record: TaskRecord, role: str,
                  failed: TaskRecord | None) -> str:
    """Why the workflow ended when ``record``'s transition ended it (``failed``: a member
    that failed for good, for a failed workflow)."""
    if state is WorkflowState.COMPLETED:
        if role == "callback":
            return f"callback {_who(record)} ran: completed"
        return f"last member {_who(record)} completed: completed"
    if state is WorkflowState.FAILED and failed is not None:
        if failed is record:
            return f"member {_who(record)} {record.state.value}: failed"
        return f"{_who(record)} ended, nothing left to run: failed ({_who(failed)} failed)"
    return f"{_who(record)} ended: {state.value}"


def _ordered(members: Sequence[MemberRead]) -> list[MemberRead]:
    """By submission time; members submitted in the same millisecond parents first (a
    chain's links), as the index's own order (by id) would not say."""
    parent = {m.record.task_id: m.record.parent_id for m in members}
    depth: dict[str, int] = {}  # how many of its ancestors are members (memoized walk)
    for start in parent:
        path: list[str] = []
        on_path: set[str] = set()
        node: str | None = start
        while node is not None and node in parent and node not in depth \
                and node not in on_path:
            path.append(node)
            on_path.add(node)
            node = parent[node]
        base = depth[node] if node is not None and node in depth else -1
        for i, task_id in enumerate(reversed(path)):
            depth[task_id] = base + 1 + i
    return sorted(members, key=lambda m: (m.record.submitted_at or datetime.min.replace(
        tzinfo=UTC), depth[m.record.task_id]))


def _beyond(states: Mapping[TaskState, int], expected: int, cancelled: bool,
            read_state: WorkflowState) -> tuple[WorkflowState, tuple[int, int, int, int, int]]:
    """The state and counts of a workflow read in part, from how many of all its members
    are in each state (``expected``: successors the members read still await)."""
    done = states.get(S.COMPLETED, 0)
    failed = sum(states.get(x, 0) for x in _FAILED)
    running = sum(states.get(x, 0) for x in _RUNNING)
    recorded_pending = sum(states.get(x, 0) for x in _PENDING)
    stopped = states.get(S.CANCELLED, 0)
    counts = (done, failed, running, recorded_pending + expected, stopped)
    if running or recorded_pending:
        state = WorkflowState.RUNNING
    elif cancelled:
        state = WorkflowState.CANCELLED
    elif read_state is WorkflowState.RUNNING and expected:
        state = WorkflowState.RUNNING
    elif failed:
        state = WorkflowState.FAILED
    elif stopped:
        state = WorkflowState.CANCELLED
    else:
        state = WorkflowState.COMPLETED
    return state, counts


def derive(read: WorkflowRead, now: datetime) -> Workflow:
    """The workflow of ``read`` at ``now`` (the Redis clock): its members' states replayed
    in time order from their histories, so that state, counts and history come from one
    logic. Running while anything runs or waits (a recorded member not ended, a successor
    or chord callback expected and not recorded yet); then failed if a member failed for
    good (failed, stalled or dropped), cancelled if the whole was cancelled or a member
    was, else completed."""
    members = _ordered(read.members)
    callbacks = {m.chord for m in members if m.chord}
    roles = {m.record.task_id: role_of(m.record, read.root_id, m.chord, callbacks)
             for m in members}
    by_id = {m.record.task_id: m for m in members}
    events: list[tuple[datetime, int, str, Transition | None]] = []
    for order, m in enumerate(members):
        for step in m.history:
            events.append((step.at, order, m.record.task_id, step))
    cancel_at = read.cancelled_at
    if cancel_at is not None:
        events.append((cancel_at, -1, "", None))
    events.sort(key=lambda e: (e[0], e[1]))
    tally = _Tally(members)
    history: list[WorkflowTransition] = []
    cancelled = False
    state: WorkflowState | None = None
    for at, _, task_id, event in events:
        who: str | None = None
        t = event
        if t is None:
            cancelled = True
            reason: str | None = "cancelled by request"
        else:
            who = task_id
            m = by_id[task_id]
            before = tally.state.get(task_id)
            tally.enter(task_id, t.to_state)
            reason = _event_reason(m.record, roles[task_id], t, before)
            if state is None:
                reason = reason or f"{_who(m.record)} submitted"
            if t.to_state is S.SUBMITTED and before in _FAILED | {S.CANCELLED}:
                cancelled = False  # a resubmit revives a cancelled workflow
        new = tally.verdict(cancelled)
        if reason is None and state is not None and new is not state:
            assert who is not None
            failed_id = next((i for i, st in tally.state.items() if st in _FAILED), None) \
                if new is WorkflowState.FAILED else None
            reason = (f"{_who(by_id[who].record)} submitted: running again"
                      if new is WorkflowState.RUNNING
                      else _final_reason(new, by_id[who].record, roles[who],
                                         by_id[failed_id].record if failed_id else None))
        if reason is not None:
            history.append(WorkflowTransition(at, new, reason, who))
        state = new
    final = tally.verdict(cancelled) if events else WorkflowState.RUNNING
    done, failed, running, pending, stopped = tally.counts()
    if read.truncated and read.states is not None:  # every member counted, not only those read
        final, (done, failed, running, pending, stopped) = _beyond(
            read.states, len(tally.expected()), cancelled, final)
    starts = [m.record.submitted_at for m in members if m.record.submitted_at is not None]
    started_at = min(starts) if starts else None
    ended_at: datetime | None = None
    if final is not WorkflowState.RUNNING:
        ends = [m.record.completed_at for m in members if m.record.completed_at is not None]
        if cancel_at is not None and cancelled:
            ends.append(cancel_at)
        ended_at = max(ends) if ends else None
    elapsed = None
    if started_at is not None:
        elapsed = max((ended_at or now) - started_at, timedelta(0))
    states = tally.state
    blocking = [i for i, s in states.items() if s in _FAILED]
    if not blocking and final is WorkflowState.RUNNING:
        blocking = ([i for i, s in states.items() if s in _RUNNING]
                    or [i for i, s in states.items() if s in _PENDING] or tally.expected())
    return Workflow(
        root_id=read.root_id,
        state=final,
        members=[WorkflowMember(m.record, m.record.parent_id, m.record.group_id,
                                roles[m.record.task_id]) for m in members],
        total=max(read.total, len(members)) + len(tally.expected()),
        completed=done, failed=failed, running=running, pending=pending, cancelled=stopped,
        started_at=started_at, ended_at=ended_at, elapsed=elapsed, blocking=blocking,
        history=history, truncated=read.truncated,
    )
