"""docs/howto/alerts.md's settings, as users copy them: the block loads, every rule in it
is valid, and the kinds the page lists are the ones there are."""

from __future__ import annotations

import re
from pathlib import Path

from jobbers_celery import AlertKind, JobbersConfig, parse_rule

PAGE = Path(__file__).resolve().parents[2] / "docs" / "howto" / "alerts.md"


def _settings_block() -> str:
    text = PAGE.read_text()
    after = text.split("<!-- alerts-settings", 1)[1]
    found = re.search(r"```python\n(.*?)```", after, re.DOTALL)
    assert found is not None
    return found.group(1)


def test_the_docs_settings_load_as_written() -> None:
    namespace: dict[str, object] = {}
    exec(compile(_settings_block(), str(PAGE), "exec"), namespace)  # noqa: S102 - our docs
    settings = {k: v for k, v in namespace.items() if k.startswith("jobbers_")}
    config = JobbersConfig.from_mapping({"jobbers_redis_url": "redis://localhost", **settings})
    rules = [parse_rule(r) for r in config.alerts]
    assert [r.kind for r in rules] == [AlertKind.NEW_FAILURE_GROUP, AlertKind.DEAD_LETTER_RATE,
                                       AlertKind.STALL, AlertKind.CLEANER_OVERDUE,
                                       AlertKind.PERIODIC_MISSED]
    assert config.admin_url == "https://ops.example.com/admin/"


def test_the_events_table_names_every_kind() -> None:
    table = PAGE.read_text().split("## Events", 1)[1].split("\n\n", 2)[1]
    named = set(re.findall(r"`([a-z_]+)`", table))
    assert {k.value for k in AlertKind} - {"queue_paused"} <= named
