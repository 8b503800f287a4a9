"""Task ids in URL paths: any string Celery runs (a newline, ``/``, ``..``, ``%``, ``?``,
``#``, ``<script>``, non-ASCII, empty) reverses and resolves, and comes back the same.

Two forms, registered as path converters when this module is imported:

- ``jobbers_task_id``, the admin's links (:func:`django.urls.reverse` builds them, so the
  form is ours): letters, digits and ``- _ . : @ +`` as they are, so a UUID reads as
  itself; every other UTF-8 byte as ``~`` and two upper-case hex digits (``a/b`` ->
  ``a~2Fb``, the empty id -> ``~``), and a first or last ``.`` too, so no segment is a
  dot-segment a browser would fold. ``~`` is unreserved (RFC 3986): no browser, proxy or
  server decodes or normalizes it, where ``%2F`` and ``%2E%2E`` are decoded by some.
- ``jobbers_any_task_id``, the REST API's contract paths (``/tasks/{task_id}``): the
  client percent-encodes the id (docs/howto/rest-api.md), the server decodes it before
  routing (``%2F`` included), so this matches any decoded text, slashes and newlines
  included; the view bounds its length.
"""

from __future__ import annotations

import re
from urllib.parse import unquote_to_bytes

from django.urls import register_converter

from jobbers_celery import admin_task_id

__all__ = ["ADMIN_TASK_ID", "API_TASK_ID", "AnyTaskIdConverter", "TaskIdConverter",
           "decode_task_id", "encode_task_id"]

#: The converters' names, for routes: ``f"live/task/<{ADMIN_TASK_ID}:task_id>/"``.
ADMIN_TASK_ID = "jobbers_task_id"
API_TASK_ID = "jobbers_any_task_id"

#: The admin's form: plain characters and ``~XX`` escapes, or ``~`` alone (the empty id).
_FORM = re.compile(r"(?:[A-Za-z0-9_.:@+\-]|~[0-9A-F]{2})+|~")
_EMPTY = "~"


def encode_task_id(task_id: str) -> str:
    """The admin's URL form of ``task_id`` (never empty, never a dot-segment, no ``/``):
    :func:`jobbers_celery.admin_task_id`, the encoder the alerts' links use too."""
    return admin_task_id(task_id)


def decode_task_id(text: str) -> str:
    """The id :func:`encode_task_id` made ``text`` from; ``ValueError`` if none did."""
    if not _FORM.fullmatch(text):
        raise ValueError(f"not a task id's URL form: {text[:80]!r}")
    if text == _EMPTY:
        return ""
    # UnicodeDecodeError (bytes that are no UTF-8) is a ValueError too
    return unquote_to_bytes(text.replace("~", "%")).decode("utf-8", "surrogatepass")


class TaskIdConverter:
    """``<jobbers_task_id:task_id>``: the admin's readable, reversible form."""

    regex = _FORM.pattern

    def to_python(self, value: str) -> str:
        return decode_task_id(value)

    def to_url(self, value: str) -> str:
        return encode_task_id(value)


class AnyTaskIdConverter:
    """``<jobbers_any_task_id:task_id>``: the REST API's percent-encoded id, as the server
    decoded it (any text, slashes, newlines and the empty id included)."""

    regex = r"[\s\S]*"

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value


register_converter(TaskIdConverter, ADMIN_TASK_ID)
register_converter(AnyTaskIdConverter, API_TASK_ID)
