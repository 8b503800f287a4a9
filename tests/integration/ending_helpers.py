"""The test side of ``tests.integration.ending_proj``: the app a test publishes and reads
with, and the environment of the worker it starts."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from celery import Celery

from jobbers_celery import get_jobbers
from tests.conftest import Worker, start_worker
from tests.integration import ending_proj


class Setup:
    """The test process's app (for publishing and reading) and a worker's environment."""

    def __init__(self, broker: str, backend: str, marks: Path) -> None:
        self.name = f"e{uuid.uuid4().hex[:8]}"
        self.broker, self.backend, self.marks = broker, backend, marks
        self.app: Celery = ending_proj.build(broker, backend=backend, name=self.name)
        self.jobbers = get_jobbers(self.app)

    def env(self, **extra: str) -> dict[str, str]:
        return {"ENDING_PROJ_BROKER": self.broker, "ENDING_PROJ_BACKEND": self.backend,
                "ENDING_PROJ_NAME": self.name, "ENDING_PROJ_MARKS": str(self.marks), **extra}

    def worker(self, log_dir: Path, **extra: str) -> Worker:
        return start_worker(self.app, "tests.integration.ending_proj", log_dir,
                            concurrency=1, env=self.env(**extra))

    def task(self, name: str) -> Any:
        return self.app.tasks[f"{self.name}.{name}"]

    def runs(self, task_id: str) -> int:
        return len(list(self.marks.glob(f"{task_id}.*.run")))

    def killed_at(self, task_id: str) -> float | None:
        path = self.marks / f"{task_id}.killed"
        return float(path.read_text()) if path.exists() else None


@contextmanager
def setups(redis_url: str, tmp_path: Path,
           other_server: Callable[[], str]) -> Iterator[Callable[[str], Setup]]:
    """Make a :class:`Setup` per result layout: ``same redis`` (another db of the store's
    server: folded), ``other redis`` (``other_server()``), ``filesystem``."""
    made: list[Setup] = []

    def make(layout: str) -> Setup:
        if layout == "same redis":
            backend = redis_url.rsplit("/", 1)[0] + "/2"  # another db: folded, with a SELECT
        elif layout == "other redis":
            backend = other_server()
        else:
            folder = tmp_path / "results"
            folder.mkdir(exist_ok=True)
            backend = f"file://{folder}"
        marks = tmp_path / f"marks-{len(made)}"
        marks.mkdir()
        setup = Setup(redis_url, backend, marks)
        made.append(setup)
        return setup

    try:
        yield make
    finally:
        for setup in made:
            setup.app.close()
