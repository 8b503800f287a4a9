"""The store's client for a Sentinel URL (no network: redis-py connects lazily)."""

from __future__ import annotations

import pytest
from redis.sentinel import SentinelConnectionPool

from jobbers_celery import JobbersConfig
from jobbers_celery.store.connect import (
    MasterCheckedConnection,
    parse_sentinel_url,
    redis_client,
)


def test_the_kombu_url_form_is_parsed_as_kombu_does():
    sentinels, master = parse_sentinel_url(
        "sentinel://user:p%40ss@s1:26380/3;sentinel://s2;sentinel://s3:1")
    assert sentinels == [("s1", 26380), ("s2", 26379), ("s3", 1)]
    # the first part's credentials and database are the master's
    assert master == {"username": "user", "password": "p@ss", "db": 3}


def test_a_part_that_is_not_a_sentinel_is_refused():
    with pytest.raises(ValueError, match="sentinel://"):
        parse_sentinel_url("sentinel://s1;redis://s2")


def test_a_sentinel_url_gives_a_master_client_that_checks_the_master():
    config = JobbersConfig(
        redis_url="sentinel://s1:26379;sentinel://s2:26379",
        redis_transport_options={"master_name": "mymaster", "socket_timeout": 2,
                                 "sentinel_kwargs": {"password": "sentinel-secret"}},
    )
    client = redis_client(config)
    pool = client.connection_pool
    assert isinstance(pool, SentinelConnectionPool)
    assert pool.service_name == "mymaster"
    assert pool.connection_class is MasterCheckedConnection
    assert pool.connection_kwargs["decode_responses"] is True
    assert pool.connection_kwargs["socket_timeout"] == 2
    sentinel = pool.sentinel_manager
    assert [(c.connection_pool.connection_kwargs["host"],
             c.connection_pool.connection_kwargs["port"]) for c in sentinel.sentinels] == [
        ("s1", 26379), ("s2", 26379)]
    assert sentinel.sentinels[0].connection_pool.connection_kwargs["password"] == (
        "sentinel-secret")


def test_a_sentinel_store_keeps_its_tls_options():
    from jobbers_celery.store.connect import MasterCheckedSSLConnection, redis_client

    config = JobbersConfig.from_mapping(
        {"jobbers_redis_url": "sentinel://h1:26379;sentinel://h2:26379",
         "jobbers_redis_transport_options": {"master_name": "m"},
         "jobbers_redis_use_ssl": {"ssl_cert_reqs": "required", "ssl_ca_certs": "/ca.pem"}},
        "amqp://guest@localhost//")
    pool = redis_client(config).connection_pool
    assert pool.connection_class is MasterCheckedSSLConnection
    assert pool.connection_kwargs["ssl_ca_certs"] == "/ca.pem"


def test_a_recheck_makes_each_sentinel_connection_ask_before_its_next_command(monkeypatch):
    """``recheck_master``: a connection checked a moment ago asks the sentinels again before
    its next command (and reconnects when the master moved), instead of waiting out
    ``MASTER_CHECK_S``; without any Sentinel connection it says there is nothing to ask."""
    import time

    from redis.connection import Connection

    from jobbers_celery.store import connect

    monkeypatch.setattr(connect, "_sentinel_in_use", False)
    assert connect.recheck_master() is False
    asked: list[str] = []
    sent: list[object] = []

    class Pool:
        master = ("m1", 6379)

        def get_master_address(self) -> tuple[str, int]:
            asked.append("sentinels")
            return self.master

    conn = MasterCheckedConnection.__new__(MasterCheckedConnection)
    conn.connection_pool, conn.host, conn.port = Pool(), "m1", 6379
    conn._sock = object()
    conn._checked_at, conn._generation = time.monotonic(), connect._recheck_generation
    moved: list[str] = []
    monkeypatch.setattr(Connection, "send_packed_command",
                        lambda self, command, check_health=True: sent.append(command))
    monkeypatch.setattr(MasterCheckedConnection, "disconnect", lambda self: moved.append("off"))
    monkeypatch.setattr(MasterCheckedConnection, "connect", lambda self: moved.append("on"))
    conn.send_packed_command(b"PING")
    assert asked == []  # checked a moment ago
    monkeypatch.setattr(connect, "_sentinel_in_use", True)
    assert connect.recheck_master() is True
    conn.send_packed_command(b"PING")
    assert asked == ["sentinels"]  # asked
    assert moved == []  # the master had not moved
    conn.send_packed_command(b"PING")
    assert asked == ["sentinels"]  # once per recheck
    Pool.master = ("m2", 6379)
    connect.recheck_master()
    conn.send_packed_command(b"PING")
    assert moved == ["off", "on"]  # moved: reconnected before sending
    assert sent == [b"PING"] * 4
