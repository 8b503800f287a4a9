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
