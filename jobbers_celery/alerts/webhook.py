"""Posting an alert to a webhook: JSON over HTTP(S) with the standard library, bounded in
time and in what is read back, to a public address only.

- **One deadline for the whole post** (``jobbers_alert_timeout``): the name lookup, the
  connection, TLS, sending and reading the answer's status line share it. Each socket
  operation waits at most what is left of it, so a receiver that drips its answer a byte a
  second holds the alert thread no longer than the timeout (a per-operation timeout would
  let it hold it for ever).
- **The address checked is the one connected to.** The host is resolved once; every
  address it resolves to must be public (or in ``jobbers_alert_webhook_allow_networks``,
  :mod:`jobbers_celery.core.destinations`); the connection goes to one of those addresses,
  with the name in the ``Host`` header and TLS (SNI and certificate), so no second lookup
  can answer another address (DNS rebinding).
- **A redirect is an error**, never followed (it would send the alert, and the workers'
  requests, wherever the receiver points). The status line is all that is read.
- **No proxy**: environment proxies (``HTTPS_PROXY``) are not used, since a proxy would
  connect to an address jobbers cannot check.
"""

from __future__ import annotations

import base64
import json
import re
import socket
import ssl
import threading
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote, unquote, urlsplit

from jobbers_celery.core.destinations import SETTING, Network, host_address, refusal

__all__ = ["RefusedDestination", "WebhookError", "destination_refusal", "post", "where"]

#: Bytes of the answer read at most while looking for its status line.
_STATUS_MAX = 8192
#: Characters a path or query keeps as they are (RFC 3986 pchar, ``/``, ``?`` and ``%``).
_SAFE = "/%:@!$&'()*+,;=-._~"
#: A host name as the ``Host`` header carries it (after IDNA): letters, digits, ``.-_``.
_NAME_RE = re.compile(r"^[A-Za-z0-9._-]{1,253}$")
_SockAddr = tuple[Any, ...]
_TLS: list[ssl.SSLContext] = []


class WebhookError(Exception):
    """The receiver refused the alert, or could not be reached in time."""


class RefusedDestination(WebhookError):
    """The webhook's host is (or resolves to) an address jobbers does not post to."""


def where(url: str) -> str:
    """What a log may say of ``url``: scheme and host (a Slack webhook's path is its
    secret, as is a user and password in the URL)."""
    try:
        parts = urlsplit(url)
        port = parts.port  # raises ValueError for a port out of range
    except ValueError:
        return "a malformed URL"
    return f"{parts.scheme}://{parts.hostname or '?'}" + (f":{port}" if port else "")


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the deadline passed")
    return left


def _lookup(host: str, port: int, deadline: float) -> list[tuple[int, _SockAddr]]:
    """``host``'s addresses (family, socket address), the lookup bounded by ``deadline``
    (``getaddrinfo`` has no timeout of its own: a name lookup runs on a helper thread,
    left to finish alone if the deadline passes)."""
    def lookup() -> list[tuple[int, _SockAddr]]:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                   proto=socket.IPPROTO_TCP)
        return [(family, sockaddr) for family, _, _, _, sockaddr in found
                if family in (socket.AF_INET, socket.AF_INET6)]

    if host_address(host) is not None:
        return lookup()  # an address: no lookup happens
    box: list[list[tuple[int, _SockAddr]] | BaseException] = []
    done = threading.Event()

    def run() -> None:
        try:
            box.append(lookup())
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
            box.append(exc)
        done.set()

    threading.Thread(target=run, name="jobbers-alerts-lookup", daemon=True).start()
    if not done.wait(_left(deadline)):
        raise TimeoutError("the name lookup took too long")
    if isinstance(box[0], BaseException):
        raise box[0]
    return box[0]


def _checked(url: str, host: str, port: int, allow: Sequence[Network],
             deadline: float) -> list[tuple[int, _SockAddr]]:
    """Every address ``host`` resolves to, each checked; :class:`RefusedDestination` if
    any is refused (a name that also answers an internal address is not trusted)."""
    found = _lookup(host, port, deadline)
    if not found:
        raise OSError(f"{host} has no IPv4 or IPv6 address")
    for _, sockaddr in found:
        text = str(sockaddr[0])
        address = host_address(text.split("%", 1)[0])
        why = "unreadable" if address is None else refusal(address, allow)
        if why is not None:
            raise RefusedDestination(
                f"{where(url)} refused: it resolves to {address or '?'}, a {why} address "
                f"(alerts go to public addresses only unless {SETTING} names its network)")
    return found


def destination_refusal(url: str, allow: Sequence[Network], timeout: float) -> str | None:
    """Why ``url`` would be refused at send time (its host's addresses, looked up within
    ``timeout``); ``None``: nothing refuses it now, or its name does not resolve from here
    (then each send checks it again). For the admin's form."""
    try:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        _checked(url, parts.hostname or "", port, allow, time.monotonic() + timeout)
    except RefusedDestination as exc:
        return str(exc)
    except (OSError, ValueError, UnicodeError):
        return None
    return None


def _connect(found: list[tuple[int, _SockAddr]], deadline: float) -> socket.socket:
    error: OSError = OSError("no address")
    for family, sockaddr in found:
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.settimeout(_left(deadline))
            sock.connect(sockaddr)
        except OSError as exc:
            sock.close()
            if isinstance(exc, TimeoutError):
                raise
            error = exc
            continue
        return sock
    raise error


def _tls(sock: socket.socket, host: str, deadline: float) -> ssl.SSLSocket:
    if not _TLS:
        _TLS.append(ssl.create_default_context())  # loads the CA bundle once
    secure = _TLS[0].wrap_socket(sock, server_hostname=host, do_handshake_on_connect=False)
    try:
        secure.settimeout(_left(deadline))
        secure.do_handshake()  # one deadline over the whole handshake (CPython's _ssl)
    except BaseException:
        secure.close()
        raise
    return secure


def _request(url: str, body: bytes) -> tuple[str, int, bytes]:
    """The host, port and bytes of the POST of ``body`` to ``url``."""
    parts = urlsplit(url)
    host, port = parts.hostname or "", parts.port
    default = 443 if parts.scheme == "https" else 80
    address = host_address(host)
    if address is None:
        name = host.encode("idna").decode("ascii")
        if not _NAME_RE.match(name):  # nothing else reaches a header line
            raise ValueError("the host is not a name of letters, digits, '.', '-' or '_'")
    elif getattr(address, "scope_id", None):  # a zone is this machine's, and free text
        raise ValueError("an IPv6 address with a zone id is not a webhook destination")
    else:  # the address's own form, never the URL's text
        name = f"[{address.compressed}]" if address.version == 6 else str(address)
    target = quote(parts.path or "/", safe=_SAFE) + (
        "?" + quote(parts.query, safe=_SAFE + "?") if parts.query else "")
    lines = [f"POST {target} HTTP/1.1", f"Host: {name}" + (
        f":{port}" if port and port != default else ""),
        "Content-Type: application/json; charset=utf-8", "User-Agent: jobbers-alerts",
        f"Content-Length: {len(body)}", "Connection: close"]
    if parts.username is not None:
        user = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
        lines.append("Authorization: Basic " + base64.b64encode(user.encode()).decode())
    return host, port or default, ("\r\n".join(lines) + "\r\n\r\n").encode("ascii") + body


def _exchange(sock: socket.socket, request: bytes, deadline: float) -> bytes:
    """Send ``request``, then read up to the answer's status line, each operation within
    what is left of ``deadline``."""
    view = memoryview(request)
    while view:
        sock.settimeout(_left(deadline))
        view = view[sock.send(view):]
    got = b""
    while b"\r\n" not in got:
        if len(got) > _STATUS_MAX:
            raise ValueError("no HTTP status line in its answer")
        sock.settimeout(_left(deadline))
        chunk = sock.recv(1024)
        if not chunk:
            raise ConnectionError("it closed the connection without an answer")
        got += chunk
    return got.split(b"\r\n", 1)[0]


def post(url: str, body: dict[str, Any], timeout: float,
         allow: Sequence[Network] = ()) -> int:
    """POST ``body`` as JSON to ``url`` within ``timeout`` seconds in all, to a public
    address (or one in ``allow``); returns the HTTP status (2xx), else raises
    :class:`WebhookError` saying why (without the URL's path)."""
    deadline = time.monotonic() + timeout
    data = json.dumps(body, ensure_ascii=False).encode("utf-8")
    try:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https"):
            raise ValueError("not an http:// or https:// URL")
        found = _checked(url, parts.hostname or "", parts.port or (
            443 if parts.scheme == "https" else 80), allow, deadline)  # before anything else
        host, _, request = _request(url, data)
        sock: socket.socket = _connect(found, deadline)
        try:
            if parts.scheme == "https":
                sock = _tls(sock, host, deadline)
            line = _exchange(sock, request, deadline)
        finally:
            sock.close()
    except RefusedDestination:
        raise
    except TimeoutError:
        raise WebhookError(f"{where(url)} gave no answer within {timeout:g} s (the whole "
                           "post: lookup, connect, TLS, send, answer)") from None
    except (OSError, ValueError, UnicodeError) as exc:
        raise WebhookError(f"{where(url)} unreachable: {type(exc).__name__}: "
                           f"{str(exc)[:200]}") from None
    fields = line.split(None, 2)
    if len(fields) < 2 or not fields[0].startswith(b"HTTP/") or not fields[1].isdigit():
        raise WebhookError(f"{where(url)} answered something other than HTTP")
    status = int(fields[1])
    if 300 <= status < 400:
        raise WebhookError(f"{where(url)} answered HTTP {status} (a redirect: not followed)")
    if not 200 <= status < 300:
        raise WebhookError(f"{where(url)} answered HTTP {status}")
    return status
