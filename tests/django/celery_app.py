"""The Celery app of the Django tests: jobbers with the Django dead-letter sink.

Workers run it with ``celery -A tests.django.celery_app worker`` (DJANGO_SETTINGS_MODULE
and JOBBERS_TEST_DB_NAME set by the test); the test process imports it once the private
Redis URL is known.
"""

from __future__ import annotations

import os

from jobbers_celery import JobbersTask, install
from tests.testapp import make_app

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.django.settings")
REDIS_URL = os.environ["JOBBERS_TEST_REDIS_URL"]
# JOBBERS_TEST_BROKER_URL: another broker (RabbitMQ, tests/rabbitmq.py); state stays in Redis.
BROKER_URL = os.environ.get("JOBBERS_TEST_BROKER_URL") or REDIS_URL

app = make_app(
    "djproj", REDIS_URL, broker=BROKER_URL,
    jobbers_dead_letter_sink="jobbers_django.sink.DjangoDeadLetterSink",
    # the argument search (tests/django/test_search.py): one indexed path
    jobbers_indexed_arguments={"djproj.import_order": ["order_id"]},
)
jobbers = install(app)


@app.task(base=JobbersTask, bind=True, name="djproj.flaky_import", dead_letter_policy="save")
def flaky_import(self: JobbersTask, key: str, password: str = "") -> dict[str, object]:
    """Fails until ``key`` is set in Redis (the "fix"), then returns what it was given."""
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    client.rpush(f"{key}:runs", self.attempt)
    if not client.exists(key):
        raise ValueError(f"upstream rejected row {self.attempt * 17} of {key}")
    return {"attempt": self.attempt, "checkpoint": self.checkpoint, "password": password}


@app.task(base=JobbersTask, bind=True, name="djproj.big_import", dead_letter_policy="save")
def big_import(self: JobbersTask, key: str, data: str) -> int:
    """Fails until ``key`` is set in Redis, then returns the length of ``data`` (not ``data``:
    the result must not be another copy of a big argument)."""
    import redis

    if not redis.Redis.from_url(REDIS_URL).exists(key):
        raise ValueError(f"upstream rejected {key}")
    return len(data)


@app.task(base=JobbersTask, bind=True, name="djproj.leaky_login", dead_letter_policy="save")
def leaky_login(self: JobbersTask, key: str, secret: str, password: str = "", dsn: str = "",
                auth: str = "") -> str:
    """Writes what it was given to ``key:got`` (the test checks the real values arrived),
    retries once after 0.3 s, then, until ``key`` is set, fails quoting every secret it has,
    and one of its own."""
    import json

    import redis

    client = redis.Redis.from_url(REDIS_URL)
    runs = client.rpush(f"{key}:got", json.dumps([secret, password, dsn, auth]))
    if runs == 1:  # a delayed retry: the scheduler republishes it
        raise self.retry(exc=ConnectionError(f"{dsn} said no to {password}"), countdown=0.3)
    if not client.exists(key):
        raise PermissionError(f"login to {dsn} with {auth} refused: password {password!r} "
                              f"and secret {secret} rejected; server said Bearer exc-0nly-tok")
    return "ok"


@app.task(base=JobbersTask, bind=True, name="djproj.collect", dead_letter_policy="save")
def collect(self: JobbersTask, results: list[object]) -> int:
    """A chord's callback (the workflow tests): how many results its header gave."""
    return len(results)


@app.task(base=JobbersTask, bind=True, name="djproj.import_order")
def import_order(self: JobbersTask, order_id: int, card_number: str = "",
                 note: str = "") -> int:
    """Found by its order number (an indexed path), its card number never shown."""
    return order_id
