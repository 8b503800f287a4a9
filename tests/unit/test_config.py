from __future__ import annotations

import pytest

from jobbers_celery import ConfigurationError, JobbersConfig


def test_defaults_and_redis_url_from_a_redis_broker():
    config = JobbersConfig.from_mapping({}, "redis://h:6379/2")
    assert config.redis_url == "redis://h:6379/2"
    assert config.key_prefix == "jobbers"
    assert config.cleaner_interval == 10
    assert config.retention == 7 * 24 * 3600
    assert config.dead_letter_sink == "jobbers_celery.sinks.RedisDeadLetterSink"


def test_settings_override_defaults():
    config = JobbersConfig.from_mapping(
        {"jobbers_redis_url": "redis://x/3", "jobbers_key_prefix": "app1",
         "jobbers_retention": 60, "jobbers_worker_lost_after": 30},
        "amqp://guest@localhost//")
    assert (config.redis_url, config.key_prefix, config.retention,
            config.worker_lost_after) == ("redis://x/3", "app1", 60, 30)


def test_a_non_redis_broker_needs_an_explicit_url():
    with pytest.raises(ConfigurationError, match="jobbers_redis_url"):
        JobbersConfig.from_mapping({}, "amqp://guest@localhost//")


@pytest.mark.parametrize(("key", "value", "message"), [
    ("jobbers_key_prefix", "a{b}", "key_prefix"),
    ("jobbers_retention", 0, "jobbers_retention must be a number > 0"),
    ("jobbers_cleaner_interval", "10", "jobbers_cleaner_interval"),
    ("jobbers_dead_letter_sink", "nodots", "dotted path"),
    ("jobbers_redis_url", "localhost", "not a URL"),
])
def test_bad_settings_are_refused_clearly(key, value, message):
    with pytest.raises(ConfigurationError, match=message):
        JobbersConfig.from_mapping({key: value}, "redis://localhost/0")


def test_the_brokers_connection_options_go_with_its_url():
    conf = {"broker_transport_options": {"master_name": "m"},
            "broker_use_ssl": {"ssl_cert_reqs": "required"}}
    config = JobbersConfig.from_mapping(conf, "rediss://h:6380/0")
    assert config.redis_transport_options == {"master_name": "m"}
    assert config.redis_use_ssl == {"ssl_cert_reqs": "required"}
    # an explicit jobbers_redis_url is another server: the broker's options do not apply
    own = JobbersConfig.from_mapping({**conf, "jobbers_redis_url": "redis://x/1"},
                                     "redis://h:6379/0")
    assert (own.redis_transport_options, own.redis_use_ssl) == ({}, None)


@pytest.mark.parametrize(("key", "value", "message"), [
    ("jobbers_redis_transport_options", ["master_name"], "must be a dict"),
    ("jobbers_redis_use_ssl", "yes", "must be a dict or a bool"),
])
def test_bad_connection_options_are_refused_clearly(key, value, message):
    with pytest.raises(ConfigurationError, match=message):
        JobbersConfig.from_mapping({key: value}, "redis://localhost/0")


SENTINELS = "sentinel://:pw@s1:26379/2;sentinel://s2:26380;sentinel://s3"


def test_a_sentinel_broker_url_and_its_master_name_are_the_stores():
    conf = {"broker_transport_options": {"master_name": "mymaster"}}
    config = JobbersConfig.from_mapping(conf, SENTINELS)
    assert config.redis_url == SENTINELS
    assert config.redis_transport_options == {"master_name": "mymaster"}


@pytest.mark.parametrize("conf", [
    {},  # the broker's Sentinel URL without a master name
    {"broker_transport_options": {"visibility_timeout": 10}},
])
def test_a_sentinel_url_without_a_master_name_is_refused_clearly(conf):
    with pytest.raises(ConfigurationError, match="master_name"):
        JobbersConfig.from_mapping(conf, SENTINELS)
    with pytest.raises(ConfigurationError, match="master_name"):
        JobbersConfig.from_mapping({"jobbers_redis_url": SENTINELS}, "amqp://h//")
