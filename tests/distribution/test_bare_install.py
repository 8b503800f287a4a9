"""A bare ``pip install`` of the built wheel is enough to run jobbers.

An empty venv (``python -m venv``, no system site-packages) gets the wheel alone, its
dependencies from PyPI and nothing else; a real prefork ``celery worker`` started from that
venv, in a temporary directory (the checkout is not importable), runs a JobbersTask to
``completed`` with a private redis-server as broker. This is what the test suite's own venv
hides: its development group brings packages (``packaging``, for one) that a user does not
have. Then the same venv gets the wheel's ``django`` and ``otel`` extras, and the Django app
must work with them alone (``check``, ``migrate``, the API's schema) and metrics must record.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.conftest import RedisServer
from tests.distribution.tools import Dist, Service, Venv, run, user_env

pytestmark = [pytest.mark.worker, pytest.mark.timeout(900)]

APP = '''
import os

from celery import Celery
from jobbers_celery import JobbersTask, install

app = Celery("bareapp", broker=os.environ["BARE_REDIS_URL"], backend=os.environ["BARE_REDIS_URL"])
app.conf.update(task_serializer="json", accept_content=["json"], result_serializer="json")
jobbers = install(app)


@app.task(base=JobbersTask, bind=True)
def add(self, x, y):
    self.heartbeat(progress={"done": 1, "total": 1})
    return x + y
'''

#: Sends one task and polls its record until it ends (or 60 s pass); prints what it saw.
CLIENT = '''
import json, time

from bareapp import add, jobbers

r = add.delay(2, 3)
deadline = time.monotonic() + 60
while jobbers.get(r.id).state.value not in {"completed", "failed", "stalled", "dropped"}:
    if time.monotonic() > deadline:
        break
    time.sleep(0.1)
rec = jobbers.get(r.id)
print(json.dumps({
    "state": rec.state.value, "attempt": rec.attempt, "worker": rec.worker,
    "result": r.get(timeout=10) if rec.state.value == "completed" else None,
    "history": [[t.from_state.value, t.to_state.value] for t in jobbers.history(r.id)],
}))
'''

#: jobbers_payload_keys as a user sets it (the key from the docs' one-liner, argv[1]; the
#: store's URL argv[2]): a bad key is refused at install(), and the installed codec seals a
#: value that holds no plaintext and opens it again
CODEC_CHECK = """
import sys
from celery import Celery
from jobbers_celery import install
from jobbers_celery.core.codec import PayloadCodec
from jobbers_celery.core.errors import ConfigurationError
app = Celery("sealed", broker="memory://")
app.conf.jobbers_redis_url = sys.argv[2]
app.conf.jobbers_payload_keys = ["k1:not-a-key"]
try:
    install(app)
except ConfigurationError as exc:
    assert "jobbers_payload_keys[0]" in str(exc), exc
else:
    raise AssertionError("a bad key was accepted")
app = Celery("sealed", broker="memory://")
app.conf.jobbers_redis_url = sys.argv[2]
app.conf.jobbers_payload_keys = [sys.argv[1]]
install(app)
codec = PayloadCodec.of(app.conf.jobbers_payload_keys)
sealed = codec.seal('{"password": "hunter2-bare"}')
assert "hunter2" not in str(sealed), sealed
assert codec.open(sealed) == '{"password": "hunter2-bare"}'
print("sealed and opened")
"""
SETTINGS = '''
SECRET_KEY = "bare-install-check"
INSTALLED_APPS = [
    "django.contrib.admin", "django.contrib.auth", "django.contrib.contenttypes",
    "django.contrib.sessions", "django.contrib.messages", "rest_framework", "jobbers_django",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [{"BACKEND": "django.template.backends.django.DjangoTemplates", "APP_DIRS": True,
              "OPTIONS": {"context_processors": [
                  "django.template.context_processors.request",
                  "django.contrib.auth.context_processors.auth",
                  "django.contrib.messages.context_processors.messages"]}}]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": "bare.sqlite3"}}
ROOT_URLCONF = "bareurls"
USE_TZ = True
CELERY_BROKER_URL = "memory://"
JOBBERS_CELERY_APP = "bareapp.app"
'''

URLS = '''
from django.urls import include, path

urlpatterns = [path("jobbers/", include("jobbers_django.urls"))]
'''

DJANGO_CHECK = '''
import django

django.setup()
from django.contrib.auth.models import User
from django.test import Client
from jobbers_celery.telemetry import metrics

User.objects.create_superuser("admin", "admin@example.com", "pw")
client = Client()
client.force_login(User.objects.get(username="admin"))
schema = client.get("/jobbers/schema", {"format": "json"})
listing = client.get("/jobbers/dead-letter-queue")
print(json.dumps({"schema": schema.status_code, "openapi": schema.json().get("openapi"),
                  "list": listing.status_code, "count": listing.json()["count"],
                  "metrics": metrics._get() is not None}))
'''


def test_the_wheel_alone_runs_a_worker_then_its_extras_run_django(
        dist: Dist, tmp_path: Path, own_redis: RedisServer) -> None:
    log = tmp_path / "install.log"
    work = tmp_path / "work"
    work.mkdir()
    started = time.monotonic()
    venv = Venv.create(tmp_path / "venv", log=log)
    assert venv.distributions(cwd=work, log=log) <= {"pip", "setuptools"}  # empty

    venv.pip("install", str(dist.wheel), cwd=work, log=log)
    installed = venv.distributions(cwd=work, log=log)
    assert {"jobbers", "celery", "kombu", "redis", "packaging"} <= installed
    assert not {"django", "djangorestframework", "opentelemetry-api", "pytest"} & installed
    run([venv.python, "-m", "pip", "check"], cwd=work, log=log)
    installed_at = time.monotonic()

    (work / "bareapp.py").write_text(APP)
    env = user_env({"BARE_REDIS_URL": own_redis.url(0)})
    worker = Service([venv.bin("celery"), "-A", "bareapp", "worker", "-P", "prefork", "-c", "2",
                      "-l", "INFO", "-n", "bare@localhost"], cwd=work,
                     log=tmp_path / "worker.log", env=env)
    try:
        worker.wait_for_output("bare@localhost ready.")
        out = run([venv.python, "-c", CLIENT], cwd=work, log=log, env=env, timeout=120)
    finally:
        worker.stop()
    seen = json.loads(out.strip().splitlines()[-1])
    assert seen == {"state": "completed", "attempt": 1, "worker": "bare@localhost", "result": 5,
                    "history": [["unsubmitted", "submitted"], ["submitted", "started"],
                                ["started", "completed"]]}
    assert "packaging" not in worker.log  # the ModuleNotFoundError of a celery without [redis]
    # the wheel's celery.commands entry point: `celery jobbers` reads the same store
    listed = run([venv.bin("celery"), "-A", "bareapp", "jobbers", "tasks", "--json"], cwd=work,
                 log=log, env=env)
    tasks, _ = json.JSONDecoder().raw_decode(listed[listed.index("["):])  # then stderr
    assert [t["state"] for t in tasks] == ["completed"]
    worked_at = time.monotonic()

    # the extras, in the same venv: the Django app, metrics and the payload codec, with
    # nothing else
    venv.pip("install", f"{dist.wheel}[django,otel,crypto]", cwd=work, log=log)
    installed = venv.distributions(cwd=work, log=log)
    assert {"django", "djangorestframework", "django-filter", "drf-spectacular",
            "opentelemetry-api", "cryptography"} <= installed
    # docs/howto/encryption.md's key one-liner, and a value sealed and opened with its key
    key = run([venv.python, "-c", "from jobbers_celery.codec import new_key; print(new_key())"],
              cwd=work, log=log).strip().splitlines()[-1]
    out = run([venv.python, "-c", CODEC_CHECK, key, own_redis.url(0)], cwd=work, log=log)
    assert out.strip().splitlines()[-1] == "sealed and opened"
    assert not {"opentelemetry-sdk", "psycopg", "django-celery-beat", "pytest"} & installed
    run([venv.python, "-m", "pip", "check"], cwd=work, log=log)
    (work / "baresettings.py").write_text(SETTINGS)
    (work / "bareurls.py").write_text(URLS)
    denv = user_env({"BARE_REDIS_URL": own_redis.url(0), "DJANGO_SETTINGS_MODULE": "baresettings"})
    run([venv.python, "-m", "django", "check", "--fail-level", "WARNING"], cwd=work, log=log,
        env=denv)
    run([venv.python, "-m", "django", "migrate", "--no-input"], cwd=work, log=log, env=denv)
    out = run([venv.python, "-c", "import json\n" + DJANGO_CHECK], cwd=work, log=log, env=denv)
    assert json.loads(out.strip().splitlines()[-1]) == {
        "schema": 200, "openapi": "3.0.3", "list": 200, "count": 0, "metrics": True}
    print(f"venv + wheel install {installed_at - started:.1f}s, worker run "
          f"{worked_at - installed_at:.1f}s, extras + Django checks "
          f"{time.monotonic() - worked_at:.1f}s")
