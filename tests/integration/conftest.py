"""Integration-test hooks: a failed test that ran workers shows their logs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.failed and call.when == "call":
        tmp = getattr(item, "funcargs", {}).get("tmp_path")
        if isinstance(tmp, Path):
            for log in sorted(tmp.glob("w-*.log")):
                text = log.read_text(errors="replace")
                report.sections.append((f"worker log {log.name}", text[-20000:]))
    return report
