"""``jobbers_celery.core.timefmt``: the one time format. A person reads UTC to the second with
the zone written out; a script reads ISO 8601 UTC with milliseconds and ``Z``, which parses
back to the same moment; the relative form names the direction and its largest unit."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

from hypothesis import given
from hypothesis import strategies as st

from jobbers_celery import human_time, iso_time, relative_time
from jobbers_celery.core.timefmt import short_duration

AT = datetime(2026, 11, 27, 21, 33, 5, 120456, tzinfo=UTC)
AWARE = st.datetimes(min_value=datetime(1971, 1, 1), max_value=datetime(9998, 12, 31),
                     timezones=st.sampled_from([UTC, timezone(timedelta(hours=5, minutes=30)),
                                                timezone(timedelta(hours=-8))]))


def test_human_time_is_utc_to_the_second_with_the_zone() -> None:
    assert human_time(AT) == "2026-11-27 21:33:05 UTC"
    berlin = AT.astimezone(timezone(timedelta(hours=1)))
    assert human_time(berlin) == "2026-11-27 21:33:05 UTC"  # the same moment reads the same
    assert human_time(AT.replace(tzinfo=None)) == "2026-11-27 21:33:05 UTC"  # naive is UTC
    assert human_time(None) == "-"


def test_iso_time_is_utc_milliseconds_and_z() -> None:
    assert iso_time(AT) == "2026-11-27T21:33:05.120Z"
    assert iso_time(AT.astimezone(timezone(timedelta(hours=-8)))) == "2026-11-27T21:33:05.120Z"
    assert iso_time(None) is None


def test_relative_time_names_direction_and_largest_unit() -> None:
    assert relative_time(AT - timedelta(seconds=45), AT) == "45 s ago"
    assert relative_time(AT + timedelta(seconds=45), AT) == "in 45 s"
    assert relative_time(AT - timedelta(minutes=3, seconds=59), AT) == "3 min ago"
    assert relative_time(AT - timedelta(minutes=119), AT) == "119 min ago"
    assert relative_time(AT - timedelta(hours=5), AT) == "5 h ago"
    assert relative_time(AT + timedelta(days=12, hours=3), AT) == "in 12 d"
    assert relative_time(AT + timedelta(milliseconds=400), AT) == "now"
    assert relative_time(None, AT) == "-"


@given(AWARE)
def test_iso_time_parses_back_to_the_same_millisecond(value: datetime) -> None:
    text = iso_time(value)
    assert text is not None
    assert text.endswith("Z")
    assert len(text) == 24
    back = datetime.fromisoformat(text)
    assert back.tzinfo is not None
    assert back.utcoffset() == timedelta(0)
    assert abs(back - value) < timedelta(milliseconds=1)


@given(AWARE)
def test_human_time_has_one_shape_and_is_the_utc_moment(value: datetime) -> None:
    text = human_time(value)
    assert len(text) == len("2026-11-27 21:33:05 UTC")
    assert text.endswith(" UTC")
    back = datetime.strptime(text, "%Y-%m-%d %H:%M:%S UTC").replace(tzinfo=UTC)
    assert timedelta(0) <= value - back < timedelta(seconds=1)


@given(st.timedeltas(min_value=timedelta(days=-10**5), max_value=timedelta(days=10**5)))
def test_relative_time_is_bounded_and_signed(delta: timedelta) -> None:
    text = relative_time(AT + delta, AT)
    assert len(text) <= len("in 100000 d ago")
    if abs(delta) < timedelta(seconds=1):
        assert text == "now"
    else:
        assert text.startswith("in ") == (delta > timedelta(0))
        assert text.endswith(" ago") == (delta < timedelta(0))
        assert short_duration(delta) in text
