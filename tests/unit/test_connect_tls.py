"""TLS and ACL options of the state store's client (no network: clients connect lazily)."""

from __future__ import annotations

import ssl
from typing import Any

import pytest
import redis

from jobbers_celery import ConfigurationError, JobbersConfig
from jobbers_celery.store.connect import redis_client


def _pool(conf: dict[str, Any], broker: str | None = None) -> Any:
    return redis_client(JobbersConfig.from_mapping(conf, broker)).connection_pool


def test_a_rediss_url_with_query_parameters_verifies_with_its_ca_as_an_acl_user():
    pool = _pool({}, "rediss://jobbers:s%40cret@db.example:6380/0"
                     "?ssl_cert_reqs=CERT_REQUIRED&ssl_ca_certs=/etc/ca%20dir/ca.pem")
    kw = pool.connection_kwargs
    assert pool.connection_class is redis.SSLConnection
    assert (kw["username"], kw["password"], kw["host"], kw["port"], kw["db"]) == (
        "jobbers", "s@cret", "db.example", 6380, 0)
    assert kw["ssl_ca_certs"] == "/etc/ca dir/ca.pem"
    # the fast path's own connections (store/fastcall.py) are made from the same pool
    conn = pool.make_connection()
    assert isinstance(conn, redis.SSLConnection)
    assert conn.cert_reqs == ssl.CERT_REQUIRED
    assert conn.ca_certs == "/etc/ca dir/ca.pem"
    assert (conn.username, conn.password) == ("jobbers", "s@cret")


@pytest.mark.parametrize("reqs", [ssl.CERT_REQUIRED, "required", "CERT_REQUIRED"])
def test_broker_use_ssl_goes_with_the_brokers_url(reqs):
    pool = _pool({"broker_use_ssl": {"ssl_cert_reqs": reqs, "ssl_ca_certs": "/ca.pem",
                                     "ssl_certfile": "/c.pem", "ssl_keyfile": "/k.pem"}},
                 "redis://h:6379/0")
    conn = pool.make_connection()
    assert isinstance(conn, redis.SSLConnection)  # TLS on a redis:// URL, as for the broker
    assert (conn.cert_reqs, conn.ca_certs, conn.certfile, conn.keyfile) == (
        ssl.CERT_REQUIRED, "/ca.pem", "/c.pem", "/k.pem")


def test_jobbers_own_url_takes_jobbers_redis_use_ssl_not_the_brokers():
    conf = {"jobbers_redis_url": "redis://store:6379/0",
            "jobbers_redis_use_ssl": {"ssl_cert_reqs": "optional"},
            "broker_use_ssl": {"ssl_cert_reqs": "none"}}
    conn = _pool(conf, "rediss://broker:6379/0").make_connection()
    assert isinstance(conn, redis.SSLConnection)
    assert conn.cert_reqs == ssl.CERT_OPTIONAL
    plain = _pool({"jobbers_redis_url": "redis://store:6379/0",
                   "broker_use_ssl": {"ssl_cert_reqs": "none"}}, "redis://b:6379/0")
    assert plain.connection_class is redis.Connection


def test_true_means_tls_verified_against_the_system_cas():
    conn = _pool({"jobbers_redis_url": "redis://h/0", "jobbers_redis_use_ssl": True}
                 ).make_connection()
    assert isinstance(conn, redis.SSLConnection)
    assert conn.cert_reqs == ssl.CERT_REQUIRED


@pytest.mark.parametrize("where", ["setting", "url"])
def test_an_unknown_ssl_cert_reqs_is_a_configuration_error(where):
    if where == "setting":
        conf = {"jobbers_redis_url": "redis://h/0",
                "jobbers_redis_use_ssl": {"ssl_cert_reqs": "sometimes"}}
    else:
        conf = {"jobbers_redis_url": "rediss://h/0?ssl_cert_reqs=sometimes"}
    with pytest.raises(ConfigurationError, match="ssl_cert_reqs must be"):
        _pool(conf)
