"""Failure fingerprints: failures of one kind share one, so a thousand failures of one bug
show as one group.

A fingerprint hashes the task name, the exception type, the message with its variable
parts taken out (this module: ids, numbers, a URL's path, a value in quotes), and the
innermost frame of application code
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
from collections.abc import Callable
from dataclasses import dataclass

# the frame's names stay importable from here, where they were first documented
from jobbers_django.frames import FRAME_LINE_MAX, FRAME_LINES, FRAME_MAX, app_frame

__all__ = ["FRAME_LINES", "FRAME_LINE_MAX", "FRAME_MAX", "MESSAGE_HEAD", "Fingerprint",
           "app_frame", "fingerprint", "normalise_message"]

#: Characters of a message read (from its start): enough for the 500 characters kept even
#: when placeholders shorten what they replace (a uuid: 36 characters to 6).
MESSAGE_HEAD = 4096

#: A quoted text names code, not data, after these words ("no attribute 'get'", "column
#: \"price\" does not exist", "No module named 'shop'"), or before ``object``/``codec``
#: ("'NoneType' object"): kept, as different names are different bugs. Any other quoted
#: value ("warehouse 'berlin'", "got 'abc'", a path) is data: ``<str>``.
CODE_WORDS = frozenset({
    "attribute", "column", "relation", "table", "named", "name", "argument", "field",
    "constraint", "index", "setting", "parameter", "option", "model", "app", "module",
    "package", "function", "method", "class", "type", "key", "variable", "label", "lookup",
    "operator", "schema", "sequence", "view", "template", "url", "codec", "encoding",
    "queue", "exchange", "task", "keyword", "property", "choice", "role", "database",
})
_CODE_AFTER = frozenset({"object", "codec"})
#: Python's own type names, quoted by TypeErrors ("for +: 'int' and 'str'"): code, kept.
_TYPE_NAMES = frozenset({
    "int", "str", "float", "bytes", "bytearray", "bool", "list", "dict", "tuple", "set",
    "frozenset", "NoneType", "object", "type", "complex", "Decimal", "datetime", "date",
    "UUID", "function", "method", "module", "generator", "coroutine",
})
#: Longest quoted text taken as a value; longer is a nested message, normalised as text.
QUOTED_MAX = 64
_LAST_WORD = re.compile(r"(\w{1,64})\W{0,3}$")
_NEXT_WORD = re.compile(r"\W{0,2}(\w{1,16})")


_QUOTES = "'\"`\u201c\u201d\u2018\u2019\u00ab\u00bb"
#: A value quoted in '...', "...", `...`, curly quotes or guillemets (bounded, one line; an
#: apostrophe inside a word, "can't", opens nothing).
_QUOTED = re.compile("(?<!\\w)(?:" + "|".join(
    f"{re.escape(a)}[^{re.escape(b)}\\n]{{0,{QUOTED_MAX}}}{re.escape(b)}"
    for a, b in ("''", '""', "``", "\u201c\u201d", "\u2018\u2019", "\u00ab\u00bb")) + ")(?!\\w)")


def _quoted(match: re.Match[str], nested: bool = True) -> str:
    """A quoted value as ``<str>``, unless it is the whole message (a ``KeyError``'s key) or
    its neighbours say it names code (:data:`CODE_WORDS`). A quoted sentence (ending in
    ``.``, or quoting again: a Django ``ValidationError``'s list) is a message, not a
    value: its own quoted values go, its words stay (one level down, no more)."""
    text, start, end = match.string, match.start(), match.end()
    if start < 8 and len(text) - end < 8 and not text[:start].strip() \
            and not text[end:].strip():
        return match.group()
    before = _LAST_WORD.search(text[max(0, start - 70):start])
    after = _NEXT_WORD.match(text[end:end + 20])
    inner = match.group()[1:-1]
    if (before and before.group(1).lower() in CODE_WORDS) or (
            after and after.group(1).lower() in _CODE_AFTER) or inner in _TYPE_NAMES:
        return match.group()
    if nested and (inner.rstrip().endswith((".", "!", "?"))
                   or any(q in inner for q in _QUOTES)):
        return match.group()[0] + _QUOTED.sub(_value, inner) + match.group()[-1]
    return "<str>"


def _value(match: re.Match[str]) -> str:
    return _quoted(match, nested=False)


# Repetitions before an ``@`` are bounded (a local part or node name of at most 128
# characters, a host of at most 255): unbounded, every word boundary of a long ``a.a.a.``
# started a scan to the end of the text (quadratic).
_SUBSTITUTIONS: tuple[tuple[re.Pattern[str], str | Callable[[re.Match[str]], str]], ...] = (
    # a URL keeps its scheme and host; its path and query (ids, slugs, keys) are data
    (re.compile(r"\b([a-zA-Z][\w+.-]{0,15}://[^\s/'\"<>?#]{1,255})[/?#][^\s'\"<>]{0,2048}"),
     r"\1/<path>"),
    (_QUOTED, _quoted),
    # a database's key detail, "Key (ref)=(A-123) already exists": the value is data
    (re.compile(r"\)=\([^()\n]{0,256}\)"), ")=(<value>)"),
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
_AT = frozenset({4, 5, 6})

_MAX_MESSAGE = 500


@dataclass(frozen=True, slots=True)
class Fingerprint:
    value: str
    message: str
    frame: str


def normalise_message(message: str | None) -> str:
    """``message`` with URL paths, quoted values (not code names), uuids, emails, hex ids
    and numbers replaced by placeholders."""
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
