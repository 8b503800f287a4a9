"""``{% load jobbers_text %}``: names may wrap after their dots, ``_`` and ``@`` and are
otherwise exactly what ``printable`` then HTML escaping show; times read in the one format,
their clock and zone on one line."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django.utils.html import conditional_escape
from hypothesis import given
from hypothesis import strategies as st

from jobbers_celery import printable
from jobbers_django.templatetags.jobbers_text import (
    jobbers_ago,
    jobbers_iso,
    jobbers_name,
    jobbers_time,
)

AT = datetime(2026, 11, 27, 21, 33, 5, 120000, tzinfo=UTC)


def test_names_wrap_after_dots_underscores_and_at() -> None:
    assert jobbers_name("shop.rebuild_search_index") == "shop.<wbr>rebuild_<wbr>search_<wbr>index"
    assert jobbers_name("celery@batch-1") == "celery@<wbr>batch-1"
    assert jobbers_name("<b>x.y") == "&lt;b&gt;x.<wbr>y"
    assert jobbers_name(None) is None


@given(st.text(st.characters(codec=None, exclude_categories=()), max_size=200))
def test_a_name_is_its_escaped_printable_form_plus_break_points(name: str) -> None:
    shown = str(jobbers_name(name))
    assert shown.replace("<wbr>", "") == conditional_escape(printable(name))
    assert "<" not in shown.replace("<wbr>", "")  # nothing else is markup


def test_times_in_the_one_format() -> None:
    assert jobbers_time(AT) == "2026-11-27 21:33:05\u00a0UTC"
    assert jobbers_time(None) == "-"
    assert jobbers_iso(AT) == "2026-11-27T21:33:05.120Z"
    assert jobbers_ago(AT - timedelta(minutes=3), AT) == "3\u00a0min ago"
    assert jobbers_ago(AT + timedelta(seconds=45), AT) == "in 45\u00a0s"
