"""Failure fingerprints: failures of one kind share one, so a thousand failures of one bug
show as one group.

A fingerprint hashes the task name, the exception type, the message with ids and numbers
taken out, and the innermost frame of application code (file and function, no line number,
so an unrelated edit above it does not split the group). Pure: standard library only.

Bounded in time whatever the failure says (the worker that records it runs this): only the
first :data:`MESSAGE_HEAD` characters of a message are read (the kept message is at most 500
characters), and a traceback is read from its end, line by line, :data:`FRAME_LINES` lines at
most, a line longer than :data:`FRAME_LINE_MAX` never matched, the frame kept cut to
:data:`FRAME_MAX`. Every pattern's repetitions are bounded or cannot backtrack over the
text, so the cost is linear in what is read.
"""

from __future__ import annotations

import hashlib
import re
import sys
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache

__all__ = ["FRAME_LINES", "FRAME_LINE_MAX", "FRAME_MAX", "MESSAGE_HEAD", "Fingerprint",
           "app_frame", "fingerprint", "normalise_message"]

#: Characters of a message read (from its start): enough for the 500 characters kept even
#: when placeholders shorten what they replace (a uuid: 36 characters to 6).
MESSAGE_HEAD = 4096
#: Lines of a traceback read, from its end (the innermost frames come last).
FRAME_LINES = 10_000
#: A longer line is not a frame line (a path is at most 4096 bytes on Linux).
FRAME_LINE_MAX = 8192
#: Characters of the frame kept (what ``FailureGroup.frame`` holds).
FRAME_MAX = 500

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

# No trailing ``\s*$`` after a lazy function name: that retried the rest of the line at
# every character of a long run of spaces (quadratic); the name is stripped instead.
_FRAME = re.compile(r'\s*File "(?P<path>[^"]{1,4096})", line \d{1,20}, in (?P<func>.+)')

#: Code that is never "application code" even when it is not installed in site-packages.
_LIBRARY_PACKAGES = ("celery", "kombu", "billiard", "jobbers_celery", "jobbers_django",
                     "django", "rest_framework", "redis", "vine", "amqp")

_MAX_MESSAGE = 500

#: A Python installation's standard library, on any host (``.../lib/python3.11/...``).
_STDLIB = re.compile(r"/lib/python\d+(?:\.\d+)?/")


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


@lru_cache(maxsize=1)
def _library_roots() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    roots = {paths.get(k, "") for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    roots.update({sys.base_prefix, sys.prefix} if sys.prefix != sys.base_prefix else set())
    return tuple(sorted((r.rstrip("/") + "/" for r in roots if r), key=len, reverse=True))


def _is_library(path: str) -> bool:
    if path.startswith("<") or "/site-packages/" in path or "/dist-packages/" in path:
        return True
    if path.startswith(_library_roots()) or _STDLIB.search(path.replace("\\", "/")):
        return True
    parts = path.replace("\\", "/").split("/")
    return any(p in _LIBRARY_PACKAGES for p in parts[:-1])


def _short(path: str) -> str:
    """``path`` relative to the longest ``sys.path`` entry holding it (same on every host
    that deploys the code the same way), else its last two components."""
    norm = path.replace("\\", "/")
    best = ""
    for entry in sys.path:
        root = entry.replace("\\", "/").rstrip("/") + "/"
        if len(root) > 1 and norm.startswith(root) and len(root) > len(best):
            best = root
    if best:
        return norm[len(best):]
    return "/".join(norm.split("/")[-2:])


def app_frame(traceback: str | None) -> str:
    """``module/path.py:function`` of the innermost application frame of a formatted
    traceback ("" when there is none, e.g. a stalled task)."""
    for line in _tail_lines(traceback or ""):
        match = _FRAME.match(line)
        if match and not _is_library(match["path"]):
            func = match["func"]
            return f"{_short(match['path'])}:{func.rstrip() or func[:1]}"[:FRAME_MAX]
    return ""


def _tail_lines(text: str) -> Iterator[str]:
    """The lines of ``text`` from the last, :data:`FRAME_LINES` at most, skipping (not
    copying) those longer than :data:`FRAME_LINE_MAX`."""
    end = len(text)
    for _ in range(FRAME_LINES):
        if end <= 0:
            return
        start = text.rfind("\n", 0, end) + 1  # scans back to the previous line only
        if end - start <= FRAME_LINE_MAX:
            yield text[start:end].rstrip("\r")
        end = start - 1


def fingerprint(task_name: str, exception_type: str | None, message: str | None,
                traceback: str | None) -> Fingerprint:
    norm = normalise_message(message)
    frame = app_frame(traceback)
    raw = "\x1f".join((task_name, exception_type or "", norm, frame))
    return Fingerprint(hashlib.sha256(raw.encode()).hexdigest()[:32], norm, frame)
