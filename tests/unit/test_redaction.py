"""The one redaction (jobbers_celery.core.redaction) and how Celery's reprs and a task's exception
get it (jobbers_celery.worker.taskrepr). No network: a Celery app object that never connects."""

from __future__ import annotations

import time
from typing import Any

import pytest
from celery import Celery
from celery.utils.saferepr import saferepr

from jobbers_celery import JobbersTask
from jobbers_celery.core.config import JobbersConfig
from jobbers_celery.core.errors import ConfigurationError
from jobbers_celery.core.redaction import REDACTED, Parameters, Redactor, parameters, redactor
from jobbers_celery.worker.taskrepr import redact_exception, redact_headers, task_parameters

R = redactor()


def test_keys_at_any_depth_and_the_original_untouched():
    value = {"password": "p", "DB_Password": {"x": 1}, "api-key": "k", "region": "eu",
             "nested": [{"access_token": "t", "n": 1}], "client_secret": "s"}
    assert R.value(value) == {"password": REDACTED, "DB_Password": REDACTED,
                              "api-key": REDACTED, "region": "eu",
                              "nested": [{"access_token": REDACTED, "n": 1}],
                              "client_secret": REDACTED}
    assert value["password"] == "p"
    assert Redactor(["iban"]).value({"customer_iban": "DE00", "password": "p"}) == {
        "customer_iban": REDACTED, "password": "p"}


def test_credentials_in_text_whatever_their_key():
    shown = R.value(["postgres://u:hunter2@db.example/app", "Bearer abc.DEF-123",
                     "Authorization: Basic dTpodW50ZXIy", "x password=hunter2&y=1",
                     '{"api_key": "k-123"}', "redis://localhost:6379/0", "Bearer token missing"])
    assert shown == ["postgres://u:********@db.example/app", "Bearer ********",
                     "Authorization: Basic ********", "x password=********&y=1",
                     '{"api_key": "********"}', "redis://localhost:6379/0",
                     "Bearer token missing"]


def test_positional_arguments_matched_to_parameter_names():
    def login(user: str, password: str, *tokens: str, retries: int = 0) -> None: ...

    params = parameters(login)
    assert params == Parameters(("user", "password"), "tokens")
    args, kwargs = R.arguments(["ann", "hunter2", "t1", "t2"], {"retries": 1}, params)
    assert args == ["ann", REDACTED, REDACTED, REDACTED]
    assert kwargs == {"retries": 1}
    assert R.arguments(["ann", "hunter2"], {}, None)[0] == ["ann", "hunter2"]  # unknown task


def test_bound_and_plain_tasks_leave_self_out():
    app = Celery("redaction-unit", set_as_current=False)

    @app.task(bind=True, base=JobbersTask, name="t.bound")
    def bound(self: Any, catalog: str, secret: str) -> None: ...

    @app.task(name="t.plain")
    def plain(catalog: str, secret: str) -> None: ...

    for task in (bound, plain):
        assert task_parameters(task) == Parameters(("catalog", "secret"), None)


def test_text_takes_out_known_values_as_quoted():
    known = R.secrets(["ann", 's3cr3t"x'], {"password": "hunter2", "cfg": {"token": 12345}},
                      Parameters(("user", "secret")))
    message = 'login failed for hunter2 with {"k": "s3cr3t\\"x"} (12345)'
    assert R.text(message, known) == (f'login failed for {REDACTED} with {{"k": "{REDACTED}"}} '
                                      f"({REDACTED})")
    assert "ann" not in known  # not secret, and too short to look for anyway


def test_text_is_linear_on_hostile_input():
    start = time.perf_counter()
    for text in ("a-" * 200_000, "a" * 400_000 + "://", "x:" * 200_000):
        R.text(text)
    assert time.perf_counter() - start < 5  # quadratic would take minutes


def test_headers_get_redacted_reprs_and_the_body_keeps_the_values():
    app = Celery("redaction-unit", set_as_current=False)

    @app.task(bind=True, base=JobbersTask, name="t.sync")
    def sync(self: Any, catalog: str, password: str, url: str = "") -> None: ...

    args = ["catalog", "hunter2"]
    kwargs = {"url": "postgres://u:pw-1234@h/db", "api_token": "Bearer abcd1234"}
    body = (args, kwargs, {})
    headers = {"argsrepr": saferepr(args), "kwargsrepr": saferepr(kwargs)}
    redact_headers(app, sync, headers, body, R)
    assert headers["argsrepr"] == "['catalog', '********']"
    assert headers["kwargsrepr"] == ("{'url': 'postgres://u:********@h/db', "
                                     "'api_token': '********'}")
    assert body == (["catalog", "hunter2"], kwargs, {})
    assert kwargs["api_token"] == "Bearer abcd1234"

    given = {"argsrepr": "(my own: password=hunter2)", "kwargsrepr": "{}"}
    redact_headers(app, sync, given, body, R)
    assert given["argsrepr"] == "(my own: password=********)"


def test_an_exception_and_its_chain_are_redacted_in_place():
    app = Celery("redaction-unit", set_as_current=False)

    @app.task(bind=True, base=JobbersTask, name="t.fetch")
    def fetch(self: Any, catalog: str, secret: str) -> None: ...

    exc = ValueError("upstream said: Bearer xyz.987 refused")
    exc.__cause__ = KeyError("no row for hunter2")
    exc.add_note("retrying with password=hunter2")
    redact_exception(exc, fetch, ["catalog", "hunter2"], {}, R)
    assert str(exc) == "upstream said: Bearer ******** refused"
    assert exc.__cause__.args == (f"no row for {REDACTED}",)  # still a KeyError's
    assert exc.__notes__ == [f"retrying with password={REDACTED}"]

    plain = RuntimeError("nothing secret", 42)
    redact_exception(plain, fetch, ["catalog", "hunter2"], {}, R)
    assert plain.args == ("nothing secret", 42)  # untouched when there is nothing to hide


def test_the_key_list_is_a_setting():
    config = JobbersConfig.from_mapping({"jobbers_redis_url": "redis://x",
                                         "jobbers_redact_keys": ["iban"]})
    assert tuple(config.redact_keys) == ("iban",)
    with pytest.raises(ConfigurationError, match="jobbers_redact_keys"):
        JobbersConfig.from_mapping({"jobbers_redis_url": "redis://x",
                                    "jobbers_redact_keys": "password"})


def test_a_sink_error_loses_the_entrys_values_and_any_credential():
    from datetime import UTC, datetime

    from jobbers_celery.core.records import DeadLetter
    from jobbers_celery.deadletter.errors import describe_error

    entry = DeadLetter(task_id="t1", name="n", version=None, queue=None, reason="failed",
                       args=["hunter2-pos"], kwargs={}, exception_type=None,
                       exception_message=None, traceback=None, attempt=1, retry_attempt=0,
                       worker=None, failed_at=datetime.now(UTC), checkpoint=None, options={})
    error = OSError("row ('hunter2-pos') refused by postgres://sink:db-pass-1@db/dlq")
    assert describe_error(error, [entry]) == (
        "OSError: row ('[redacted]') refused by postgres://sink:********@db/dlq")


def test_celery_inspect_shows_the_redacted_reprs_never_the_arguments():
    from celery.contrib.testing.mocks import TaskMessage

    from jobbers_celery.worker.request import JobbersRequest

    app = Celery("redaction-unit", set_as_current=False)

    @app.task(bind=True, base=JobbersTask, name="t.inspect")
    def sync(self: Any, catalog: str, password: str) -> None: ...

    message = TaskMessage("t.inspect", args=["catalog", "hunter2"],
                          argsrepr="['catalog', '********']", kwargsrepr="{}")
    request = JobbersRequest(message, app=app, task=sync)
    for safe in (False, True):
        info = request.info(safe=safe)
        assert (info["args"], info["kwargs"]) == ("['catalog', '********']", "{}")


def test_what_the_record_and_the_dead_letter_store_of_any_exception_has_no_credential():
    from jobbers_celery.lifecycle.payload import describe_exception

    try:
        raise OSError("cannot reach https://svc:k3y-55@api.example/v1 (Bearer abc.987)")
    except OSError as exc:
        name, message, text = describe_exception(exc)
    assert name == "OSError"
    assert message == "cannot reach https://svc:********@api.example/v1 (Bearer ********)"
    assert "k3y-55" not in text
    assert "abc.987" not in text


def test_a_big_value_is_redacted_as_far_as_its_repr_shows_it():
    shown = R.value(["x" * 100_000, "postgres://u:pw-99@h/db"], limit=50)
    assert len(shown) == 1  # cut a margin past what a 50-character repr shows
    assert shown[0] == "x" * len(shown[0])
    assert 600 <= len(shown[0]) <= 650
    url = "y" * 40 + "postgres://u:pw-99@h/db"
    assert R.value([url], limit=50) == ["y" * 40 + "postgres://u:********@h/db"]
    rows = R.value({"rows": [{"id": n, "token": "t"} for n in range(10_000)]}, limit=200)
    assert 5 < len(rows["rows"]) < 100
    assert all(row["token"] == REDACTED for row in rows["rows"])


def test_more_secret_key_names_by_default() -> None:
    """Keys an outside check found passing in clear; a short one is a whole word only."""
    from jobbers_celery.core.redaction import redactor

    red = redactor()
    for key in ("oauth", "Authentication", "privkey", "passwort", "pin", "pin_code", "ssn",
                "cvc", "userSSN"):
        assert red.is_secret_key(key), key
        assert red.value({key: "v4lue-x"}) == {key: "********"}, key
    for key in ("spinner", "pinned", "passenger", "mapping"):
        assert not red.is_secret_key(key), key


def test_a_secret_nested_deeper_than_shown_is_still_known_to_the_text_redactor() -> None:
    """The display stops at 32 levels; a worker takes 100: a message that quotes a secret
    from level 40 must not show it (an outside check found it in clear)."""
    from jobbers_celery.core.redaction import redactor

    red = redactor()
    cfg: object = {"password": "DEEPSECRET1"}
    for _ in range(40):
        cfg = {"x": cfg}
    deep_list: object = {"token": "MIDSECRET2"}
    for _ in range(31):
        deep_list = [deep_list]
    known = red.secrets([], {"cfg": cfg, "other": deep_list})
    assert {"DEEPSECRET1", "MIDSECRET2"} <= known
    shown = red.text("upstream said DEEPSECRET1 and MIDSECRET2 are wrong", known)
    assert "DEEPSECRET1" not in shown
    assert "MIDSECRET2" not in shown
