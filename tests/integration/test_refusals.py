"""Messages a worker refuses before running them end ``dropped`` (Redis broker; the same
case runs on RabbitMQ in test_on_rabbitmq.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.integration import refusal_cases

pytestmark = [pytest.mark.redis, pytest.mark.worker]


def test_refused_messages_end_dropped_without_reading_the_body(proj: Any, worker_factory: Any,
                                                               tmp_path: Path) -> None:
    refusal_cases.refused_messages_end_dropped(proj, worker_factory, tmp_path)
