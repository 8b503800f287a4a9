"""The cleaner's orchestration on the in-memory fakes, given the store's answers (which
tasks missed their heartbeats, which worker incarnations are lost and what they ran, what
the stall verdict recovered or ended): it asks the verdict for exactly those candidates,
republishes the recovered tasks, dead-letters the ended ones of tasks that keep dead
letters, tidies the stale cancellations, and records its pass (so it is not overdue)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from celery import Celery

from jobbers_celery import TaskState
from jobbers_celery.jobbers import Jobbers
from jobbers_celery.lifecycle.cleaner import Cleaner
from jobbers_celery.store.base import CleanerScan, StallVerdict
from jobbers_celery.testing import InMemoryDeadLetterSink, InMemoryStore, in_memory

S = TaskState


class Answers(InMemoryStore):
    """The store's answers a test gives: the scan, the dead workers' tasks, and the stall
    verdict (recovered or dead per id); every question asked is kept."""

    def __init__(self, hb: Sequence[str] = (), dead_workers: Mapping[str, list[str]] = {},
                 recover: Sequence[str] = (), end: Sequence[str] = (),
                 cancel: Sequence[str] = ()) -> None:
        super().__init__()
        self.hb, self.dead_workers = list(hb), dict(dead_workers)
        self.recover, self.end, self.cancel_ids = set(recover), set(end), list(cancel)
        self.judged: list[tuple[str, str, str, str]] = []
        self.forgotten: list[str] = []
        self.tidied: list[str] = []

    def cleaner_due(self, gaps: tuple[int, int], lost_ms: int, limit: int
                    ) -> list[CleanerScan]:
        return [CleanerScan(now_ms=self.now_ms(), hb=self.hb, dead=list(self.dead_workers),
                            cancel=self.cancel_ids)]

    def worker_tasks(self, dead: Mapping[int, Sequence[str]], limit: int
                     ) -> dict[int, dict[str, list[str]]]:
        return {0: {wid: self.dead_workers[wid] for wid in dead[0]}}

    def stall(self, items: Sequence[tuple[str, str, str, str]], lost_ms: int, lease_ms: int,
              forget: Sequence[str] = (), shard: int | None = None) -> StallVerdict:
        self.judged += items
        self.forgotten += forget
        recovered = [self._item(i) for i, *_ in items if i in self.recover]
        dead = [self._item(i) for i, *_ in items if i in self.end]
        return StallVerdict(recovered, dead, len(recovered) + len(dead),
                            len(items) - len(recovered) - len(dead))

    def tidy_cancelling(self, ids: Sequence[str]) -> None:
        self.tidied += ids

    def _item(self, task_id: str) -> dict[str, str]:
        raw = self.get_raw(task_id)
        return {**raw, "id": task_id, "now": str(self.now_ms()), "retries": "0",
                "reason": "missed its heartbeats"}


def _cleaner(store: Answers, sink: InMemoryDeadLetterSink) -> tuple[Cleaner, Jobbers]:
    jobbers = in_memory(Celery("fast_cleaner", broker="memory://"), store, sink)
    for task_id, dlq in (("a", "1"), ("b", "1"), ("c", "0")):
        store.submit(task_id, sources=(S.UNSUBMITTED,), reason="published", name="app.add",
                     create={"name": "app.add", "queue": "q", "dlq": dlq,
                             "msg": '{"args": [1], "kwargs": {}, "options": {}}'})
        store.start(task_id, name="app.add", worker="w@h", wid="w@h:1:a", heartbeat_ms=None,
                    cap=None, lease_cap_ms=60_000, defer_ms=1000, fields={})
    return jobbers.cleaner, jobbers


@pytest.fixture
def sink() -> InMemoryDeadLetterSink:
    return InMemoryDeadLetterSink()


def test_tasks_past_their_heartbeats_are_judged_and_recovered_or_dead_lettered(
        sink: InMemoryDeadLetterSink, monkeypatch: pytest.MonkeyPatch) -> None:
    store = Answers(hb=["a", "b"], recover=["a"], end=["b"])
    cleaner, _ = _cleaner(store, sink)
    published: list[tuple[str, str, int]] = []
    monkeypatch.setattr(cleaner.publisher, "republish",
                        lambda task_id, name, payload, retries, now_ms, *a, **k:
                        published.append((task_id, name, retries)))
    report = cleaner.run(by="test")
    assert [(i, kind, wid, name) for i, kind, wid, name in store.judged] == [
        ("a", "hb", "w@h:1:a", "app.add"), ("b", "hb", "w@h:1:a", "app.add")]
    assert published == [("a", "app.add", 0)]
    assert (report.examined, report.stalled, report.recovered, report.dead_lettered) == (
        2, 2, ["a"], ["b"])
    [entry] = sink.entries
    assert (entry.task_id, entry.reason) == ("b", "stalled")
    assert store.publishing() == {}  # what it published is confirmed


def test_a_lost_workers_tasks_are_judged_and_the_worker_forgotten_once_judged(
        sink: InMemoryDeadLetterSink) -> None:
    store = Answers(dead_workers={"w@h:9:z": ["c"]}, end=["c"], cancel=["x"])
    cleaner, _ = _cleaner(store, sink)
    report = cleaner.run(by="test")
    assert store.judged == [("c", "worker", "w@h:9:z", "app.add")]
    assert store.forgotten == ["w@h:9:z"]
    assert store.tidied == ["x"]
    assert report.dead_lettered == []  # "c" keeps no dead letters
    assert sink.entries == []


def test_a_lost_worker_without_tasks_is_still_forgotten(sink: InMemoryDeadLetterSink) -> None:
    store = Answers(dead_workers={"w@h:9:z": []})
    cleaner, _ = _cleaner(store, sink)
    report = cleaner.run(by="test")
    assert (store.judged, store.forgotten, report.examined) == ([], ["w@h:9:z"], 0)


def test_a_pass_is_recorded_so_the_cleaner_is_not_overdue(sink: InMemoryDeadLetterSink
                                                          ) -> None:
    store = Answers()
    cleaner, _ = _cleaner(store, sink)
    assert cleaner.status().overdue
    assert cleaner.catch_up(by="worker") is not None
    status = cleaner.status()
    assert (status.overdue, status.by) == (False, "worker")
    assert cleaner.catch_up(by="worker") is None


def test_orphans_of_a_live_worker_are_stalled_as_its_own(sink: InMemoryDeadLetterSink,
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    store = Answers(recover=["a"])
    cleaner, _ = _cleaner(store, sink)
    calls: list[Any] = []
    monkeypatch.setattr(cleaner.publisher, "republish", lambda *a, **k: calls.append(a[0]))
    report = cleaner.recover_orphans("w@h:1:a", ["a"])
    assert store.judged == [("a", "gone", "w@h:1:a", "app.add")]
    assert (calls, report.recovered) == (["a"], ["a"])
