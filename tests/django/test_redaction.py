"""Secret-looking argument keys are redacted for display, configurable, at any depth."""

from __future__ import annotations

import json

from jobbers_django.redaction import REDACTED, display, redact


def test_default_keys_at_any_depth():
    shown = redact({"password": "p", "DB_Password": "p", "api-key": "k", "Authorization": "a",
                    "region": "eu", "nested": [{"access_token": "t", "n": 1}],
                    "client_secret": "s"})
    assert shown == {"password": REDACTED, "DB_Password": REDACTED, "api-key": REDACTED,
                     "Authorization": REDACTED, "region": "eu",
                     "nested": [{"access_token": REDACTED, "n": 1}],
                     "client_secret": REDACTED}


def test_configurable(settings):
    settings.JOBBERS_REDACT_KEYS = ["iban"]
    assert redact({"customer_iban": "DE00", "password": "p"}) == {
        "customer_iban": REDACTED, "password": "p"}


def test_the_original_is_untouched():
    kwargs = {"password": "hunter2"}
    redact(kwargs)
    assert kwargs == {"password": "hunter2"}


def test_long_values_are_cut_for_display_keeping_their_shape():
    value = {"password": "p" * 50_000, "rows": list(range(5000)), "note": "x" * 100_000}
    shown, cut = display(value, limit=1000)
    assert cut
    assert len(json.dumps(shown)) < 1200
    assert shown["password"] == REDACTED  # redacted before it is cut: no secret leaks
    assert isinstance(shown["rows"], list)
    assert shown["rows"][:3] == [0, 1, 2]
    left = 5000 - len(shown["rows"]) + 1  # the last item is the marker
    assert shown["rows"][-1] == f"... [cut for display: {left:,} more items]"
    assert shown["..."] == "[cut for display: 1 more key]"  # "note" did not fit
    assert value["note"] == "x" * 100_000  # the original is untouched

    [text, *rest] = display(["x" * 100_000, 1, 2], limit=1000)[0]
    assert text.startswith("x" * 900)
    assert text.endswith("x... [cut for display: 100,000 characters in all]")
    assert rest == ["... [cut for display: 2 more items]"]


def test_short_values_and_a_zero_limit_are_not_cut(settings):
    assert display(["catalog-42", {"region": "eu"}]) == (["catalog-42", {"region": "eu"}], False)
    assert display("x" * 16_000) == ("x" * 16_000, False)  # the default limit: 16,384
    assert display("x" * 17_000)[1]
    settings.JOBBERS_DISPLAY_MAX_CHARS = 0
    assert display("x" * 100_000) == ("x" * 100_000, False)


def test_positional_arguments_by_the_task_parameter_names_and_credentials_by_look(djapp):
    from jobbers_django.redaction import arguments, text

    # djproj.flaky_import(key, password): the second positional argument is the password
    args, kwargs = arguments("djproj.flaky_import", ["catalog", "hunter2"],
                             {"url": "postgres://u:pg-pass1@db/app", "dsn": "x"})
    assert args == ["catalog", REDACTED]
    assert kwargs == {"url": f"postgres://u:{REDACTED}@db/app", "dsn": REDACTED}
    # an unknown task: keys and looks only
    assert arguments("nobody.knows", ["catalog", "hunter2"], {})[0] == ["catalog", "hunter2"]
    message = "login as u with hunter2 failed (Authorization: Bearer abc.123)"
    assert text(message, "djproj.flaky_import", ["catalog", "hunter2"], {}) == (
        f"login as u with {REDACTED} failed (Authorization: Bearer {REDACTED})")


def test_the_keys_default_to_the_celery_apps_setting(settings, djapp):
    from jobbers_django.redaction import current

    settings.JOBBERS_CELERY_APP = "tests.django.celery_app.app"
    assert current().needles == tuple(djapp.jobbers.config.redact_keys)
    settings.JOBBERS_REDACT_KEYS = ["iban"]
    assert current().needles == ("iban",)
