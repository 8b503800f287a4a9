"""Secrets hidden wherever people read: task arguments, exception messages, tracebacks. Pure.

One implementation for every place that shows a task's values: Celery's ``argsrepr`` and
``kwargsrepr`` (recomputed by the worker from the message body: worker logs, task events, so
Flower, ``celery inspect``), Celery's own log records, the exception a task raises (logs,
events, the record, the dead letter), the command line, and jobbers_django's admin and API.
Only what is shown is redacted: the broker body, the record's payload and the dead letter
keep the real arguments, because a retry or a resubmission needs them.

What is secret:

- a value under a key that matches one of the key needles (``jobbers_redact_keys``): the key
  is compared without case and without its separators (``privateKey``, ``private-key`` and
  ``PRIVATE_KEY`` are one key), a needle of more than 4 characters anywhere in it
  (``db_password``), a shorter one (``pwd``, ``dsn``, ``jwt``) as a whole word of it
  (``db_pwd``, ``sentryDsn``, not ``adsnumber``); at any depth of dicts and lists, whatever
  the value (a dict, a list, bytes);
- a positional argument whose parameter name is such a key (``login('ann', 'hunter2')`` of
  ``def login(user, password)``), and the rest of ``*args`` when its name is one;
- wherever it is, text that looks like a credential: the user part of a URL
  (``postgres://u:hunter2@host/db`` keeps scheme, a plain user name and host; a token as the
  user, as in ``https://ghp_...@github.com`` or a Sentry DSN, is hidden whole), the token
  after an authorization scheme (``Bearer``, ``Basic``, ``Token``, ``Digest``, ``ApiKey``...:
  the scheme is kept), and the value of ``key=value``, ``key: value``, ``"key": "value"``
  pairs whose key is secret (a quoted value up to its closing quote, escaped quotes
  included);
- in an exception message or traceback, also the secret values of the same task's
  arguments (4 characters or more: shorter ones would mask ordinary words; the first
  :data:`MAX_KNOWN` of them).

Cost: every pattern is linear (no repetition that can backtrack over the text), and a
display with a limit (:meth:`Redactor.display`, :meth:`Redactor.value` with ``limit``) looks
at no more than it shows plus a margin, so a big value costs no more than a small one.
"""

from __future__ import annotations

import inspect
import itertools
import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from jobbers_celery.core.credentials import (
    MAX_KNOWN,
    MIN_KNOWN_CHARS,
    REDACTED,
    CredentialFinder,
    known_spans,
    maybe_secret_text,
    merged,
)
from jobbers_celery.core.intake import MAX_DEPTH as INTAKE_DEPTH

__all__ = ["DEFAULT_REDACT_KEYS", "REDACTED", "TOO_DEEP", "Parameters", "Redactor",
           "parameters", "redactor", "use_keys"]

#: Names (keys, parameters) whose values are secret; see the module's rule.
DEFAULT_REDACT_KEYS: tuple[str, ...] = (
    "password", "passwd", "passphrase", "pass", "pwd", "token", "secret", "api_key",
    "apikey", "access_key", "authorization", "auth", "credential", "private_key",
    "signing_key", "session_id", "session_key", "cookie", "csrf", "jwt", "dsn", "otp",
    "cvv", "card_number", "authentication", "oauth", "privkey", "passwort", "pin", "ssn",
    "cvc",
)
#: What a value nested deeper than :data:`MAX_DEPTH` is shown as.
TOO_DEEP = "[nested too deep to show]"
#: Levels of dicts and lists shown; deeper ones are replaced by :data:`TOO_DEEP`.
MAX_DEPTH = 32
#: A needle this short matches a whole word of a key only.
_SHORT_NEEDLE = 4
#: Characters a string is kept past the visible part before it is redacted (longer than any
#: credential pattern's bounded part), so that one cut by the display is still whole.
_MARGIN = 600
#: Characters of an argument string searched for credentials to look for in its messages.
_SCAN_CHARS = 16_384
#: Characters of a key looked at (a longer key is cut for the rule and for display).
_MAX_KEY = 256
_UNLIMITED = 1 << 62


_WORDS_RE = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+")
#: Value types shown as they are by :meth:`Redactor.shown_unchanged` (exact types: a
#: subclass may have its own repr).
_PLAIN_SCALARS = frozenset({int, float, bool, type(None)})
_PAIRS = frozenset({list, tuple})
#: Levels :meth:`Redactor.shown_unchanged` looks into (deeper: the walk decides).
_UNCHANGED_DEPTH = 16


@dataclass(frozen=True, slots=True)
class Parameters:
    """A task's positional parameter names (``self`` of a bound task left out) and the name
    of its ``*args`` (``None``: it has none)."""

    positional: tuple[str, ...] = ()
    var_positional: str | None = None

    def name_of(self, index: int) -> str | None:
        if index < len(self.positional):
            return self.positional[index]
        return self.var_positional


def parameters(func: Callable[..., Any]) -> Parameters | None:
    """The positional parameters of ``func`` (a bound method leaves out its ``self``);
    ``None`` if its signature cannot be read (a builtin, a C function)."""
    try:
        sig = inspect.signature(func)
    except (TypeError, ValueError):
        return None
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    names = tuple(p.name for p in sig.parameters.values() if p.kind in kinds)
    var = next((p.name for p in sig.parameters.values()
                if p.kind is inspect.Parameter.VAR_POSITIONAL), None)
    return Parameters(names, var)


class _Shown:
    """An object that is neither JSON nor a container, shown as its redacted ``repr()``."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Shown) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)


class _Walk:
    """One display walk: characters still shown (``left``) and whether anything was cut."""

    __slots__ = ("cut", "left", "note")

    def __init__(self, limit: int | None, note: str | None) -> None:
        self.left = limit if limit else _UNLIMITED
        self.note = note
        self.cut = False


class Redactor:
    """Redaction with one list of key needles (make it with :func:`redactor`: cached)."""

    def __init__(self, keys: Iterable[str] = DEFAULT_REDACT_KEYS) -> None:
        self.needles = tuple(k for k in keys if k)
        compacts = sorted({_compact(k) for k in self.needles} - {""}, key=len, reverse=True)
        self._compacts = tuple(compacts)
        self._long = tuple(n for n in compacts if len(n) > _SHORT_NEEDLE)
        self._short = frozenset(n for n in compacts if len(n) <= _SHORT_NEEDLE)
        self._keys: dict[str, bool] = {}
        self._spans = CredentialFinder(self._compacts, self.is_secret_key).spans

    # ------------------------------------------------------------------ keys
    def is_secret_key(self, key: object) -> bool:
        """Whether the value under ``key`` (a dict key, a parameter name) is secret."""
        if isinstance(key, bytes):
            key = key.decode("utf-8", "replace")
        if not isinstance(key, str) or not key:
            return False
        key = key[:_MAX_KEY]
        found = self._keys.get(key)
        if found is None:
            found = self._match_key(key)
            if len(self._keys) > 4096:  # keys a hostile payload makes up: bounded memory
                self._keys.clear()
            self._keys[key] = found
        return found

    def _match_key(self, key: str) -> bool:
        compact = _compact(key)
        if any(n in compact for n in self._long):
            return True
        if not self._short:
            return False
        words = [w.lower() for w in _WORDS_RE.findall(key)]
        # a short needle is a word of the key, or two or three adjacent words (api_key ...)
        return any("".join(words[i:i + n]) in self._short
                   for n in (1, 2, 3) for i in range(len(words)))

    # ------------------------------------------------------------------ values
    def value(self, value: Any, limit: int | None = None) -> Any:
        """A copy of ``value`` (JSON-like) with its secrets replaced by :data:`REDACTED`.

        With ``limit``, for a display that shows no more than that many characters of it
        (a repr cut at ``limit``): what lies beyond is left out, strings and lists cut, so a
        big value costs no more than a small one."""
        return self._show(value, 0, _Walk(limit, None))

    def display(self, value: Any, limit: int | None, note: str) -> tuple[Any, bool]:
        """``value`` redacted and cut to about ``limit`` characters of JSON (``None`` or 0:
        whole), in one walk that looks at no more than it keeps: a cut string ends with
        ``... `` and ``note`` formatted with how long it was, a cut list or dict gains an
        item (key ``...``) saying how many more there were. Returns it and whether it was
        cut."""
        walk = _Walk(limit, note)
        shown = self._show(value, 0, walk)
        return shown, walk.cut

    def arguments(self, args: Sequence[Any] | None, kwargs: Mapping[str, Any] | None,
                  params: Parameters | None = None,
                  limit: int | None = None) -> tuple[list[Any], dict[str, Any]]:
        """``args`` and ``kwargs`` as shown: positional ones matched to ``params``
        (``limit``: as for :meth:`value`, for each of them)."""
        shown_args, shown_kwargs, _, _ = self.display_arguments(args, kwargs, params, limit,
                                                                None)
        return shown_args, shown_kwargs

    def display_arguments(self, args: Sequence[Any] | None, kwargs: Mapping[str, Any] | None,
                          params: Parameters | None, limit: int | None,
                          note: str | None) -> tuple[list[Any], dict[str, Any], bool, bool]:
        """:meth:`arguments` as :meth:`display` shows them (each cut to ``limit``; ``note``
        ``None``: cut without notes), and whether each was cut."""
        walk = _Walk(limit, note)
        items = list(args or ()) if not isinstance(args, str) else [args]
        shown_args: list[Any] = []
        for n, arg in enumerate(items):
            if walk.left <= 0:
                self._more(walk, shown_args, len(items) - n)
                break
            if params is not None and self.is_secret_key(params.name_of(n)):
                walk.left -= len(REDACTED) + 4
                shown_args.append(REDACTED)
            else:
                shown_args.append(self._show(arg, 1, walk))
        args_cut = walk.cut
        kwalk = _Walk(limit, note)
        shown_kwargs = self._show(dict(kwargs or {}), 0, kwalk)
        return shown_args, shown_kwargs, args_cut, kwalk.cut

    def shown_unchanged(self, args: Sequence[Any], kwargs: Mapping[str, Any],
                        params: Parameters | None, limit: int) -> bool:
        """Whether :meth:`arguments` would show ``args`` and ``kwargs`` with nothing
        redacted: every value looked at is a number, ``None``, a boolean, a string that no
        credential pattern can match (none of ``@``, ``=``, ``:``, a space or a tab), a list
        or tuple, or a dict whose keys are such strings and not secret; no positional one
        under a secret parameter name. Looks at no more than ``limit`` values and characters
        of each (what lies beyond is past what a repr cut at ``limit`` characters shows: every
        value takes one character at least). ``False`` means: not known, walk them.

        Why: the walk copies every value it shows; a bulk fan-out's arguments (numbers,
        ids, names) are shown as they are, and this tells so without copying them."""
        if limit <= 0:  # no limit: everything is shown, walk it
            return False
        budget = [limit]
        for n in range(min(len(args), limit)):
            if params is not None and self.is_secret_key(params.name_of(n)):
                return False
        if not self._unchanged(args, 0, budget):
            return False
        budget[0] = limit
        return self._unchanged(kwargs, 0, budget)

    def _unchanged(self, value: Any, depth: int, budget: list[int]) -> bool:
        kind = type(value)
        if kind is str:
            budget[0] -= len(value) + 1
            return not ("@" in value or "=" in value or ":" in value or " " in value
                        or "\t" in value)
        if kind in _PLAIN_SCALARS:
            budget[0] -= 1
            return True
        if depth >= _UNCHANGED_DEPTH:
            return False
        if kind is list or kind is tuple:
            budget[0] -= 1
            # what is shown of it (every item takes a character at least), in C: numbers,
            # or lists/tuples of numbers (a starmap's or chunk's pairs)
            head = value[:max(budget[0], 0)] if len(value) > budget[0] else value
            if _PLAIN_SCALARS.issuperset(map(type, head)):
                budget[0] -= len(head)
                return True
            if _PAIRS.issuperset(map(type, head)) and _PLAIN_SCALARS.issuperset(
                    map(type, itertools.chain.from_iterable(head))):
                budget[0] -= len(head) + sum(map(len, head))
                return True
            for item in value:
                if budget[0] <= 0:
                    return True  # past what is shown
                inner = type(item)
                if inner in _PLAIN_SCALARS:
                    budget[0] -= 1
                elif ((inner is tuple or inner is list)
                      and _PLAIN_SCALARS.issuperset(map(type, item))):
                    budget[0] -= len(item) + 1  # a pair of numbers (starmap, chunks)
                elif not self._unchanged(item, depth + 1, budget):
                    return False
            return True
        if isinstance(value, dict):  # a Signature too: Celery's repr shows its items
            budget[0] -= 1
            for key, item in value.items():
                if budget[0] <= 0:
                    return True
                if (type(key) is not str or len(key) > _MAX_KEY or self.is_secret_key(key)
                        or not self._unchanged(key, depth + 1, budget)
                        or not self._unchanged(item, depth + 1, budget)):
                    return False
            return True
        return False  # bytes, sets, objects: the walk shows them its own way

    def _show(self, value: Any, depth: int, walk: _Walk) -> Any:
        """``value`` redacted within what ``walk`` still shows (see :meth:`display`)."""
        if isinstance(value, str):
            return self._show_text(value, walk)
        if isinstance(value, bytes | bytearray):
            text = bytes(value[:max(walk.left, 0) + _MARGIN]).decode("utf-8", "replace")
            shown = self._show_text(text, walk, len(value))
            return shown.encode("utf-8") if walk.note is None else shown
        if value is None or isinstance(value, bool | int | float):
            walk.left -= len(json.dumps(value)) + 2
            return value
        if depth >= MAX_DEPTH:
            walk.left -= len(TOO_DEEP) + 4
            return TOO_DEEP
        if isinstance(value, Mapping):
            out: dict[Any, Any] = {}
            walk.left -= 2
            for n, (key, item) in enumerate(value.items()):
                if walk.left <= 0:
                    walk.cut = True
                    if walk.note is not None:
                        out["..."] = walk.note.format(_count(len(value) - n, "more key"))
                    break
                shown_key = self._show_key(key)
                walk.left -= len(str(shown_key)) + 4
                if self.is_secret_key(key):
                    walk.left -= len(REDACTED) + 4
                    out[shown_key] = REDACTED
                else:
                    out[shown_key] = self._show(item, depth + 1, walk)
            return out
        if isinstance(value, list | tuple | set | frozenset):
            items: list[Any] = []
            walk.left -= 2
            for n, item in enumerate(value):
                if walk.left <= 0:
                    self._more(walk, items, len(value) - n)
                    break
                items.append(self._show(item, depth + 1, walk))
            return items
        try:  # an object (a pickle serializer's): its repr, redacted as text
            text = repr(value)
        except Exception:  # noqa: BLE001 - a repr that raises: its type only
            text = f"<{type(value).__name__}>"
        return _Shown(self._show_text(text, walk))

    def _show_text(self, value: str, walk: _Walk, size: int | None = None) -> str:
        size = len(value) if size is None else size
        whole = size + 4 <= walk.left
        window = value if whole else value[:max(walk.left - 2, 0) + _MARGIN]
        shown = self.text(window)
        if whole and len(shown) + 4 <= walk.left:
            walk.left -= len(shown) + 4
            return shown
        keep = max(walk.left - 2, 0)
        if keep >= len(shown) and len(window) == size:  # redaction made it longer: keep it
            walk.left = 0
            return shown
        walk.left = 0
        walk.cut = True
        if walk.note is None:
            return shown[:keep + _MARGIN] if keep else shown[:_MARGIN]
        return shown[:keep] + "... " + walk.note.format(f"{size:,} characters in all")

    def _show_key(self, key: Any) -> Any:
        if isinstance(key, str) and (len(key) > _MAX_KEY or maybe_secret_text(key)):
            shown = self.text(key[:_MAX_KEY + _MARGIN])
            return shown if len(shown) <= _MAX_KEY else shown[:_MAX_KEY] + "..."
        return key

    @staticmethod
    def _more(walk: _Walk, items: list[Any], n: int) -> None:
        walk.cut = True
        if walk.note is not None:
            items.append("... " + walk.note.format(_count(n, "more item")))

    # ------------------------------------------------------------------ text
    def text(self, text: str, known: Iterable[str] = ()) -> str:
        """``text`` (a message, a traceback, a repr) with credentials and the ``known``
        secret values taken out (the first :data:`MAX_KNOWN` of them)."""
        if not text:
            return text
        spans = self._spans(text)
        if known:  # most texts (a publish's reprs) have none to look for
            spans.extend(known_spans(text, known))
        if not spans:
            return text
        out: list[str] = []
        at = 0
        for start, end in merged(spans):
            out.append(text[at:start])
            out.append(REDACTED)
            at = end
        out.append(text[at:])
        return "".join(out)

    def secrets(self, args: Sequence[Any] | None, kwargs: Mapping[str, Any] | None,
                params: Parameters | None = None) -> frozenset[str]:
        """The secret values of a task's arguments, as they may be quoted in a message:
        themselves, and as JSON and ``repr()`` would write them (the first
        :data:`MAX_KNOWN`)."""
        items = list(args or ()) if not isinstance(args, str) else [args]
        leaves = itertools.chain(
            itertools.chain.from_iterable(
                _leaves(arg, 0) if params and self.is_secret_key(params.name_of(n))
                else self._secret_leaves(arg, 0) for n, arg in enumerate(items)),
            self._secret_leaves(dict(kwargs or {}), 0))
        found = itertools.islice(
            (v for v in leaves if len(v) >= MIN_KNOWN_CHARS and v != REDACTED), MAX_KNOWN)
        forms: set[str] = set()
        for value in found:
            forms.add(value)
            forms.update(f for f in (json.dumps(value)[1:-1], repr(value)[1:-1])
                         if len(f) >= MIN_KNOWN_CHARS)
        return frozenset(forms)

    def _secret_leaves(self, value: Any, depth: int) -> Iterator[str]:
        """The values under secret keys, and the credentials inside strings, as deep as a
        worker takes a message (:data:`~jobbers_celery.core.intake.MAX_DEPTH`: deeper ones never
        run), not only as deep as a display shows."""
        if depth > INTAKE_DEPTH:
            return
        if isinstance(value, bytes | bytearray):
            value = bytes(value).decode("utf-8", "replace")
        if isinstance(value, str):
            # a credential past this in a long string is not searched for as a known value
            # (the patterns still find it where it is quoted): a cost bounded per string
            value = value[:_SCAN_CHARS]
            for start, end in self._spans(value):
                yield value[start:end]
        elif isinstance(value, Mapping):
            for key, item in value.items():
                if self.is_secret_key(key):
                    yield from _leaves(item, depth + 1)
                else:
                    yield from self._secret_leaves(item, depth + 1)
        elif isinstance(value, list | tuple):
            for item in value:
                yield from self._secret_leaves(item, depth + 1)


_PROCESS_KEYS: list[tuple[str, ...]] = []


def use_keys(keys: Iterable[str]) -> None:
    """Add ``keys`` (an installed app's ``jobbers_redact_keys``) to this process's key list,
    the one :func:`redactor` without arguments uses (for the record's and the dead letter's
    exception and traceback): the union of every installed app's list."""
    keys = tuple(keys)
    if keys not in _PROCESS_KEYS:
        _PROCESS_KEYS.append(keys)


def redactor(keys: tuple[str, ...] | None = None) -> Redactor:
    """The :class:`Redactor` of ``keys`` (one per key list and process); without ``keys``,
    this process's (see :func:`use_keys`; the defaults before any app is installed)."""
    if keys is None:
        keys = (tuple(dict.fromkeys(k for ks in _PROCESS_KEYS for k in ks))
                if _PROCESS_KEYS else DEFAULT_REDACT_KEYS)
    return _redactor(keys)


@lru_cache(maxsize=16)
def _redactor(keys: tuple[str, ...]) -> Redactor:
    return Redactor(keys)


def _compact(name: str) -> str:
    return "".join(c for c in name.lower() if c.isalnum())


def _count(n: int, what: str) -> str:
    return f"{n:,} {what}{'' if n == 1 else 's'}"


def _leaves(value: Any, depth: int) -> Iterator[str]:
    if depth > INTAKE_DEPTH or isinstance(value, bool) or value is None:
        return
    if isinstance(value, bytes | bytearray):
        yield bytes(value).decode("utf-8", "replace")
        yield repr(bytes(value))[2:-1]
    elif isinstance(value, str):
        yield value
    elif isinstance(value, int | float):
        yield str(value)
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _leaves(item, depth + 1)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _leaves(item, depth + 1)
