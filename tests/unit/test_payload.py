from __future__ import annotations

import datetime as dt
import uuid

from jobbers_celery.lifecycle import payload


def test_from_publish_keeps_what_a_republish_needs():
    headers = {"lang": "py", "task": "t", "id": "1", "retries": 2, "timelimit": (30, 20),
               "root_id": "r", "parent_id": "p", "group": "g", "expires": "2030-01-01T00:00:00",
               "jobbers_version": 3, "tenant": "acme"}
    body = ([1, 2], {"x": 1}, {"callbacks": [{"task": "cb"}], "errbacks": None,
                               "chain": None, "chord": None})
    data = payload.from_publish(headers, body, "", "imports", {"priority": 5})
    assert data == {
        "args": [1, 2], "kwargs": {"x": 1},
        "options": {"queue": "imports", "headers": {"tenant": "acme"},
                    "link": [{"task": "cb"}], "root_id": "r", "parent_id": "p",
                    "group_id": "g", "expires": "2030-01-01T00:00:00", "time_limit": 30,
                    "soft_time_limit": 20, "priority": 5},
    }
    assert payload.queue_of(data["options"]) == "imports"


def test_named_exchange_keeps_exchange_and_routing_key():
    data = payload.from_publish({"id": "1"}, ((), {}, {}), "tasks", "a.b", {})
    assert data is not None
    assert data["options"]["exchange"] == "tasks"
    assert data["options"]["routing_key"] == "a.b"


def test_protocol_one_bodies_are_not_recorded():
    assert payload.from_publish({"id": "1"}, {"task": "x"}, "", "q", {}) is None


def test_json_round_trip_of_extra_types():
    value = {"when": dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC), "id": uuid.UUID(int=5)}
    back = payload.loads(payload.dumps(value))
    assert back["when"] == value["when"]
    assert str(back["id"]) == str(value["id"])


def test_describe_exception_names_the_type_and_keeps_the_traceback():
    try:
        raise ConnectionError("refused")
    except ConnectionError as exc:
        name, message, text = payload.describe_exception(exc)
    assert (name, message) == ("ConnectionError", "refused")
    assert "Traceback" in text
    assert "refused" in text


def test_a_deferred_first_publish_keeps_expires_from_the_call_and_names_its_queue():
    now = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
    data = payload.deferred([1], {}, {"expires": 30, "headers": {"t": 1}, "countdown": 5},
                            "celery", now)
    assert data["options"] == {"expires": "2030-01-01T00:00:30+00:00", "headers": {"t": 1},
                               "queue": "celery"}  # countdown is not an option it keeps
    at = now + dt.timedelta(hours=1)
    assert payload.deferred([], {}, {"expires": at}, "q", now)["options"]["expires"] == \
        at.isoformat()
    # routed by the caller: kept as given
    assert payload.deferred([], {}, {"queue": "imports"}, "celery", now)["options"] == \
        {"queue": "imports"}
    assert payload.deferred([], {}, {"exchange": "x", "routing_key": "a.b"}, "celery",
                            now)["options"] == {"exchange": "x", "routing_key": "a.b"}
    from kombu import Queue

    assert payload.deferred([], {}, {"queue": Queue("imports")}, "imports",
                            now)["options"] == {"queue": "imports"}
