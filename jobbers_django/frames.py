"""The innermost application frame of a traceback: the part of a failure fingerprint
(:mod:`jobbers_django.fingerprint`) that says where in the project's code a failure
happened. Its own module because telling application code from library code (the standard
library, site-packages, Celery, Django, jobbers) is a concern of its own, apart from what a
message means. Pure: standard library only.

Bounded in time whatever the traceback holds (the worker that records a failure runs
this): it is read from its end, line by line, :data:`FRAME_LINES` lines at most, a line
longer than :data:`FRAME_LINE_MAX` never matched, the frame kept cut to :data:`FRAME_MAX`.
The pattern's repetitions are bounded or cannot backtrack, so the cost is linear in what
is read.
"""

from __future__ import annotations

import re
import sys
import sysconfig
from collections.abc import Iterator
from functools import lru_cache

__all__ = ["FRAME_LINES", "FRAME_LINE_MAX", "FRAME_MAX", "app_frame"]

#: Lines of a traceback read, from its end (the innermost frames come last).
FRAME_LINES = 10_000
#: A longer line is not a frame line (a path is at most 4096 bytes on Linux).
FRAME_LINE_MAX = 8192
#: Characters of the frame kept (what ``FailureGroup.frame`` holds).
FRAME_MAX = 500

# No trailing ``\s*$`` after a lazy function name: that retried the rest of the line at
# every character of a long run of spaces (quadratic); the name is stripped instead.
_FRAME = re.compile(r'\s*File "(?P<path>[^"]{1,4096})", line \d{1,20}, in (?P<func>.+)')

#: Code that is never "application code" even when it is not installed in site-packages.
_LIBRARY_PACKAGES = ("celery", "kombu", "billiard", "jobbers_celery", "jobbers_django",
                     "django", "rest_framework", "redis", "vine", "amqp")

#: A Python installation's standard library, on any host (``.../lib/python3.11/...``).
_STDLIB = re.compile(r"/lib/python\d+(?:\.\d+)?/")


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
