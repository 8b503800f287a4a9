"""The state store's Redis client, built from jobbers' settings.

Why one place: the URL forms (``redis://``, ``rediss://``, ``unix://``; Sentinel) and the
connection options (TLS, transport options) are read the way kombu reads the broker's, so a
user who already wrote them for Celery writes nothing new.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis

from jobbers_celery.config import JobbersConfig
from jobbers_celery.errors import ConfigurationError

__all__ = ["redis_client"]

#: Options every store connection gets: replies as ``str``; an idle connection is PINGed
#: before use, so a server restart is noticed before a step is sent.
_BASE_OPTIONS: dict[str, Any] = {"decode_responses": True, "health_check_interval": 30}


def redis_client(config: JobbersConfig) -> redis.Redis:
    """A client for ``config.redis_url`` with the configured connection options."""
    options = {**_BASE_OPTIONS, **_ssl_options(config.redis_use_ssl)}
    return redis.Redis.from_url(_tls_url(config.redis_url), **options)


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
