"""Which addresses an alert webhook may reach. Pure (no lookup, no connection).

Whoever edits an alert rule chooses a URL every worker process then POSTs to: without a
check, ``http://169.254.169.254/...`` (a cloud's metadata service), ``http://127.0.0.1:
8500/`` (an admin port on the worker's host) or any ``10.x`` service would be reachable
from the workers (server-side request forgery). So an address that is not public is
refused unless ``jobbers_alert_webhook_allow_networks`` names a network holding it:
loopback, private, link-local, multicast, reserved, unspecified, and every other address
Python's :mod:`ipaddress` does not call global (``100.64.0.0/10``, where some clouds keep
their metadata service, among them). An IPv6 address that carries an IPv4 one (mapped
``::ffff:a.b.c.d``, 6to4 ``2002::/16``, NAT64 ``64:ff9b::/96``) is judged as that IPv4
address too (a mapped one only as that: it is the IPv4 address a connection reaches).
:func:`host_address` reads what a host denotes by itself, in every form the
system's resolver takes without a lookup (``127.1``, ``0x7f000001``, ``2130706433``).
"""

from __future__ import annotations

import re
import socket
from collections.abc import Iterable
from ipaddress import (
    IPv4Address,
    IPv4Network,
    IPv6Address,
    IPv6Network,
    ip_address,
    ip_network,
)

from jobbers_celery.core.errors import ConfigurationError

__all__ = ["SETTING", "Address", "Network", "embedded_ipv4", "host_address", "host_refusal",
           "parse_networks", "refusal"]

Address = IPv4Address | IPv6Address
Network = IPv4Network | IPv6Network
#: The setting that lets internal receivers in (named in every refusal).
SETTING = "jobbers_alert_webhook_allow_networks"
_NAT64 = IPv6Network("64:ff9b::/96")
_SITE_LOCAL = IPv6Network("fec0::/10")
#: The characters of a host ``inet_aton`` may read as an IPv4 address (digits, hex, dots).
_NUMERIC_RE = re.compile(r"^[0-9a-fA-FxX.]{1,64}$")
_MAX_NETWORKS = 256


def parse_networks(raw: object, setting: str = SETTING) -> tuple[Network, ...]:
    """The networks of ``setting`` (a list of CIDR strings: ``["10.20.0.0/16",
    "fd00::/8"]``); :class:`ConfigurationError` naming the one that is not a network."""
    if raw is None:
        return ()
    if isinstance(raw, str) or not isinstance(raw, list | tuple):
        raise ConfigurationError(f"{setting} must be a list of networks such as "
                                 f"'10.20.0.0/16', got {raw!r:.80}")
    if len(raw) > _MAX_NETWORKS:
        raise ConfigurationError(f"{setting} holds at most {_MAX_NETWORKS} networks")
    networks: list[Network] = []
    for n, value in enumerate(raw):
        try:
            if not isinstance(value, str) or len(value) > 64:
                raise ValueError(value)
            networks.append(ip_network(value.strip(), strict=True))
        except ValueError:
            raise ConfigurationError(
                f"{setting}[{n}] must be a network such as '10.20.0.0/16' or 'fd00::/8' "
                f"(host bits zero), got {value!r:.80}") from None
    return tuple(networks)


def embedded_ipv4(address: IPv6Address) -> IPv4Address | None:
    """The IPv4 address an IPv6 one carries to an IPv4 host (mapped, 6to4, NAT64)."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address in _NAT64:
        return IPv4Address(int(address) & 0xFFFF_FFFF)
    return None


def _kind(address: Address) -> str | None:
    """What kind of non-public address ``address`` is; ``None``: a public one."""
    if address.is_unspecified:
        return "unspecified"
    if address.is_loopback:
        return "loopback"
    if address.is_link_local:
        return "link-local"
    if address.is_multicast:
        return "multicast"
    if address.is_private:
        return "private"
    if address.is_reserved:
        return "reserved"
    if isinstance(address, IPv6Address) and address in _SITE_LOCAL:
        return "site-local"
    if not address.is_global:
        return "non-global"
    return None


def _allowed(address: Address, allow: Iterable[Network]) -> bool:
    return any(address.version == net.version and address in net for net in allow)


def refusal(address: Address, allow: Iterable[Network] = ()) -> str | None:
    """Why a webhook may not connect to ``address`` (``"loopback"``, ``"private"``...,
    ``"loopback (as 127.0.0.1)"`` for an IPv6 address carrying it); ``None``: it may (a
    public address, or one of a network in ``allow``)."""
    allow = tuple(allow)
    if _allowed(address, allow):
        return None
    if isinstance(address, IPv6Address):
        inner = embedded_ipv4(address)
        if inner is not None:
            why = None if _allowed(inner, allow) else _kind(inner)
            if why is not None:
                return f"{why} (as {inner})"
            if address.ipv4_mapped is not None:
                return None  # the IPv4 address itself is what the connection reaches
    return _kind(address)


def host_address(host: str) -> Address | None:
    """The address ``host`` (a URL's host, IPv6 in brackets or not) denotes by itself,
    without a lookup, in every form the resolver reads as one; ``None``: a name."""
    text = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        return ip_address(text)
    except ValueError:
        pass
    if _NUMERIC_RE.match(text):
        try:  # the forms getaddrinfo reads too: 127.1, 0x7f.1, 2130706433, 017700000001
            return IPv4Address(socket.inet_aton(text))
        except OSError:
            return None
    return None


def host_refusal(host: str, allow: Iterable[Network] = ()) -> str | None:
    """Why ``host`` is refused from what it says by itself (an address, a ``localhost``
    name); ``None``: nothing refuses it yet (a name is checked again once resolved)."""
    address = host_address(host)
    if address is not None:
        why = refusal(address, allow)
        return None if why is None else f"{address}, a {why} address"
    name = host.lower().rstrip(".")
    if name == "localhost" or name.endswith(".localhost"):
        loopback = (IPv4Address("127.0.0.1"), IPv6Address("::1"))
        if not all(_allowed(a, allow) for a in loopback):
            return f"{name}, a loopback name"
    return None
