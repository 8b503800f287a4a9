"""The admin pages an alert links to, as paths under the admin's root (``jobbers_admin_url``).

jobbers_celery has no pages of its own: these are jobbers_django's admin routes, written
out here so that a worker without Django loaded can still link (a test reverses each one
in jobbers_django and compares). A task id is encoded by :func:`admin_task_id`, which the
admin's path converter (``jobbers_django.converters``) uses too: ``~XX`` for every byte but
letters, digits and ``-_.:@+``.
"""

from __future__ import annotations

from urllib.parse import quote

__all__ = ["LIVE", "absolute", "admin_task_id", "dead_letters_of", "failure_group", "task"]

#: The live tasks page: counts, running, stalled and scheduled tasks, the cleaner's last pass.
LIVE = "jobbers/deadletterentry/live/"


def admin_task_id(task_id: str) -> str:
    """The admin's URL form of ``task_id`` (never empty, never a dot-segment, no ``/``):
    the one encoder, which jobbers_django's path converter uses too."""
    if not task_id:
        return "~"
    text = quote(task_id, safe=":@+", errors="surrogatepass").replace("~", "%7E")
    if text[0] == ".":
        text = "%2E" + text[1:]
    if text[-1] == "." and len(text) > 1:
        text = text[:-1] + "%2E"
    return text.replace("%", "~")


def task(task_id: str) -> str:
    """One task's page: its record and transitions."""
    return f"jobbers/deadletterentry/live/task/{admin_task_id(task_id)}/"


def failure_group(pk: int) -> str:
    """A failure group's page (its database id)."""
    return f"jobbers/failuregroup/{int(pk)}/change/"


def dead_letters_of(task_name: str) -> str:
    """The dead letters of one task name."""
    return f"jobbers/deadletterentry/?task_name={quote(task_name, safe='')}"


def absolute(link: str | None, admin_url: str) -> str | None:
    """``link`` as a URL: a path is joined to ``admin_url`` (``None`` without one); a URL
    (``http(s)://``) stays as it is."""
    if not link:
        return None
    if link.startswith(("http://", "https://")):
        return link
    if not admin_url:
        return None
    return admin_url.rstrip("/") + "/" + link.lstrip("/")
