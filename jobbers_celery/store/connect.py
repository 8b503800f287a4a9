"""The state store's Redis client, built from jobbers' settings.

Why one place: the URL forms (``redis://``, ``rediss://``, ``unix://``; Sentinel) and the
connection options (TLS, transport options) are read the way kombu reads the broker's, so a
user who already wrote them for Celery writes nothing new.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote, urlsplit

import redis
from redis.connection import SSLConnection
from redis.sentinel import Sentinel, SentinelManagedConnection

from jobbers_celery.config import JobbersConfig

__all__ = ["redis_client"]

#: Options every store connection gets: replies as ``str``; an idle connection is PINGed
#: before use, so a server restart is noticed before a step is sent.
_BASE_OPTIONS: dict[str, Any] = {"decode_responses": True, "health_check_interval": 30}


def redis_client(config: JobbersConfig) -> redis.Redis:
    """A client for ``config.redis_url`` with the configured connection options."""
    options = {**_BASE_OPTIONS, **_ssl_options(config.redis_use_ssl)}
    if config.redis_url.startswith("sentinel://"):
        return _sentinel_client(config.redis_url, config.redis_transport_options, options)
    return redis.Redis.from_url(config.redis_url, **options)


def _ssl_options(use_ssl: Mapping[str, Any] | bool | None) -> dict[str, Any]:
    """redis-py keyword arguments for Celery's ``broker_use_ssl`` form (TLS)."""
    return {}


# ---------------------------------------------------------------------------- Sentinel
#: Sentinel's default port, as kombu's ``sentinel://`` transport assumes.
SENTINEL_PORT = 26379
#: Seconds between two checks, per connection, that it still talks to the master the
#: sentinels name (one round trip to a sentinel, only before a command is sent).
MASTER_CHECK_S = 0.5
#: Transport options passed on to the master's connections, as kombu's Redis channel does.
_CONNECTION_OPTIONS = ("socket_timeout", "socket_connect_timeout", "socket_keepalive",
                       "socket_keepalive_options", "retry_on_timeout", "client_name",
                       "health_check_interval")


def parse_sentinel_url(url: str) -> tuple[list[tuple[str, int]], dict[str, Any]]:
    """The sentinels of a kombu-style URL and the master's connection keywords.

    ``sentinel://[user:pass@]host[:port][/db];sentinel://host2[:port];...``: every part
    names one sentinel (port 26379 by default); as in kombu, the credentials and the
    database of the first part are the *master's* (the sentinels' own password goes in
    ``sentinel_kwargs``).
    """
    sentinels: list[tuple[str, int]] = []
    master: dict[str, Any] = {}
    for n, part in enumerate(p for p in url.split(";") if p.strip()):
        parts = urlsplit(part.strip())
        if parts.scheme != "sentinel" or not parts.hostname:
            raise ValueError(f"not a sentinel://host:port URL: {parts.scheme}://{parts.hostname}")
        sentinels.append((parts.hostname, parts.port or SENTINEL_PORT))
        if n == 0:
            if parts.username:
                master["username"] = unquote(parts.username)
            if parts.password:
                master["password"] = unquote(parts.password)
            db = parts.path.strip("/")
            master["db"] = int(db) if db else 0
    return sentinels, master


def _sentinel_client(url: str, transport: Mapping[str, Any],
                     options: Mapping[str, Any]) -> redis.Redis:
    """A client whose connections ask the sentinels for the current master.

    redis-py's ``SentinelConnectionPool`` looks the master up on every new connection, closes
    idle connections when the master's address changed, and turns a ``READONLY`` reply (the
    old master was demoted) into a ``ConnectionError`` after dropping the connection, so
    the store follows a failover with no code of its own. Options as kombu reads them:
    ``master_name`` (required), ``sentinel_kwargs``, ``min_other_sentinels``.
    """
    sentinels, master = parse_sentinel_url(url)
    kwargs: dict[str, Any] = {**options, **master}
    kwargs.update({k: transport[k] for k in _CONNECTION_OPTIONS if transport.get(k) is not None})
    kwargs["connection_class"] = (MasterCheckedSSLConnection if kwargs.pop("ssl", False)
                                  else MasterCheckedConnection)
    # (without sentinel_kwargs the sentinels get the socket_* options, as in redis-py)
    extra = transport.get("sentinel_kwargs")
    sentinel = Sentinel(  # type: ignore[no-untyped-call]
        sentinels,
        min_other_sentinels=int(transport.get("min_other_sentinels") or 0),
        sentinel_kwargs=dict(extra) if extra is not None else None,
        **kwargs,
    )
    client: redis.Redis = sentinel.master_for(  # type: ignore[no-untyped-call]
        str(transport["master_name"]))
    return client


class MasterCheckedConnection(SentinelManagedConnection):
    """A Sentinel-managed connection that notices a failover before it sends a command.

    Why: redis-py asks the sentinels for the master only when it opens a connection. A
    master demoted by ``SENTINEL FAILOVER``, or cut off by a partition, still accepts
    writes until Sentinel reconfigures it as a replica (about ten seconds later); a client
    still connected to it writes what the new master never sees. So at most every
    ``MASTER_CHECK_S``, before sending (when nothing has been sent and moving is safe), the
    connection asks the sentinels and reconnects if the master moved. Opening a connection
    also goes through the lookup, whatever path sends first (the store's lean script path
    sends on connections it made itself).
    """

    _checked_at = 0.0

    def connect_to(self, address: Any) -> None:
        self._checked_at = time.monotonic()
        super().connect_to(address)  # type: ignore[no-untyped-call]

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        if getattr(self, "_sock", None) is None:
            self.connect()  # type: ignore[no-untyped-call]
        elif time.monotonic() - self._checked_at >= MASTER_CHECK_S:
            self._checked_at = time.monotonic()
            if (self.host, self.port) != tuple(self.connection_pool.get_master_address()):
                self.disconnect()  # type: ignore[no-untyped-call]
                self.connect()  # type: ignore[no-untyped-call]
        super().send_packed_command(command, check_health)  # type: ignore[no-untyped-call]


class MasterCheckedSSLConnection(MasterCheckedConnection, SSLConnection):
    """The same over TLS."""
