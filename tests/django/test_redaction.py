"""Secret-looking argument keys are redacted for display, configurable, at any depth."""

from __future__ import annotations

from jobbers_django.redaction import REDACTED, redact


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
