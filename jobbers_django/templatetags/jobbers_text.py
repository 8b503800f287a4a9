"""``{% load jobbers_text %}``: ``{{ value|printable }}`` shows a publisher-chosen id, name,
queue or worker with its control characters escaped (:func:`jobbers_celery.core.printable`), as
the command lines do: in a page too, a newline would read as a space (``a\\nb`` like ``a b``)
and a bidi override (U+202E) would reorder the text after it. HTML escaping still follows."""

from __future__ import annotations

from typing import Any

from django import template

from jobbers_celery import printable as _printable

__all__ = ["printable"]

register = template.Library()


@register.filter
def printable(value: Any) -> Any:
    return _printable(value) if isinstance(value, str) else value
