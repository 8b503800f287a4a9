"""A mistyped task name is reported, never an empty answer with exit 0: ``tasks --name``,
``purge --name`` and the ``dlq`` filters (``--task``) exit 2 naming the close matches when
the app does not register the name and jobbers has no record of it; a registered name with
nothing recorded, or a recorded name the app no longer registers, is an ordinary (empty or
not) answer. The app's Jobbers on the session's private Redis; no worker needed."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner, Result

from jobbers_celery.cli import jobbers
from jobbers_celery.core.names import NAME_MAX, close_names, unknown_task_message


def _cli(proj: Any, *args: str) -> Result:
    return CliRunner().invoke(jobbers, list(args), obj=SimpleNamespace(app=proj.app))


@pytest.mark.parametrize("args", [
    ("tasks", "--name", "proj.bom"),
    ("tasks", "--name", "proj.bom", "--state", "failed", "--json"),
    ("purge", "--name", "proj.bom", "--yes"),
    ("dlq", "list", "--task", "proj.bom"),
    ("dlq", "resubmit", "--task", "proj.bom", "--dry-run"),
    ("dlq", "discard", "--task", "proj.bom", "--yes"),
])
def test_a_mistyped_name_exits_2_with_the_close_matches(proj: Any, args: tuple[str, ...]
                                                        ) -> None:
    result = _cli(proj, *args)
    assert result.exit_code == 2, result.output
    said = " ".join(result.output.split())
    option = "--task" if args[0] == "dlq" else "--name"
    assert f"{option}: no task named proj.bom: this app does not register it and jobbers " \
        "has no record of it; did you mean proj.boom" in said
    print(f"\n$ celery jobbers {' '.join(args)}   (exit 2)\n{result.output}")


def test_known_names_answer_as_before(proj: Any) -> None:
    registered = _cli(proj, "tasks", "--name", "proj.boom")  # nothing recorded yet
    assert registered.exit_code == 0, registered.output
    assert registered.output.strip() == "(none)"
    assert _cli(proj, "dlq", "list", "--task", "proj.boom").exit_code == 0
    # a name the app no longer registers, still recorded: found, not refused
    proj.app.send_task("legacy.renamed_task", queue="nowhere")
    recorded = _cli(proj, "tasks", "--name", "legacy.renamed_task", "--json")
    assert recorded.exit_code == 0, recorded.output
    assert '"name": "legacy.renamed_task"' in recorded.output


def test_close_names_are_bounded_and_plain() -> None:
    known = ["shop.import_catalog", "shop.export_catalog", "billing.charge"]
    assert close_names("shop.improt_catalog", known)[0] == "shop.import_catalog"
    assert close_names("x" * 100_000, known) == []
    message = unknown_task_message("evil\x1b[2J" + "y" * 10_000, known, "--task")
    assert "\x1b" not in message
    assert len(message) < NAME_MAX * 5
    assert message.endswith("inspect registered")
