"""Where alerts come from in jobbers_celery: the cleaner (stalls, itself overdue) and the
root (each dead letter the sink took counts for the dead-letter-rate rules)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from celery import Celery

from jobbers_celery import DeadLetter
from jobbers_celery.alerts import AlertEvent, AlertKind
from jobbers_celery.store import StallVerdict
from jobbers_celery.testing import InMemoryDeadLetterSink, InMemoryStore, in_memory


class Heard:
    """An alert service that keeps what it is handed."""

    def __init__(self) -> None:
        self.events: list[AlertEvent] = []
        self.dead: list[tuple[str, str | None]] = []

    def emit(self, event: AlertEvent) -> None:
        self.events.append(event)

    def dead_lettered(self, task_name: str, group: str | None = None,
                      link: str | None = None) -> None:
        self.dead.append((task_name, group))


def app(**conf: Any) -> Celery:
    made = Celery("alert_sources", broker="memory://")
    made.conf.update(conf)
    return made


def test_a_stall_verdict_tells_one_alert_per_task_name() -> None:
    jobbers = in_memory(app(), InMemoryStore(), InMemoryDeadLetterSink())
    heard = Heard()
    jobbers.cleaner.alerts = heard  # type: ignore[assignment]
    item = {"id": "1", "name": "shop.import", "queue": "celery", "now": "0"}
    jobbers.cleaner._tell_stalls(StallVerdict(
        recovered=[item, {**item, "id": "2"}], dead=[{**item, "id": "3", "name": "mail.send"}],
        stalled=3, kept=0))
    assert [(e.kind, e.key, e.task_name, e.link) for e in heard.events] == [
        (AlertKind.STALL, "shop.import", "shop.import", "jobbers/deadletterentry/live/"),
        (AlertKind.STALL, "mail.send", "mail.send", "jobbers/deadletterentry/live/")]
    assert heard.events[0].text.endswith("2 resubmitted, 0 dead-lettered.")


def test_a_catch_up_pass_tells_the_cleaner_overdue_as_ongoing() -> None:
    jobbers = in_memory(app(), InMemoryStore(), InMemoryDeadLetterSink())
    heard = Heard()
    jobbers.cleaner.alerts = heard  # type: ignore[assignment]
    assert jobbers.cleaner.catch_up(by="catch-up in w1") is not None  # no pass ever: overdue
    assert [(e.kind, e.key, e.ongoing) for e in heard.events] == [
        (AlertKind.CLEANER_OVERDUE, "cleaner", True)]
    assert jobbers.cleaner.catch_up(by="catch-up in w1") is None  # a pass just ran
    assert len(heard.events) == 1


def test_each_dead_letter_the_sink_took_is_counted_by_task_name() -> None:
    jobbers = in_memory(app(), InMemoryStore(), InMemoryDeadLetterSink())
    heard = Heard()
    jobbers.alerts = heard  # type: ignore[assignment]
    entry = DeadLetter(task_id="t1", name="billing.charge", version=1, queue="celery",
                       reason="failed", args=[], kwargs={}, exception_type="ValueError",
                       exception_message="no", traceback=None, attempt=1, retry_attempt=0,
                       worker="w1", failed_at=datetime(2026, 12, 6, tzinfo=UTC))
    assert jobbers.dead_letters.send(entry)
    assert heard.dead == [("billing.charge", None)]
