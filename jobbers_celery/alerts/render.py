"""An alert as people read it: bounded, escaped, redacted, in a Slack-compatible body.

Titles and texts quote task names and exception messages: untrusted. Each field is cut to
its bound first (so nothing below runs on unbounded text), then secrets are redacted
(:meth:`~jobbers_celery.core.redaction.Redactor.text`: URL passwords, bearer tokens,
``password=...`` pairs), then control characters are shown escaped
(:func:`~jobbers_celery.core.printable.printable`: a newline cannot forge a line, an
escape sequence reach a terminal), and, in Slack's mrkdwn, ``&``, ``<`` and ``>`` are
escaped as Slack asks (so a message cannot write ``<!channel>`` or a link of its own).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from jobbers_celery.alerts.events import AlertEvent
from jobbers_celery.alerts.links import absolute
from jobbers_celery.core.printable import printable
from jobbers_celery.core.redaction import Redactor
from jobbers_celery.core.timefmt import human_time, iso_time

__all__ = ["KEY_MAX", "TEXT_MAX", "TITLE_MAX", "Rendered", "email_body", "mrkdwn", "render",
           "slack_body"]

TITLE_MAX = 200
TEXT_MAX = 2000
KEY_MAX = 200
LINK_MAX = 2000
_CUT = "…"
#: Characters past a field's bound that are redacted with it before it is cut.
_REDACT_MARGIN = 512


def _bounded(text: object, limit: int) -> str:
    text = text if isinstance(text, str) else str(text)
    return text if len(text) <= limit else text[:limit - 1] + _CUT


def mrkdwn(text: str) -> str:
    """``text`` as Slack mrkdwn shows it literally (its three control characters escaped)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


@dataclass(frozen=True, slots=True)
class Rendered:
    """An event's fields, safe to show: bounded, redacted, control characters escaped."""

    kind: str
    key: str
    title: str
    text: str
    url: str | None
    rule: str
    at: datetime


def render(event: AlertEvent, rule: str, redactor: Redactor, admin_url: str,
           at: datetime | None = None) -> Rendered:
    """``event`` made safe to show (see the module); ``url``: its link made absolute."""
    def clean(value: object, limit: int, newlines: bool = False) -> str:
        # redacted before the cut, over a margin: a secret the cut ran through (a URL whose
        # "@" fell past it) would no longer match its pattern and show its first part
        wide = redactor.text(_bounded(value, limit + _REDACT_MARGIN))
        return printable(_bounded(wide, limit), newlines=newlines)

    url = absolute(_bounded(event.link, LINK_MAX) if event.link else None, admin_url)
    if url is not None and not url.isprintable():
        url = None  # a link is ours or an operator's: one with control characters is dropped
    return Rendered(kind=clean(event.kind, 64), key=clean(event.key, KEY_MAX),
                    title=clean(event.title, TITLE_MAX),
                    text=clean(event.text, TEXT_MAX, newlines=True), url=url,
                    rule=printable(rule[:100]), at=at or datetime.now(UTC))


def _slack_url(url: str) -> str:
    # inside <url|label> a | or > would end the URL: percent-encode them (and space, <)
    return url.translate({ord("|"): "%7C", ord(">"): "%3E", ord("<"): "%3C", ord(" "): "%20"})


def slack_body(alert: Rendered) -> dict[str, Any]:
    """A Slack incoming-webhook body (``text`` and ``blocks``), and the same facts as
    fields under ``jobbers`` for tools that are not Slack."""
    head = f"*{mrkdwn(alert.title)}*"
    body = mrkdwn(alert.text)
    link = f"<{_slack_url(alert.url)}|Open in jobbers>" if alert.url else None
    text = "\n".join(part for part in (head, body, link) if part)
    blocks: list[dict[str, Any]] = [
        {"type": "section", "text": {"type": "mrkdwn", "text": f"{head}\n{body}"[:3000]}},
        {"type": "context", "elements": [{"type": "mrkdwn", "text": mrkdwn(
            f"{alert.kind} · {alert.key} · rule {alert.rule}")[:3000]}]},
    ]
    if link:
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": link}})
    return {"text": text, "blocks": blocks, "jobbers": {
        "kind": alert.kind, "key": alert.key, "title": alert.title, "text": alert.text,
        "link": alert.url, "rule": alert.rule, "at": iso_time(alert.at)}}


def email_body(alert: Rendered) -> tuple[str, str]:
    """``(subject, body)`` of an email: a subject on one line (no header injection)."""
    subject = f"[jobbers] {alert.title}"
    lines = [alert.text, ""]
    if alert.url:
        lines.append(f"Open in jobbers: {alert.url}")
    lines.append(f"{alert.kind} · {alert.key} · rule {alert.rule} · {human_time(alert.at)}")
    return subject, "\n".join(lines)
