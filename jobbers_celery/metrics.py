"""The documented entry point for metrics (``jobbers_celery.metrics.set_meter_provider``);
the instruments live in :mod:`jobbers_celery.telemetry.metrics`."""

from __future__ import annotations

from jobbers_celery.telemetry.metrics import set_meter_provider

__all__ = ["set_meter_provider"]
