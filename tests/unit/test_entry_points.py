"""The dotted paths the docs give users keep working after the code moved into layer
folders: the sink setting's value, the meter provider hook and the key one-liner."""

from __future__ import annotations

import subprocess
import sys

from kombu.utils.imports import symbol_by_name

from jobbers_celery.core.config import DEFAULT_SINK
from jobbers_celery.deadletter import redis_sink
from jobbers_celery.telemetry import metrics


def test_the_documented_sink_setting_names_the_redis_sink() -> None:
    assert DEFAULT_SINK == "jobbers_celery.sinks.RedisDeadLetterSink"
    assert symbol_by_name(DEFAULT_SINK) is redis_sink.RedisDeadLetterSink


def test_the_documented_meter_provider_hook_is_the_instruments_own() -> None:
    from jobbers_celery.metrics import set_meter_provider

    assert set_meter_provider is metrics.set_meter_provider


def test_the_documented_key_one_liner_prints_a_key() -> None:
    out = subprocess.run(
        [sys.executable, "-c", "from jobbers_celery.codec import new_key; print(new_key())"],
        capture_output=True, text=True, check=True, timeout=60)
    key_id, _, secret = out.stdout.strip().partition(":")
    assert key_id
    assert len(secret) == 44  # base64 of 32 bytes
