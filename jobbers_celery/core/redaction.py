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
#: What a secret is shown as.
REDACTED = "********"
#: What a value nested deeper than :data:`MAX_DEPTH` is shown as.
TOO_DEEP = "[nested too deep to show]"
#: A known secret value shorter than this is not searched for in text.
MIN_KNOWN_CHARS = 4
#: Known secret values searched for in one text (each also as JSON and ``repr()`` quote
#: it; see :func:`_known_spans`).
MAX_KNOWN = 1024
#: Up to this many known values (forms) each is found by the string search.
_FEW_KNOWN = 32
#: Lengths of the known values that share their first characters checked at one place.
_PER_HEAD = 6
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
_SEPARATORS = str.maketrans("", "", "_.-")

_SCHEMES = ("bearer", "basic", "token", "digest", "apikey", "api-key", "oauth", "negotiate",
            "ntlm", "hoba", "mutual", "ssws", "aws4-hmac-sha256", "splunk", "sharedaccesskey")
# scheme://userinfo@ - the userinfo ends at the last @ before a /, ? or # (bounded)
_URL_RE = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]{0,30}://)"
                     r"(?P<info>[^\s/?#'\"<>\\]{1,512})@")
_AUTH_RE = re.compile(rf"\b(?P<scheme>{'|'.join(re.escape(s) for s in _SCHEMES)})"
                      r"[ \t]{1,8}(?P<secret>[A-Za-z0-9\-._~+/:=,]{1,4096})",
                      re.IGNORECASE)
# a key and its separator (the key holds a needle, its separators anywhere: the rule
# decides); the value is read after it
_PAIR = (r"(?<![\w.\-])(?P<key>[\w.\-]{{0,40}}?(?:{needles})[\w.\-]{{0,40}})"
         r"[\"']?[ \t]{{0,8}}[=:][ \t]{{0,8}}")
# a quote closes a value only when a separator follows it (so `ab"cd` or `ab\"cd` inside it,
# escaped once or twice, do not end it); every alternative starts with another character:
# nothing to backtrack over
_CLOSE = r"[ \t]{0,8}(?:[,;&:}\])\r\n]|$)"
_DQ = rf"\"(?:\\.|[^\"\\\n]|\"(?!{_CLOSE}))*"
_SQ = rf"'(?:\\.|[^'\\\n]|'(?!{_CLOSE}))*"
_VALUE_RE = re.compile(
    rf"(?:(?P<scheme>{'|'.join(re.escape(s) for s in _SCHEMES)})[ \t]{{1,8}})?"
    rf"(?P<value>{_DQ}|{_SQ}|(?:[^\s,;&'\"()\[\]{{}}]|['\"](?!{_CLOSE}))+)",
    re.IGNORECASE)
_SCHEME_HEAD_RE = re.compile(rf"(?:{'|'.join(re.escape(s) for s in _SCHEMES)})[ \t]{{1,8}}",
                             re.IGNORECASE)
_WORDS_RE = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+")
#: A user name shown in a URL (``u``, ``svc``, ``postgres``); any other user part is hidden.
_PLAIN_USER_RE = re.compile(r"[A-Za-z][A-Za-z.\-]{0,23}")


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
        needles = "|".join("[_.\\-]?".join(re.escape(c) for c in n) for n in compacts)
        self._pair_re = re.compile(_PAIR.format(needles=needles), re.IGNORECASE) \
            if compacts else None

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
        if isinstance(key, str) and (len(key) > _MAX_KEY or _maybe_secret_text(key)):
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
        spans.extend(_known_spans(text, known))
        if not spans:
            return text
        out: list[str] = []
        at = 0
        for start, end in _merged(spans):
            out.append(text[at:start])
            out.append(REDACTED)
            at = end
        out.append(text[at:])
        return "".join(out)

    def _spans(self, text: str) -> list[tuple[int, int]]:
        """Where ``text`` holds credentials (each pattern linear; each needs a character or
        word most strings lack: looked for first, as most strings hold none)."""
        spans: list[tuple[int, int]] = []
        if "@" in text and "://" in text:
            for match in _URL_RE.finditer(text):
                spans.extend(_userinfo_spans(match))
        if (" " in text or "\t" in text) and _maybe_scheme(text):
            for match in _AUTH_RE.finditer(text):
                secret = match.group("secret")
                if not (secret.isalpha() and secret.islower()):  # "Bearer token missing"
                    spans.append(match.span("secret"))
        if ("=" in text or ":" in text) and self._pair_re is not None:
            compact = text.lower().translate(_SEPARATORS)
            if any(n in compact for n in self._compacts):
                spans.extend(self._pair_spans(text))
        return spans

    def _pair_spans(self, text: str) -> Iterator[tuple[int, int]]:
        """The values of ``key=value`` pairs with a secret key (each value read once: the
        search goes on after it)."""
        assert self._pair_re is not None
        at = 0
        while (match := self._pair_re.search(text, at)) is not None:
            at = match.end()
            # of a dotted name its last part (db.password; not secrets.LoginError)
            if not self.is_secret_key(match.group("key").rsplit(".", 1)[-1]):
                continue
            value = _VALUE_RE.match(text, at)
            if value is None:
                continue
            start, end = value.span("value")
            if value.group("value")[0] in "'\"":
                start += 1  # the closing quote is not part of it: kept
                head = _SCHEME_HEAD_RE.match(text, start, end)  # "Bearer <token>": shown
                start = head.end() if head else start
            if end > start and text[start:end] != REDACTED:
                yield start, end
            at = max(end, at)

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


def _maybe_scheme(text: str) -> bool:
    folded = text.lower()
    return any(s in folded for s in ("bearer", "basic", "token", "digest", "key", "auth",
                                     "negotiate", "ntlm", "hoba", "mutual", "ssws", "aws4",
                                     "splunk"))


def _maybe_secret_text(text: str) -> bool:
    return "=" in text or ":" in text or " " in text or "@" in text


def _userinfo_spans(match: re.Match[str]) -> Iterator[tuple[int, int]]:
    """The secret parts of a URL's user part: its password, and the user unless it is a
    plain name (a token as the user: GitHub's ``https://ghp_...@``, a Sentry DSN's key)."""
    info = match.group("info")
    start = match.start("info")
    user, colon, password = info.partition(":")
    if user and user != REDACTED and not _PLAIN_USER_RE.fullmatch(user):
        yield start, start + len(user)
    if colon and password:
        yield start + len(user) + 1, start + len(info)


def _known_spans(text: str, known: Iterable[str]) -> Iterator[tuple[int, int]]:
    """Where ``text`` quotes the known secret values (the first :data:`MAX_KNOWN` of them,
    in their three forms): a few are each found by the string search; more, in one pass
    over ``text`` with an index by their first characters (at most :data:`_PER_HEAD`
    lengths checked at a place), so the cost is the text's length, not values times
    length."""
    values = [v for v in dict.fromkeys(known) if len(v) >= MIN_KNOWN_CHARS][:3 * MAX_KNOWN]
    if len(values) <= _FEW_KNOWN:
        for value in values:
            at = text.find(value)
            while at >= 0:
                yield at, at + len(value)
                at = text.find(value, at + len(value))
        return
    # first characters -> the lengths of the values starting so (longest first), and them
    index: dict[str, tuple[list[int], set[str]]] = {}
    for value in values:
        lengths, found = index.setdefault(value[:MIN_KNOWN_CHARS], ([], set()))
        if len(value) not in lengths:
            if len(lengths) >= _PER_HEAD:
                continue
            lengths.append(len(value))
            lengths.sort(reverse=True)
        found.add(value)
    for at in range(len(text) - MIN_KNOWN_CHARS + 1):
        entry = index.get(text[at:at + MIN_KNOWN_CHARS])
        if entry is not None:
            for length in entry[0]:
                if text[at:at + length] in entry[1]:
                    yield at, at + length
                    break


def _merged(spans: list[tuple[int, int]]) -> Iterator[tuple[int, int]]:
    spans.sort()
    start, end = spans[0]
    for s, e in spans[1:]:
        if s <= end:
            end = max(end, e)
        else:
            yield start, end
            start, end = s, e
    yield start, end


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
