"""The state store's Redis client, built from jobbers' settings.

Why one place: the URL forms (``redis://``, ``rediss://``, ``unix://``; Sentinel) and the
connection options (TLS, transport options) are read the way kombu reads the broker's, so a
user who already wrote them for Celery writes nothing new. A ``redis://``/``rediss://`` URL
that names a Redis Cluster node (``INFO cluster`` says ``cluster_enabled:1``) gets redis-py's
cluster client, which follows the slot map and ``MOVED``/``ASK`` replies.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

import redis
from redis.cluster import RedisCluster
from redis.connection import SSLConnection, UnixDomainSocketConnection
from redis.sentinel import Sentinel, SentinelManagedConnection

from jobbers_celery.core.config import JobbersConfig
from jobbers_celery.core.errors import ConfigurationError
from jobbers_celery.core.printable import escaped_logger

__all__ = ["Client", "client_endpoint", "endpoint", "is_cluster", "recheck_master", "redis_client"]

#: The store's client type (redis-py's), named here so that code above the store never
#: imports redis.
Client = redis.Redis

log = escaped_logger("jobbers.store")

#: Options every store connection gets: replies as ``str``; an idle connection is PINGed
#: before use, so a server restart is noticed before a step is sent.
_BASE_OPTIONS: dict[str, Any] = {"decode_responses": True, "health_check_interval": 30}


def redis_client(config: JobbersConfig) -> redis.Redis:
    """A client for ``config.redis_url`` with the configured connection options."""
    options = {**_BASE_OPTIONS, **_ssl_options(config.redis_use_ssl)}
    if config.redis_url.startswith("sentinel://"):
        return _sentinel_client(config.redis_url, config.redis_transport_options, options)
    url = _tls_url(config.redis_url)
    client = redis.Redis.from_url(url, **options)
    if not url.startswith("unix:") and _cluster_enabled(client):
        client.close()
        return _cluster_client(url, options)
    return client


def is_cluster(client: redis.Redis) -> bool:
    """``client`` is redis-py's cluster client (its connections are per node)."""
    return isinstance(client, RedisCluster)


#: Where a connection goes, as :func:`endpoint` tells it: the server and user, and the db.
Endpoint = tuple[tuple[Any, ...], int]


def endpoint(kwargs: Mapping[str, Any], cls: Any) -> Endpoint:
    """What identifies the server and user a connection with redis-py's ``kwargs`` and
    connection class ``cls`` talks to (whose keys it may write), and its db."""
    kind = ("unix" if isinstance(cls, type) and issubclass(cls, UnixDomainSocketConnection)
            else "ssl" if isinstance(cls, type) and issubclass(cls, SSLConnection) else "tcp")
    if kind == "unix":
        where: tuple[Any, ...] = (kwargs.get("path"),)
    else:
        where = (kwargs.get("host") or "localhost", int(kwargs.get("port") or 6379))
    return (kind, *where, kwargs.get("username") or None), int(kwargs.get("db") or 0)


def client_endpoint(client: redis.Redis) -> Endpoint | None:
    """:func:`endpoint` of ``client``'s pool; ``None`` for a cluster client (no one node)."""
    if is_cluster(client):
        return None
    pool = client.connection_pool
    return endpoint(pool.connection_kwargs, pool.connection_class)


#: Seconds the cluster probe waits for the server named by the URL (a process that imports
#: its Celery app must not hang on an unreachable store).
PROBE_TIMEOUT_S = 3.0


def _cluster_enabled(client: redis.Redis) -> bool:
    """``INFO cluster`` of the URL's server says it is a Redis Cluster node.

    Unreachable (or ``INFO`` refused by an ACL): a plain client, with a warning, since a
    cluster node would then refuse the steps with ``MOVED``.
    """
    kwargs = client.connection_pool.connection_kwargs
    probe = redis.Redis(connection_pool=type(client.connection_pool)(
        connection_class=client.connection_pool.connection_class,
        **{**kwargs, "socket_connect_timeout": PROBE_TIMEOUT_S,
           "socket_timeout": PROBE_TIMEOUT_S}))
    try:
        return str(probe.info("cluster").get("cluster_enabled", 0)) == "1"
    except redis.RedisError as exc:
        log.warning("could not ask the jobbers store whether it is a Redis Cluster node (%s): "
                    "using a plain Redis client", exc)
        return False
    finally:
        probe.close()


def _cluster_client(url: str, options: Mapping[str, Any]) -> redis.Redis:
    """redis-py's cluster client for the cluster ``url``'s node belongs to.

    Its command interface is the plain client's (the store's calls route by key slot); the
    store's lean script path asks it for the node of a key (``store/fastcall.py``).
    """
    kwargs = dict(options)
    if kwargs.pop("connection_class", None) is redis.SSLConnection:
        kwargs["ssl"] = True  # jobbers_redis_use_ssl on a redis:// URL
    cluster = RedisCluster.from_url(url, **kwargs)
    # one command interface: the store uses no command the cluster client lacks
    return cluster  # type: ignore[return-value]


#: ``ssl_cert_reqs`` spellings Celery and kombu accept, as redis-py's ``SSLConnection`` wants them.
_CERT_REQS: dict[str, ssl.VerifyMode] = {
    "required": ssl.CERT_REQUIRED, "CERT_REQUIRED": ssl.CERT_REQUIRED,
    "optional": ssl.CERT_OPTIONAL, "CERT_OPTIONAL": ssl.CERT_OPTIONAL,
    "none": ssl.CERT_NONE, "CERT_NONE": ssl.CERT_NONE,
}


def _cert_reqs(value: Any) -> ssl.VerifyMode:
    """``ssl_cert_reqs`` as an ``ssl.VerifyMode``; an unknown value is a configuration error
    (as Celery's result backend refuses it), never a silent downgrade."""
    if isinstance(value, ssl.VerifyMode):
        return value
    if isinstance(value, str) and value in _CERT_REQS:
        return _CERT_REQS[value]
    raise ConfigurationError(
        f"ssl_cert_reqs must be required, optional or none (or ssl.CERT_*), got {value!r}"
    )


def _ssl_options(use_ssl: Mapping[str, Any] | bool | None) -> dict[str, Any]:
    """redis-py keyword arguments for Celery's ``broker_use_ssl`` form (TLS).

    The mapping's keys (``ssl_cert_reqs``, ``ssl_ca_certs``, ``ssl_certfile``,
    ``ssl_keyfile``, and any other ``ssl_*`` argument of ``redis.SSLConnection``) are passed as
    they are, the way kombu's Redis transport and Celery's Redis backend pass theirs, with
    ``ssl_cert_reqs`` read in Celery's spellings. ``True`` means TLS with redis-py's defaults:
    the server's certificate is verified against the system's CAs. The connection class is
    set, so TLS also applies to a ``redis://`` URL, as ``broker_use_ssl`` does for the broker.
    Query parameters of a ``rediss://`` URL win over these (redis-py's rule).
    """
    if not use_ssl:
        return {}
    options: dict[str, Any] = {"connection_class": redis.SSLConnection}
    if isinstance(use_ssl, Mapping):
        options.update(use_ssl)
        if "ssl_cert_reqs" in options and options["ssl_cert_reqs"] is not None:
            options["ssl_cert_reqs"] = _cert_reqs(options["ssl_cert_reqs"])
    return options


def _tls_url(url: str) -> str:
    """``url`` with ``ssl_cert_reqs=CERT_REQUIRED`` (kombu's and Celery's spelling in a
    ``rediss://`` URL) rewritten to ``required``, the spelling redis-py's ``from_url`` takes;
    ``ssl_ca_certs`` and the others already pass through as they are."""
    parts = urlsplit(url)
    if "ssl_cert_reqs" not in parts.query:
        return url
    query = []
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if name == "ssl_cert_reqs":
            value = {ssl.CERT_REQUIRED: "required", ssl.CERT_OPTIONAL: "optional",
                     ssl.CERT_NONE: "none"}[_cert_reqs(value)]
        query.append((name, value))
    return urlunsplit(parts._replace(query=urlencode(query)))


# ---------------------------------------------------------------------------- Sentinel
#: Sentinel's default port, as kombu's ``sentinel://`` transport assumes.
SENTINEL_PORT = 26379
#: Seconds between two checks, per connection, that it still talks to the master the
#: sentinels name (one round trip to a sentinel, only before a command is sent).
MASTER_CHECK_S = 0.5
#: Bumped by :func:`recheck_master`: a master-checked connection whose generation differs
#: asks the sentinels before its next command, whenever it last did.
_recheck_generation = 0
#: Whether this process has opened a master-checked (Sentinel-managed) connection.
_sentinel_in_use = False


def recheck_master() -> bool:
    """Have every Sentinel-managed connection of this process ask the sentinels for the
    master before its next command. For a caller about to act on a refusal that a master
    just demoted may have given (it takes writes until the sentinels reconfigure it, and a
    connection checks at most every ``MASTER_CHECK_S``). Returns whether this process has
    such connections (``False``: nothing can have moved, asking again would not help)."""
    global _recheck_generation
    if not _sentinel_in_use:
        return False
    _recheck_generation += 1
    return True


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
    tls = kwargs.pop("connection_class", None) is redis.SSLConnection  # jobbers_redis_use_ssl
    kwargs["connection_class"] = MasterCheckedSSLConnection if tls else MasterCheckedConnection
    # (without sentinel_kwargs the sentinels get the socket_* options, as in redis-py)
    extra = transport.get("sentinel_kwargs")
    sentinel = Sentinel(  # type: ignore[no-untyped-call,unused-ignore]
        sentinels,
        min_other_sentinels=int(transport.get("min_other_sentinels") or 0),
        sentinel_kwargs=dict(extra) if extra is not None else None,
        **kwargs,
    )
    client: redis.Redis = sentinel.master_for(  # type: ignore[no-untyped-call,unused-ignore]
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
    _generation = 0

    def connect_to(self, address: Any) -> None:
        global _sentinel_in_use
        _sentinel_in_use = True
        self._checked_at = time.monotonic()
        self._generation = _recheck_generation
        super().connect_to(address)  # type: ignore[no-untyped-call,unused-ignore]

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        if getattr(self, "_sock", None) is None:
            self.connect()  # type: ignore[no-untyped-call,unused-ignore]
        elif self._generation != _recheck_generation \
                or time.monotonic() - self._checked_at >= MASTER_CHECK_S:
            self._checked_at = time.monotonic()
            self._generation = _recheck_generation
            if (self.host, self.port) != tuple(self.connection_pool.get_master_address()):
                self.disconnect()  # type: ignore[no-untyped-call,unused-ignore]
                self.connect()  # type: ignore[no-untyped-call,unused-ignore]
        super().send_packed_command(command, check_health)  # type: ignore[no-untyped-call,unused-ignore]


class MasterCheckedSSLConnection(MasterCheckedConnection, SSLConnection):
    """The same over TLS."""
