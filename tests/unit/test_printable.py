"""``jobbers_celery.core.printable``: what the command lines print of a publisher's values obeys
no terminal (controls, DEL, C1, bidi overrides, separators shown escaped), tells different
values apart, and costs time linear in the text."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import jobbers_celery
from jobbers_celery import escaped_logger, printable

#: Every code point a strategy may draw: controls, surrogates, private use, unassigned.
ANY_TEXT = st.text(st.characters(codec=None, exclude_categories=()))
BIDI = [chr(c) for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A))]


def unescape(shown: str) -> str:
    """The text :func:`printable` showed (its escapes are Python's)."""
    return shown.encode("latin-1", "backslashreplace").decode("unicode_escape")


def obeyed(text: str, newlines: bool = False) -> list[str]:
    """Characters a terminal would act on, or that reorder or hide text."""
    return [c for c in text if (not c.isprintable() and not (newlines and c == "\n"))
            or c in BIDI or 0x80 <= ord(c) <= 0x9F or ord(c) == 0x7F]


@given(ANY_TEXT)
def test_no_control_character_or_bidi_override_is_left(text: str) -> None:
    assert obeyed(printable(text)) == []
    assert obeyed(printable(text, newlines=True), newlines=True) == []


@given(ANY_TEXT)
def test_the_escape_is_lossless_so_two_values_never_look_alike(text: str) -> None:
    assert unescape(printable(text)) == text
    assert unescape(printable(text, newlines=True)) == text


@pytest.mark.parametrize(("raw", "shown"), [
    ("\x1b]0;pwned\x07", "\\x1b]0;pwned\\x07"),
    ("\x1b[2J", "\\x1b[2J"),
    ("ok\rforged", "ok\\rforged"),
    ("two\nlines", "two\\nlines"),
    ("tab\there", "tab\\there"),
    ("evil\u202etxt", "evil\\u202etxt"),
    ("\u2066iso\u2069", "\\u2066iso\\u2069"),
    ("\x7f\x9b", "\\x7f\\x9b"),
    ("lone \ud800", "lone \\ud800"),
    ("tag \U000e0041", "tag \\U000e0041"),
    ("C:\\temp", "C:\\\\temp"),  # a backslash is doubled: "\\x1b" typed is not ESC
    ("café 日本 ✓", "café 日本 ✓"),  # printable text is left alone
    ("", ""),
])
def test_examples(raw: str, shown: str) -> None:
    assert printable(raw) == shown


def test_a_traceback_block_keeps_its_lines_and_escapes_the_rest() -> None:
    assert printable("line 1\r\n  line 2\x1b[2J\n", newlines=True) == (
        "line 1\\r\n  line 2\\x1b[2J\n")


def test_hostile_text_costs_time_linear_in_its_size() -> None:
    # 200,000 characters each (1 MB: about 0.2 s, 0.7 s for every BMP code point mixed)
    for text in ("a\x1b" * 100_000, "\u202e" * 200_000, "日本\n" * 66_667):
        started = time.perf_counter()
        shown = printable(text)
        assert time.perf_counter() - started < 2.0  # quadratic would take minutes
        assert obeyed(shown) == []


def test_jobbers_log_lines_show_what_a_publisher_chose_escaped(
        caplog: pytest.LogCaptureFixture) -> None:
    """A task id with a newline forged a log line; a name with an escape sequence reached the
    terminal tailing the worker's log."""
    log = escaped_logger("jobbers.test-printable")
    with caplog.at_level(logging.INFO, logger="jobbers.test-printable"):
        log.warning("dead letter %s[%s] set aside: %s", "evil\x1b]0;pwned\x07",
                    "id\nFORGED LINE", "\u202eecnalab")
        log.info("plain %s[%d]", "proj.add", 3)
    shown = [r.getMessage() for r in caplog.records]
    assert shown == [("dead letter evil\\x1b]0;pwned\\x07[id\\nFORGED LINE] set aside: "
                      "\\u202eecnalab"), "plain proj.add[3]"]
    assert all(text.isprintable() for text in shown)


def test_every_jobbers_module_logs_through_the_escaping_logger() -> None:
    """metrics.py alone keeps a plain logger: it logs fixed text only, and imports nothing
    but the standard library and OpenTelemetry (test_metrics)."""
    root = Path(jobbers_celery.__file__).resolve().parents[1]
    plain = [path.relative_to(root).as_posix() for package in ("jobbers_celery", "jobbers_django")
             for path in (root / package).rglob("*.py")
             if 'getLogger("jobbers' in path.read_text()]
    assert plain == ["jobbers_celery/telemetry/metrics.py"]
