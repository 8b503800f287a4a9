"""Exception text cut to a known size before anything redacts, parses or stores it.

A task's exception message and traceback are whatever its code (and so, often, a publisher's
arguments) made them: a 1 MB message would be redacted, written to the record, the history
and the dead letter, and fingerprinted, in the worker that records the failure. So both are
cut first, with a visible mark:

- a message keeps its first :data:`MESSAGE_MAX_CHARS` characters (the head says what went
  wrong);
- a traceback keeps its last parts (frames and the exception lines: the innermost frames
  and the error come last) within :data:`TRACEBACK_MAX_CHARS`, each part cut to
  :data:`TRACEBACK_PART_MAX_CHARS` (so a huge message inside it cannot push the frames out).

A cut is made on the text as redaction saw it: ``redact`` runs on the kept text with
:data:`REDACT_MARGIN` characters more, and the cut is made after it, so a secret that
straddles the cut point is still recognised and replaced whole, not shown in part.
"""

from __future__ import annotations

import traceback as tb
from collections.abc import Callable, Iterator, Sequence

__all__ = [
    "MAX_NOTES",
    "MESSAGE_MAX_CHARS",
    "REDACT_MARGIN",
    "TRACEBACK_MAX_CHARS",
    "TRACEBACK_PART_MAX_CHARS",
    "cut_head",
    "cut_message",
    "cut_traceback",
    "exception_parts",
    "safe_str",
]

#: Characters of an exception message kept in the dead letter (the record keeps fewer,
#: ``recorder.ERROR_MESSAGE_MAX_CHARS``).
MESSAGE_MAX_CHARS = 8192
#: Characters of a traceback kept (its end).
TRACEBACK_MAX_CHARS = 32768
#: Characters of one part of a traceback (a frame, the exception line with its message).
TRACEBACK_PART_MAX_CHARS = 4096
#: Characters past a cut that redaction still sees (longer than any credential it knows).
REDACT_MARGIN = 1024


def _same(text: str) -> str:
    return text


def cut_head(text: str, limit: int, total: int | None = None) -> str:
    """``text`` cut to its first ``limit`` characters, marked with the length of the whole
    (``total``: that of the original, when ``text`` is already a part of it)."""
    total = len(text) if total is None else total
    if total <= limit and len(text) <= limit:
        return text
    return f"{text[:limit]}... [cut: {total} characters in all]"


def cut_message(text: str, redact: Callable[[str], str] = _same,
                limit: int = MESSAGE_MAX_CHARS) -> str:
    """The head of a message, redacted (see the module's note on the margin)."""
    if len(text) <= limit:
        return redact(text)
    return cut_head(redact(text[:limit + REDACT_MARGIN]), limit, len(text))


def safe_str(exc: BaseException) -> str:
    """``str(exc)``, or what :mod:`traceback` shows when its ``__str__`` raises (a
    publisher's arguments can make it: a message formatted from them)."""
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - whatever __str__ raised
        return "<exception str() failed>"
    return text if isinstance(text, str) else "<exception str() failed>"


#: Notes of an exception (``add_note``) formatted, at most.
MAX_NOTES = 16


def exception_parts(exc: BaseException) -> list[str]:
    """The parts of ``exc``'s formatted traceback (each frame, each exception line with its
    message, each chained section's header), as ``traceback`` formats them, with every
    message and note in it cut to a part's size (plus the redaction margin) first: the
    formatter handles a message line by line in Python (1 MB of newlines took 0.3 s)."""
    te = tb.TracebackException(type(exc), exc, exc.__traceback__, compact=True)
    _cut_texts(te)
    return list(te.format())


def _cut_texts(te: tb.TracebackException) -> None:
    """Cut the message (``_str``, as CPython 3.10-3.13 keep it) and the notes of ``te`` and
    of every exception chained to it or grouped in it."""
    keep = TRACEBACK_PART_MAX_CHARS + REDACT_MARGIN
    seen: set[int] = set()
    todo = [te]
    while todo:
        one = todo.pop()
        if id(one) in seen:
            continue
        seen.add(id(one))
        text = getattr(one, "_str", None)
        if isinstance(text, str) and len(text) > keep:
            setattr(one, "_str", text[:keep])  # noqa: B010 - private in typeshed
        notes = getattr(one, "__notes__", None)
        if isinstance(notes, list | tuple) and (len(notes) > MAX_NOTES or any(
                isinstance(n, str) and len(n) > keep for n in notes)):
            one.__notes__ = [n[:keep] if isinstance(n, str) else n for n in notes[:MAX_NOTES]]
        todo += [x for x in (one.__cause__, one.__context__) if x is not None]
        todo += getattr(one, "exceptions", None) or []


def cut_traceback(parts: Sequence[str] | str, redact: Callable[[str], str] = _same) -> str:
    """A traceback (its text, or :func:`exception_parts`) cut to its last parts within
    :data:`TRACEBACK_MAX_CHARS`, each part to :data:`TRACEBACK_PART_MAX_CHARS`, redacted
    part by part (a text's parts are its lines, read from its end: never all split)."""
    spans = _line_spans(parts) if isinstance(parts, str) else _part_spans(parts)
    text = parts if isinstance(parts, str) else "".join(parts)
    kept: list[tuple[int, int]] = []
    size = 0
    for start, end in spans:  # from the last part
        n = min(end - start, TRACEBACK_PART_MAX_CHARS)
        if kept and size + n > TRACEBACK_MAX_CHARS:
            break
        kept.append((start, end))
        size += n
    kept.reverse()
    first = kept[0][0] if kept else 0
    if not first and all(end - start <= TRACEBACK_PART_MAX_CHARS for start, end in kept):
        return redact(text)  # nothing to cut: redacted whole, as it always was
    out = [f"[cut: the first {first} characters of this traceback]\n"] if first else []
    for start, end in kept:
        if end - start <= TRACEBACK_PART_MAX_CHARS:
            out.append(redact(text[start:end]))
        else:
            head = redact(text[start:start + TRACEBACK_PART_MAX_CHARS + REDACT_MARGIN])
            out.append(f"{head[:TRACEBACK_PART_MAX_CHARS]}... [cut]\n")
    return "".join(out)


def _line_spans(text: str) -> Iterator[tuple[int, int]]:
    """``(start, end)`` of each line of ``text`` (its newline included), the last first."""
    end = len(text)
    while end > 0:
        start = text.rfind("\n", 0, end - 1) + 1  # scans back to the previous line only
        yield start, end
        end = start


def _part_spans(parts: Sequence[str]) -> Iterator[tuple[int, int]]:
    """``(start, end)`` of each part in the parts joined, the last first."""
    end = sum(len(p) for p in parts)
    for part in reversed(parts):
        yield end - len(part), end
        end -= len(part)
