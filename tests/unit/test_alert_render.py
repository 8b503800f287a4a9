"""What a receiver is handed: bounded, redacted, control characters escaped, Slack's three
characters escaped in mrkdwn; whatever the task name or exception message holds."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobbers_celery.alerts import AlertEvent, AlertKind, links
from jobbers_celery.alerts.render import (
    TEXT_MAX,
    TITLE_MAX,
    email_body,
    mrkdwn,
    render,
    slack_body,
)
from jobbers_celery.core.redaction import redactor

AT = datetime(2026, 12, 6, 9, 0, tzinfo=UTC)
ADMIN = "https://ops.example.com/admin/"


def shown(title: str, text: str = "", link: str | None = None) -> dict[str, Any]:
    event = AlertEvent(AlertKind.NEW_FAILURE_GROUP, "k", title, text, link)
    return slack_body(render(event, "r1", redactor(), ADMIN, AT))


def test_slack_control_characters_cannot_ping_or_link() -> None:
    body = shown("<!channel> boom & <https://evil.example|click>")
    assert "<!channel>" not in json.dumps([body["text"], body["blocks"]])
    assert body["text"].startswith(
        "*&lt;!channel&gt; boom &amp; &lt;https://evil.example|click&gt;*")
    # the structured fields keep the text as it is (escaped for terminals only)
    assert body["jobbers"]["title"] == "<!channel> boom & <https://evil.example|click>"


def test_secrets_are_redacted_and_newlines_cannot_forge_lines() -> None:
    body = shown("failed", "connect\x1b[2J postgres://app:hunter2@db/x\nAuthorization: Bearer abc.def")
    text = body["jobbers"]["text"]
    assert "hunter2" not in text
    assert "abc.def" not in text
    assert "\x1b" not in text
    assert "\\x1b[2J" in text
    assert "\n" in text  # a message's own lines stay lines in the body
    assert "\n" not in shown("a\nb")["jobbers"]["title"]


def test_the_link_is_absolute_and_cannot_break_out_of_slack_link_syntax() -> None:
    body = shown("t", link=links.task("a|b>c"))
    assert body["jobbers"]["link"] == (
        "https://ops.example.com/admin/jobbers/deadletterentry/live/task/a~7Cb~3Ec/")
    assert body["blocks"][-1]["text"]["text"] == (
        "<https://ops.example.com/admin/jobbers/deadletterentry/live/task/a~7Cb~3Ec/"
        "|Open in jobbers>")
    assert links.absolute("jobbers/x/", "") is None  # no admin URL: no link
    assert links.dead_letters_of("a b&c") == "jobbers/deadletterentry/?task_name=a%20b%26c"


def test_email_subject_is_one_line() -> None:
    subject, body = email_body(render(AlertEvent("stall", "k", "a\r\nBcc: x@y", "t",
                                                 "jobbers/x/"), "r1", redactor(), ADMIN, AT))
    assert "\n" not in subject
    assert "\r" not in subject
    assert "Open in jobbers: https://ops.example.com/admin/jobbers/x/" in body


@given(st.text(max_size=5000), st.text(max_size=5000))
def test_any_title_and_text_render_bounded_and_inert(title: str, text: str) -> None:
    event = AlertEvent(AlertKind.STALL, title, title, text, links.task(title))
    alert = render(event, "r1", redactor(), ADMIN, AT)
    # bounded (an escape shows one character as at most 10)
    assert len(alert.title) <= TITLE_MAX * 10
    assert len(alert.text) <= TEXT_MAX * 10
    assert alert.title.isprintable()
    assert all(line.isprintable() for line in alert.text.split("\n"))
    body = slack_body(alert)
    json.dumps(body)  # always serializable
    for part in (body["text"], body["blocks"][0]["text"]["text"]):
        assert "<!" not in part
        unescaped = part.replace("&amp;", "").replace("&lt;", "").replace("&gt;", "")
        assert "&" not in unescaped
        assert "<" not in unescaped.replace("<https://ops.example.com/admin/", "")


@given(st.text(max_size=200))
def test_mrkdwn_escapes_exactly_the_three_characters(text: str) -> None:
    escaped = mrkdwn(text)
    assert "<" not in escaped
    assert ">" not in escaped
    assert escaped.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&") == text


def test_a_secret_the_bound_runs_through_is_redacted_before_the_cut() -> None:
    from jobbers_celery.alerts.events import AlertEvent, AlertKind
    from jobbers_celery.alerts.render import render
    from jobbers_celery.core.redaction import Redactor

    text = "x" * 1975 + " https://user:s3cretpassw0rd@db.example/x"
    shown = render(AlertEvent(AlertKind.STALL, "k", "t", text), "r", Redactor(), "")
    assert "s3cr" not in shown.text


def test_a_webhook_that_redirects_is_an_error_never_followed() -> None:
    import http.server
    import threading
    from ipaddress import IPv4Network

    from jobbers_celery.alerts.webhook import WebhookError, post

    hits: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            hits.append(self.path)
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(307)
            self.send_header("Location", "/elsewhere")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with pytest.raises(WebhookError, match="HTTP 307"):
            post(f"http://127.0.0.1:{server.server_port}/hook", {"text": "x"}, 5,
                 allow=[IPv4Network("127.0.0.0/8")])
    finally:
        server.shutdown()
        server.server_close()
    assert hits == ["/hook"]  # the redirect was not followed
