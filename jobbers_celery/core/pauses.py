"""Pauses of a task name or a queue on every worker: what one is, and the rules on their
names. Pure.

A pause is durable (kept in the store until resumed) and applies to every worker, those
started later included. A paused **task name** holds each of its messages a worker receives:
the record goes ``submitted -> scheduled`` with :data:`HELD_REASON` and no ``run_at`` (no
new state: a held task is a delayed task whose time is "at resume"), no retry used, and
the payload stays in the record so that the resume publishes it again. A paused **queue**
is no longer consumed (Celery's ``cancel_consumer``): its messages stay in the broker.

Names come from outside (an operator's form, a REST body, a command line): each is bounded
and must be printable before it is stored, shown or sent to a worker.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum

__all__ = ["HELD_DELAY_MS", "HELD_REASON", "MAX_NAME", "MAX_NOTE", "Pause", "PauseError",
           "PauseKind", "field_of", "held_reason", "parse_field", "validate_name"]

#: Longest task name or queue name a pause takes (Celery's own names are far shorter; the
#: worker's intake limit of a task name is 512).
MAX_NAME = 200
#: Longest note kept with a pause (who asked and why).
MAX_NOTE = 200
#: A held task waits in the scheduled index this far ahead (about 100 years): never due,
#: so no scheduler publishes it; its record has no ``run_at`` (see ``hold.lua``).
HELD_DELAY_MS = 100 * 365 * 24 * 3600 * 1000
#: The start of the history reason of a held task (what the pages and the CLI look for).
HELD_REASON = "paused"


class PauseError(ValueError):
    """A pause that cannot be: a bad name or kind (the REST API answers 400, the CLI exits 2)."""


class PauseKind(StrEnum):
    TASK = "task"
    QUEUE = "queue"


@dataclass(frozen=True, slots=True)
class Pause:
    """One pause: of ``kind`` (a task name or a queue) ``target``, since ``at`` (Redis
    clock), asked by ``by`` (free text: a user, ``cli``, ``api``)."""

    kind: PauseKind
    target: str
    at: datetime
    by: str = ""

    @classmethod
    def parse(cls, field: str, at_ms: int, by: str) -> Pause | None:
        """From a stored ``<kind>:<target>`` field; ``None`` for a field of no known kind."""
        got = parse_field(field)
        if got is None:
            return None
        return cls(got[0], got[1], datetime.fromtimestamp(at_ms / 1000.0, tz=UTC),
                   by[:MAX_NOTE])


def validate_name(kind: PauseKind | str, target: object) -> tuple[PauseKind, str]:
    """``(kind, target)`` checked: a known kind, a non-empty printable name of at most
    :data:`MAX_NAME` characters, no leading or trailing blank. Raises :class:`PauseError`."""
    try:
        k = PauseKind(kind)
    except ValueError:
        raise PauseError(f"unknown pause kind {str(kind)[:20]!r}: task or queue") from None
    if not isinstance(target, str) or not target:
        raise PauseError(f"a {k.value} pause needs a non-empty {k.value} name")
    if len(target) > MAX_NAME:
        raise PauseError(f"a {k.value} name is at most {MAX_NAME} characters, "
                         f"got {len(target)}")
    if not target.isprintable() or target != target.strip():
        raise PauseError(f"a {k.value} name must be printable, without leading or trailing "
                         "blanks")
    return k, target


def field_of(kind: PauseKind, target: str) -> str:
    """The stored field of a pause: ``task:<name>`` or ``queue:<name>``."""
    return f"{kind.value}:{target}"


def parse_field(field: str) -> tuple[PauseKind, str] | None:
    kind, sep, target = field.partition(":")
    if not sep or kind not in PauseKind.__members__.values():
        return None
    return PauseKind(kind), target


def held_reason(name: str) -> str:
    """The history reason of a message held because its task name is paused."""
    return f"{HELD_REASON}: task {name[:MAX_NAME]} is paused; held until resumed, no retry used"
