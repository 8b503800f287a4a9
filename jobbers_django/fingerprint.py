"""Failure fingerprints: failures of one kind share one, so a thousand failures of one bug
show as one group.

A fingerprint hashes the task name, the exception type, the message with ids and numbers
taken out, and the innermost frame of application code (file and function, no line number,
so an unrelated edit above it does not split the group). Pure: standard library only.
"""

from __future__ import annotations

import hashlib
import re
import sys
import sysconfig
from dataclasses import dataclass
from functools import lru_cache

__all__ = ["Fingerprint", "app_frame", "fingerprint", "normalise_message"]

_SUBSTITUTIONS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?"
                r"[0-9a-fA-F]{12}"), "<uuid>"),
    # jobbers worker incarnations (node name:pid:random), then e-mail addresses, then
    # Celery node names (name@host): a stall on another worker is the same failure
    (re.compile(r"\b[\w.+-]+@[\w.-]+:\d+:[0-9a-zA-Z]+"), "<worker>"),
    (re.compile(r"\b[\w.+-]+@[\w-]+(?:\.[\w-]+)+\b"), "<email>"),
    (re.compile(r"\b[\w.+-]+@[\w.-]+"), "<worker>"),
    (re.compile(r"\b0x[0-9a-fA-F]+\b"), "<hex>"),
    # hex-looking tokens (hashes, object ids) with at least one digit and one letter
    (re.compile(r"\b(?=[0-9a-fA-F]*\d)(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{8,}\b"), "<hex>"),
    (re.compile(r"\d+(?:[.,:]\d+)*"), "<n>"),
    (re.compile(r"\s+"), " "),
)

_FRAME = re.compile(r'^\s*File "(?P<path>[^"]+)", line \d+, in (?P<func>.+?)\s*$')

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
    text = message or ""
    for pattern, placeholder in _SUBSTITUTIONS:
        text = pattern.sub(placeholder, text)
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
    frames = [m for m in (_FRAME.match(line) for line in (traceback or "").splitlines()) if m]
    for match in reversed(frames):
        if not _is_library(match["path"]):
            return f"{_short(match['path'])}:{match['func']}"
    return ""


def fingerprint(task_name: str, exception_type: str | None, message: str | None,
                traceback: str | None) -> Fingerprint:
    norm = normalise_message(message)
    frame = app_frame(traceback)
    raw = "\x1f".join((task_name, exception_type or "", norm, frame))
    return Fingerprint(hashlib.sha256(raw.encode()).hexdigest()[:32], norm, frame)
