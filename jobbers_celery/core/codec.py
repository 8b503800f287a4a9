"""Secrets at rest: the text jobbers keeps of a task's arguments, sealed with AES-256-GCM.

Opt in with ``jobbers_payload_keys``: a list of ``"<id>:<base64 of 32 bytes>"`` keys
(``python -c "from jobbers_celery.codec import new_key; print(new_key())"`` prints a new
one). The first seals; every one opens, so a key is rotated by putting a new one first and
keeping the old ones until nothing sealed with them is left. A sealed value is a
self-describing JSON object::

    {"$jobbers_sealed": "v1", "kid": "<id of its key>", "data": "<base64>"}

``data`` is a random 96-bit nonce followed by the AES-GCM ciphertext and its tag; the
version and key id are authenticated with it (associated data), so an envelope whose
fields were changed does not open. The cryptography is the ``cryptography`` package's
(``jobbers[crypto]``), imported only when keys are set. Pure otherwise: standard library.

Nothing here decides what is sealed (see :mod:`jobbers_celery.lifecycle.payload`) and nothing raises
into a task: :class:`CannotOpen` says why a value does not open (no key here, another key,
altered), for a caller that shows :data:`ENCRYPTED` or leaves a publish to a process that
holds the key.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from jobbers_celery.core.errors import ConfigurationError

__all__ = ["ENCRYPTED", "SEALED", "CannotOpen", "PayloadCodec", "PayloadKey", "is_sealed",
           "new_key", "parse_keys", "require_backend"]

#: The marker key of a sealed value (and its format version).
SEALED = "$jobbers_sealed"
VERSION = "v1"
#: What a reader without the key sees instead of the sealed values.
ENCRYPTED = "[encrypted]"
KEY_BYTES = 32  # AES-256
NONCE_BYTES = 12  # 96 bits, GCM's own size
_TAG_BYTES = 16
_KID_RE = re.compile(r"[A-Za-z0-9_.\-]{1,32}")
_ENVELOPE_KEYS = frozenset({SEALED, "kid", "data"})
_EXTRA = "pip install 'jobbers[crypto]'"
_NEW_KEY = 'new one: python -c "from jobbers_celery.codec import new_key; print(new_key())"'


class CannotOpen(Exception):
    """A sealed value that does not open here: its key is not held, or it was altered.
    The message names the key id, never a key or a value."""

    def __init__(self, kid: str, why: str) -> None:
        super().__init__(f"its arguments are encrypted with payload key {kid!r}: {why}")
        self.kid = kid
        self.why = why


@dataclass(frozen=True, slots=True)
class PayloadKey:
    """One key of ``jobbers_payload_keys``: its id (named by what it sealed) and 32 bytes."""

    kid: str
    secret: bytes = field(repr=False)


def new_key(kid: str | None = None) -> str:
    """A new key in the setting's form, ``"<id>:<base64 of 32 random bytes>"``."""
    kid = kid or f"k{secrets.token_hex(4)}"
    if not _KID_RE.fullmatch(kid):
        raise ValueError("a key id is 1-32 letters, digits or _.-")
    return f"{kid}:{base64.b64encode(os.urandom(KEY_BYTES)).decode()}"


def parse_keys(raw: object) -> tuple[PayloadKey, ...]:
    """The keys of ``jobbers_payload_keys`` (a list or tuple of ``"<id>:<base64>"``; empty:
    nothing sealed). Raises :class:`ConfigurationError` naming the bad entry by position,
    never quoting a key."""
    if raw is None or raw == "" or raw == () or raw == []:
        return ()
    if not isinstance(raw, list | tuple):
        raise ConfigurationError(
            "jobbers_payload_keys must be a list of '<id>:<base64 of 32 bytes>' strings "
            f"({_NEW_KEY}), got a {type(raw).__name__}")
    keys: list[PayloadKey] = []
    for n, item in enumerate(raw):
        where = f"jobbers_payload_keys[{n}]"
        if not isinstance(item, str) or ":" not in item:
            raise ConfigurationError(
                f"{where} must be a string '<id>:<base64 of 32 bytes>' ({_NEW_KEY})")
        kid, _, encoded = item.partition(":")
        if not _KID_RE.fullmatch(kid):
            raise ConfigurationError(f"{where}: its id must be 1-32 letters, digits or _.-")
        try:
            secret = base64.b64decode(encoded.strip(), validate=True)
        except (binascii.Error, ValueError):
            raise ConfigurationError(f"{where} (id {kid!r}): the key is not base64") from None
        if len(secret) != KEY_BYTES:
            raise ConfigurationError(
                f"{where} (id {kid!r}): the key must be {KEY_BYTES} bytes (AES-256), it is "
                f"{len(secret)}")
        if any(k.kid == kid for k in keys):
            raise ConfigurationError(f"{where}: the id {kid!r} is used twice")
        keys.append(PayloadKey(kid, secret))
    return tuple(keys)


def require_backend() -> None:
    """Raise :class:`ConfigurationError` (naming the extra) if ``cryptography`` is missing."""
    try:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM  # noqa: F401
    except ImportError as exc:
        raise ConfigurationError(
            f"jobbers_payload_keys is set but the cryptography package cannot be imported "
            f"({exc}): {_EXTRA}") from None


def is_sealed(value: object) -> bool:
    """Whether ``value`` is a sealed envelope (its shape only: it may not open): the three
    keys, a short version, a key id of the setting's form (so that a reason naming it is
    short and printable) and text data."""
    if not (isinstance(value, Mapping) and value.keys() == _ENVELOPE_KEYS):
        return False
    version, kid = value.get(SEALED), value.get("kid")
    return (isinstance(version, str) and len(version) <= 16 and isinstance(kid, str)
            and _KID_RE.fullmatch(kid) is not None and isinstance(value.get("data"), str))


def _aad(version: str, kid: str) -> bytes:
    return f"jobbers-payload:{version}:{kid}".encode()


class PayloadCodec:
    """Seals text with the first key and opens it with any. Without keys it seals nothing
    (``enabled`` is false) and opens nothing. Build it with :meth:`of` (cached per key list)."""

    #: The marker key of a sealed value (a query for sealed rows names it).
    MARKER = SEALED

    def __init__(self, keys: Sequence[PayloadKey] = ()) -> None:
        self.keys = tuple(keys)
        self._ciphers: dict[str, Any] = {}
        if self.keys:
            require_backend()
            from cryptography.hazmat.primitives.ciphers.aead import AESGCM

            self._ciphers = {k.kid: AESGCM(k.secret) for k in self.keys}

    @classmethod
    def of(cls, raw: object) -> PayloadCodec:
        """The codec of a ``jobbers_payload_keys`` value (one per distinct list)."""
        return _codec(tuple(raw) if isinstance(raw, list | tuple) else raw)

    @property
    def enabled(self) -> bool:
        return bool(self.keys)

    @property
    def kids(self) -> tuple[str, ...]:
        return tuple(k.kid for k in self.keys)

    def holds(self, envelope: Mapping[str, Any]) -> bool:
        """Whether this codec holds the key ``envelope`` names (it may still be altered)."""
        return envelope.get("kid") in self._ciphers

    def seal(self, text: str) -> dict[str, str]:
        """``text`` sealed with the first key. Raises ``ValueError`` if there is none."""
        if not self.keys:
            raise ValueError("no payload key to seal with (jobbers_payload_keys is empty)")
        kid = self.keys[0].kid
        nonce = os.urandom(NONCE_BYTES)
        sealed = self._ciphers[kid].encrypt(nonce, text.encode("utf-8", "surrogatepass"),
                                            _aad(VERSION, kid))
        return {SEALED: VERSION, "kid": kid,
                "data": base64.b64encode(nonce + sealed).decode("ascii")}

    def open(self, envelope: Mapping[str, Any]) -> str:
        """The text ``envelope`` holds; :class:`CannotOpen` if it is not a sealed value this
        codec can open (another key, none here, altered or cut)."""
        if not is_sealed(envelope):
            raise CannotOpen("?", "not a sealed value")
        kid = str(envelope["kid"])
        if envelope[SEALED] != VERSION:
            raise CannotOpen(kid, f"its format {envelope[SEALED]!r} is unknown to this "
                                  "version of jobbers")
        cipher = self._ciphers.get(kid)
        if cipher is None:
            held = ", ".join(repr(k) for k in self.kids) or "none"
            raise CannotOpen(kid, f"this process does not hold it (it holds {held}; see "
                                  "jobbers_payload_keys)")
        try:
            raw = base64.b64decode(envelope["data"], validate=True)
        except (binascii.Error, ValueError):
            raise CannotOpen(kid, "its data is not base64 (altered)") from None
        if len(raw) < NONCE_BYTES + _TAG_BYTES:
            raise CannotOpen(kid, "its data is cut short (altered)")
        from cryptography.exceptions import InvalidTag

        try:
            text = cipher.decrypt(raw[:NONCE_BYTES], raw[NONCE_BYTES:], _aad(VERSION, kid))
        except InvalidTag:
            raise CannotOpen(kid, "it does not open with the key of that id (another key "
                                  "with the same id, or the value was altered)") from None
        return str(text.decode("utf-8", "surrogatepass"))


@lru_cache(maxsize=16)
def _codec(raw: object) -> PayloadCodec:
    return PayloadCodec(parse_keys(raw))
