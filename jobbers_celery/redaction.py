"""Secrets hidden wherever people read: task arguments, exception messages, tracebacks. Pure.

One implementation for every place that shows a task's values: Celery's ``argsrepr`` and
``kwargsrepr`` (worker logs, task events, so Flower), the exception a task raises (logs,
events, the record, the dead letter), and jobbers_django's admin and API. Only what is
shown is redacted: the broker body, the record's payload and the dead letter keep the real
arguments, because a retry or a resubmission needs them.

What is secret:

- a value under a key that contains one of the needles (``jobbers_redact_keys``,
  case-insensitive, ``-`` and ``_`` alike), at any depth of dicts and lists;
- a positional argument whose parameter name is such a key (``login('ann', 'hunter2')`` of
  ``def login(user, password)``), and the rest of ``*args`` when its name is one;
- wherever it is, text that looks like a credential: the password of a URL
  (``postgres://u:hunter2@host/db`` keeps scheme, user and host), a ``Bearer``/``Basic``
  token, and ``password=...``/``"token": "..."`` pairs whose key is a needle;
- in an exception message or traceback, also the secret values of the same task's
  arguments (4 characters or more: shorter ones would mask ordinary words).
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

__all__ = ["DEFAULT_REDACT_KEYS", "REDACTED", "Parameters", "Redactor", "parameters",
           "redactor"]

#: Substrings of the names (keys, parameters) whose values are secret.
DEFAULT_REDACT_KEYS: tuple[str, ...] = (
    "password", "passwd", "token", "secret", "api_key", "apikey", "authorization",
    "credential", "private_key",
)
#: What a secret is shown as.
REDACTED = "********"
#: A known secret value shorter than this is not searched for in text.
MIN_KNOWN_CHARS = 4
_MAX_DEPTH = 32
#: Characters a string is kept past the visible part (the longest credential pattern).
_MARGIN = 600

# scheme://user:password@ - the password is anything up to the @ of the authority
# (every repetition not anchored by a literal is bounded: linear time on any input)
_URL_RE = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]{0,30}://[^\s:/?#@'\"]{0,256}:)"
                     r"(?P<secret>[^\s/?#@'\"]{1,256})(?=@)")
_AUTH_RE = re.compile(r"(?P<head>\b(?:Bearer|Basic)\s+)(?P<secret>[A-Za-z0-9\-._~+/]+=*)",
                      re.IGNORECASE)


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


class Redactor:
    """Redaction with one list of key needles (make it with :func:`redactor`: cached)."""

    def __init__(self, keys: Iterable[str] = DEFAULT_REDACT_KEYS) -> None:
        self.needles = tuple(_norm(k) for k in keys if k)
        words = "|".join(re.escape(n).replace("_", "[_-]") for n in self.needles)
        # key = value, key: value, "key": "value" (the key contains a needle)
        self._pair_re = re.compile(
            rf"(?P<head>\b[\w-]{{0,32}}?(?:{words})[\w-]{{0,32}}['\"]?[ \t]*[=:][ \t]*)"
            r"(?P<secret>\"[^\"\n]*\"|'[^'\n]*'|[^\s,;&'\"()\[\]{}]+)",
            re.IGNORECASE) if self.needles else None

    def is_secret_key(self, key: object) -> bool:
        """Whether the value under ``key`` (a dict key, a parameter name) is secret."""
        if not isinstance(key, str):
            return False
        name = _norm(key)
        return any(n in name for n in self.needles)

    def value(self, value: Any, limit: int | None = None) -> Any:
        """A copy of ``value`` (JSON-like) with its secrets replaced by :data:`REDACTED`.

        With ``limit``, for a display that shows no more than that many characters of it
        (a repr cut at ``limit``): what lies beyond is left out, strings and lists cut, so a
        big value costs no more than a small one."""
        return self._value(value, 0, [limit] if limit else None)

    def arguments(self, args: Sequence[Any] | None, kwargs: Mapping[str, Any] | None,
                  params: Parameters | None = None,
                  limit: int | None = None) -> tuple[list[Any], dict[str, Any]]:
        """``args`` and ``kwargs`` as shown: positional ones matched to ``params``
        (``limit``: as for :meth:`value`, for each of them)."""
        budget = [limit] if limit else None
        shown_args: list[Any] = []
        for n, arg in enumerate(args or ()):
            if budget is not None and budget[0] <= 0:
                break
            secret = params is not None and self.is_secret_key(params.name_of(n))
            shown_args.append(REDACTED if secret else self._value(arg, 1, budget))
        shown_kwargs = self._value(dict(kwargs or {}), 0, [limit] if limit else None)
        return shown_args, shown_kwargs

    def text(self, text: str, known: Iterable[str] = ()) -> str:
        """``text`` (a message, a traceback, a repr) with credentials and the ``known``
        secret values taken out."""
        if not text:
            return text
        for value in sorted(set(known), key=len, reverse=True):
            if len(value) >= MIN_KNOWN_CHARS and value in text:
                text = text.replace(value, REDACTED)
        # each pattern needs a character or word most strings lack: look for it first (a
        # publish redacts every argument string, so the common case must cost little)
        if "@" in text and "://" in text:
            text = _URL_RE.sub(_mask, text)
        folded = text.lower()
        if "bearer" in folded or "basic" in folded:
            text = _AUTH_RE.sub(_mask_token, text)
        if self._pair_re is not None and ("=" in text or ":" in text):
            text = self._pair_re.sub(_mask_pair, text)
        return text

    def secrets(self, args: Sequence[Any] | None, kwargs: Mapping[str, Any] | None,
                params: Parameters | None = None) -> frozenset[str]:
        """The secret values of a task's arguments, as they may be quoted in a message:
        themselves, and as JSON and ``repr()`` would write them."""
        found: set[str] = set()
        for n, arg in enumerate(args or ()):
            if params and self.is_secret_key(params.name_of(n)):
                found.update(_leaves(arg, 0))
            else:
                found.update(self._secret_leaves(arg, 0))
        found.update(self._secret_leaves(dict(kwargs or {}), 0))
        forms: set[str] = set()
        for value in found:
            if len(value) >= MIN_KNOWN_CHARS:
                forms.add(value)
                forms.update(f for f in (json.dumps(value)[1:-1], repr(value)[1:-1])
                             if len(f) >= MIN_KNOWN_CHARS)
        return frozenset(forms)

    def _value(self, value: Any, depth: int, budget: list[int] | None) -> Any:
        """``budget``: characters of repr still visible (``None``: all of it); what is past
        it is left out. A string is cut a margin past it, so that a credential starting in
        the visible part is still whole when the patterns look at it."""
        if depth > _MAX_DEPTH:
            return value
        if isinstance(value, str):
            if budget is not None:
                value = value[:max(budget[0], 0) + _MARGIN]
                budget[0] -= len(value) + 4
            return self.text(value)
        if isinstance(value, Mapping):
            out: dict[Any, Any] = {}
            for key, item in value.items():
                if budget is not None:
                    if budget[0] <= 0:
                        break
                    budget[0] -= len(str(key)) + 4
                out[key] = (REDACTED if self.is_secret_key(key)
                            else self._value(item, depth + 1, budget))
            return out
        if isinstance(value, list | tuple):
            items: list[Any] = []
            for item in value:
                if budget is not None and budget[0] <= 0:
                    break
                items.append(self._value(item, depth + 1, budget))
            return items
        if budget is not None:
            budget[0] -= 3  # a number, None, ...: a few characters at least
        return value

    def _secret_leaves(self, value: Any, depth: int) -> Iterator[str]:
        """The values under secret keys, and the credentials inside strings."""
        if depth > _MAX_DEPTH:
            return
        if isinstance(value, str):
            for pattern in (_URL_RE, _AUTH_RE, self._pair_re):
                if pattern is not None:
                    for match in pattern.finditer(value):
                        found = match.group("secret").strip("'\"")
                        if found.lower() not in ("bearer", "basic"):
                            yield found
        elif isinstance(value, Mapping):
            for key, item in value.items():
                if self.is_secret_key(key):
                    yield from _leaves(item, depth + 1)
                else:
                    yield from self._secret_leaves(item, depth + 1)
        elif isinstance(value, list | tuple):
            for item in value:
                yield from self._secret_leaves(item, depth + 1)


@lru_cache(maxsize=16)
def redactor(keys: tuple[str, ...] = DEFAULT_REDACT_KEYS) -> Redactor:
    """The :class:`Redactor` of ``keys`` (one per key list and process)."""
    return Redactor(keys)


def _norm(name: str) -> str:
    return name.lower().replace("-", "_")


def _leaves(value: Any, depth: int) -> Iterator[str]:
    if depth > _MAX_DEPTH or isinstance(value, bool) or value is None:
        return
    if isinstance(value, str):
        yield value
    elif isinstance(value, int | float):
        yield str(value)
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _leaves(item, depth + 1)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _leaves(item, depth + 1)


def _mask(match: re.Match[str]) -> str:
    return match.group("head") + REDACTED


def _mask_token(match: re.Match[str]) -> str:
    token = match.group("secret")
    # "Bearer token missing" names a token, it does not quote one
    if token.isalpha() and token.islower():
        return match.group(0)
    return match.group("head") + REDACTED


def _mask_pair(match: re.Match[str]) -> str:
    secret = match.group("secret")
    if secret.strip("'\"") == REDACTED or secret.lower() in ("bearer", "basic"):
        return match.group(0)  # masked already, or the scheme of a token masked after it
    quote = secret[0] if secret[0] in "'\"" and len(secret) > 1 else ""
    return f"{match.group('head')}{quote}{REDACTED}{quote}"
