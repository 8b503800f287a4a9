"""Failure fingerprints: failures of one kind share one, so a thousand failures of one bug
show as one group.

A fingerprint hashes the task name, the exception type, the message with ids and numbers
taken out (this module), and the innermost frame of application code
(:func:`jobbers_django.frames.app_frame`: file and function, no line number, so an
unrelated edit above it does not split the group). Pure: standard library only.

Bounded in time whatever the failure says (the worker that records it runs this): only the
first :data:`MESSAGE_HEAD` characters of a message are read (the kept message is at most 500
characters), and the traceback is read from its end, a bounded number of lines
(:mod:`jobbers_django.frames`). Every pattern's repetitions are bounded or cannot
backtrack over the text, so the cost is linear in what is read.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

# the frame's names stay importable from here, where they were first documented
from jobbers_django.frames import FRAME_LINE_MAX, FRAME_LINES, FRAME_MAX, app_frame

__all__ = ["FRAME_LINES", "FRAME_LINE_MAX", "FRAME_MAX", "MESSAGE_HEAD", "Fingerprint",
           "app_frame", "fingerprint", "normalise_message"]

#: Characters of a message read (from its start): enough for the 500 characters kept even
#: when placeholders shorten what they replace (a uuid: 36 characters to 6).
MESSAGE_HEAD = 4096

# Repetitions before an ``@`` are bounded (a local part or node name of at most 128
# characters, a host of at most 255): unbounded, every word boundary of a long ``a.a.a.``
# started a scan to the end of the text (quadratic).
_SUBSTITUTIONS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?"
                r"[0-9a-fA-F]{12}"), "<uuid>"),
    # jobbers worker incarnations (node name:pid:random), then e-mail addresses, then
    # Celery node names (name@host): a stall on another worker is the same failure
    (re.compile(r"\b[\w.+-]{1,128}@[\w.-]{1,255}:\d+:[0-9a-zA-Z]+"), "<worker>"),
    (re.compile(r"\b[\w.+-]{1,128}@[\w-]{1,63}(?:\.[\w-]{1,63}){1,32}\b"), "<email>"),
    (re.compile(r"\b[\w.+-]{1,128}@[\w.-]{1,255}"), "<worker>"),
    (re.compile(r"\b0x[0-9a-fA-F]+\b"), "<hex>"),
    # hex-looking tokens (hashes, object ids) with at least one digit and one letter
    (re.compile(r"\b(?=[0-9a-fA-F]*\d)(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{8,}\b"), "<hex>"),
    (re.compile(r"\d+(?:[.,:]\d+)*"), "<n>"),
    (re.compile(r"\s+"), " "),
)
#: The ``@`` patterns, run only on a message that has an ``@``.
_AT = frozenset({1, 2, 3})

_MAX_MESSAGE = 500


@dataclass(frozen=True, slots=True)
class Fingerprint:
    value: str
    message: str
    frame: str


def normalise_message(message: str | None) -> str:
    """``message`` with uuids, emails, hex ids and numbers replaced by placeholders."""
    text = (message or "")[:MESSAGE_HEAD]
    has_at = "@" in text
    for n, (pattern, placeholder) in enumerate(_SUBSTITUTIONS):
        if n not in _AT or has_at:
            # cut again: a placeholder may be longer than what it replaced (``<n>``)
            text = pattern.sub(placeholder, text)[:MESSAGE_HEAD]
    return text.strip()[:_MAX_MESSAGE]


def fingerprint(task_name: str, exception_type: str | None, message: str | None,
                traceback: str | None) -> Fingerprint:
    norm = normalise_message(message)
    frame = app_frame(traceback)
    raw = "\x1f".join((task_name, exception_type or "", norm, frame))
    return Fingerprint(hashlib.sha256(raw.encode()).hexdigest()[:32], norm, frame)
