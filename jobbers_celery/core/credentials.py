"""Credentials in free text: the patterns that find them, and the search for known values.

What :meth:`~jobbers_celery.core.redaction.Redactor.text` takes out of a message, a traceback
or a repr (the rule is the redaction module's): the user part of a URL, the token after an
authorization scheme, the value of a ``key=value`` pair whose key is secret, and the secret
values of the task's own arguments. Every pattern is linear (no repetition that can
backtrack over the text); each needs a character or word most strings lack, looked for first.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator

__all__ = ["MAX_KNOWN", "MIN_KNOWN_CHARS", "REDACTED", "CredentialFinder", "known_spans",
           "maybe_secret_text", "merged"]

#: What a secret is shown as.
REDACTED = "********"
#: A known secret value shorter than this is not searched for in text.
MIN_KNOWN_CHARS = 4
#: Known secret values searched for in one text (each also as JSON and ``repr()`` quote
#: it; see :func:`known_spans`).
MAX_KNOWN = 1024
#: Up to this many known values (forms) each is found by the string search.
_FEW_KNOWN = 32
#: Lengths of the known values that share their first characters checked at one place.
_PER_HEAD = 6
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
#: A user name shown in a URL (``u``, ``svc``, ``postgres``); any other user part is hidden.
_PLAIN_USER_RE = re.compile(r"[A-Za-z][A-Za-z.\-]{0,23}")


class CredentialFinder:
    """Where a text holds credentials, for one key rule: ``compacts``, the key needles
    lower-cased without separators (longest first), and ``is_secret_key``, the rule."""

    def __init__(self, compacts: tuple[str, ...], is_secret_key: Callable[[str], bool]) -> None:
        self._compacts = compacts
        self._is_secret_key = is_secret_key
        needles = "|".join("[_.\\-]?".join(re.escape(c) for c in n) for n in compacts)
        self._pair_re = re.compile(_PAIR.format(needles=needles), re.IGNORECASE) \
            if compacts else None

    def spans(self, text: str) -> list[tuple[int, int]]:
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
            if not self._is_secret_key(match.group("key").rsplit(".", 1)[-1]):
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


def maybe_secret_text(text: str) -> bool:
    """Whether a credential pattern could match ``text`` at all."""
    return "=" in text or ":" in text or " " in text or "@" in text


def _maybe_scheme(text: str) -> bool:
    folded = text.lower()
    return any(s in folded for s in ("bearer", "basic", "token", "digest", "key", "auth",
                                     "negotiate", "ntlm", "hoba", "mutual", "ssws", "aws4",
                                     "splunk"))


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


def known_spans(text: str, known: Iterable[str]) -> Iterator[tuple[int, int]]:
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


def merged(spans: list[tuple[int, int]]) -> Iterator[tuple[int, int]]:
    """``spans`` sorted, those that overlap as one."""
    spans.sort()
    start, end = spans[0]
    for s, e in spans[1:]:
        if s <= end:
            end = max(end, e)
        else:
            yield start, end
            start, end = s, e
    yield start, end
