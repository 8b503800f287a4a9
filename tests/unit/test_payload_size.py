"""Big payloads: the warning at publish (``jobbers_payload_warn_bytes``), and the error message
a record keeps (cut, so that an exception quoting a big argument is not another copy)."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest

from jobbers_celery import ConfigurationError, JobbersConfig
from jobbers_celery.lifecycle import publisher, recorder
from jobbers_celery.testing import InMemoryStore

NAME = "proj.import_catalog"


def _jobbers(**conf: Any) -> Any:
    config = JobbersConfig.from_mapping({f"jobbers_{k}": v for k, v in conf.items()},
                                        "redis://127.0.0.1:1/0")
    store = InMemoryStore()
    return SimpleNamespace(config=config, store=store, recorder=recorder.Recorder(
        store, SimpleNamespace(), payload_warn_bytes=config.payload_warn_bytes))


def _publish(jobbers: Any, args: list[Any], task_id: str = "t-1", **headers: Any) -> None:
    jobbers.recorder.publish(NAME, {"id": task_id, **headers}, (args, {}, {}), "",
                         "celery", {}, version=None, dead_letter=True)


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "jobbers.lifecycle" and r.levelno == logging.WARNING]


def test_the_default_threshold_is_256_kib():
    assert JobbersConfig.from_mapping({}, "redis://h/0").payload_warn_bytes == 256 * 1024


@pytest.mark.parametrize("value", [-1, 1.5, "1000", True])
def test_a_bad_threshold_is_refused_clearly(value):
    with pytest.raises(ConfigurationError, match="jobbers_payload_warn_bytes"):
        JobbersConfig.from_mapping({"jobbers_payload_warn_bytes": value}, "redis://h/0")


def test_a_payload_above_the_threshold_warns_once_naming_task_size_and_setting(caplog):
    jobbers = _jobbers(payload_warn_bytes=1000)
    with caplog.at_level(logging.WARNING, logger="jobbers.lifecycle"):
        _publish(jobbers, ["x" * 2000])
    [message] = _warnings(caplog)
    stored = jobbers.store.get_raw("t-1")["msg"]
    assert f"task {NAME}[t-1]" in message
    assert f"is {len(stored)} bytes as JSON" in message
    assert "above jobbers_payload_warn_bytes=1000" in message
    assert len(stored.encode()) == len(stored)  # the JSON is ASCII: characters are bytes


def test_a_payload_at_the_threshold_does_not_warn(caplog):
    jobbers = _jobbers(payload_warn_bytes=1000)
    probe = _jobbers(payload_warn_bytes=1000)
    _publish(probe, [""])
    overhead = len(probe.store.get_raw("t-1")["msg"])  # the JSON around the argument
    with caplog.at_level(logging.WARNING, logger="jobbers.lifecycle"):
        _publish(jobbers, ["x" * (1000 - overhead)])
    assert len(jobbers.store.get_raw("t-1")["msg"]) == 1000
    assert _warnings(caplog) == []


def test_retry_publishes_and_internal_publishes_do_not_warn_again(caplog):
    jobbers = _jobbers(payload_warn_bytes=1000)
    with caplog.at_level(logging.WARNING, logger="jobbers.lifecycle"):
        _publish(jobbers, ["x" * 2000], retries=1)  # an immediate retry's publish
        with publisher.internal_publish(5_000):  # a resubmit or the scheduler
            _publish(jobbers, ["x" * 2000])
    assert _warnings(caplog) == []
    assert jobbers.store.get_raw("t-1")["retries"] == "1"


def test_zero_never_warns(caplog):
    jobbers = _jobbers(payload_warn_bytes=0)
    with caplog.at_level(logging.WARNING, logger="jobbers.lifecycle"):
        _publish(jobbers, ["x" * 300_000])
    assert _warnings(caplog) == []


def test_the_record_keeps_a_cut_error_message():
    short = recorder.error_fields(ValueError("bad row"))
    assert recorder.pl.loads(short["err"]) == {"type": "ValueError", "message": "bad row"}
    text = "y" * 50_000
    err = recorder.pl.loads(recorder.error_fields(ValueError(text))["err"])
    limit = recorder.ERROR_MESSAGE_MAX_CHARS
    assert err["message"] == f"{'y' * limit}... [cut: 50000 characters in all]"
    assert recorder.pl.loads(recorder.error_fields(None, text)["err"])["message"] == \
        err["message"]
