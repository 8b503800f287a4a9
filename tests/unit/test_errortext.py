"""Exception text is cut to a known size before it is redacted or stored (issue 24): a task
that fails with a 1 MB message must not hand 1 MB to the redactor, the record, the history,
the dead letter and the fingerprint."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobbers_celery.core import errortext
from jobbers_celery.core.errortext import (
    MESSAGE_MAX_CHARS,
    REDACT_MARGIN,
    TRACEBACK_MAX_CHARS,
    TRACEBACK_PART_MAX_CHARS,
    cut_message,
    cut_traceback,
)
from jobbers_celery.deadletter import errors
from jobbers_celery.deadletter.entry import dead_letter_entry
from jobbers_celery.lifecycle import payload as pl
from jobbers_celery.lifecycle import recorder
from jobbers_celery.store import StepResult

MB = 1 << 20
#: The longest mark a cut adds (``... [cut: N characters in all]`` and the first line).
MARK = 80


def _raise_deep(message: str) -> BaseException:
    def innermost_frame() -> None:
        raise ValueError(message)

    try:
        innermost_frame()
    except ValueError as exc:
        return exc
    raise AssertionError("unreachable")


class _Watched:
    """A redactor that fails when given more than ``limit`` characters at once."""

    def __init__(self, limit: int) -> None:
        self.limit, self.sizes = limit, []  # type: tuple[int, list[int]]

    def text(self, text: str, known: Any = ()) -> str:
        assert len(text) <= self.limit, f"the redactor was given {len(text)} characters"
        self.sizes.append(len(text))
        return text


def test_the_redactor_sees_only_what_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    watched = _Watched(TRACEBACK_MAX_CHARS)
    monkeypatch.setattr(errors, "redactor", lambda: watched)  # describe_exception's home
    name, message, traceback = pl.describe_exception(_raise_deep("a." * (MB // 2)))
    assert name == "ValueError"
    assert message.startswith("a." * 100)
    assert message.endswith(f"... [cut: {MB} characters in all]")
    assert len(message) <= MESSAGE_MAX_CHARS + MARK
    assert len(traceback) <= TRACEBACK_MAX_CHARS + MARK
    assert "in innermost_frame\n" in traceback  # the frames before the huge message kept
    assert "ValueError: a.a.a." in traceback
    assert max(watched.sizes) <= MESSAGE_MAX_CHARS + REDACT_MARGIN


def test_record_and_dead_letter_keep_cut_text() -> None:
    exc = _raise_deep("y" * MB)
    err = pl.loads(recorder.error_fields(exc)["err"])
    assert err["message"] == f"{'y' * recorder.ERROR_MESSAGE_MAX_CHARS}... [cut: {MB} " \
                             "characters in all]"
    result = StepResult(applied=True, previous="started", now_ms=1_700_000_000_000, attempt=1)
    entry = dead_letter_entry(task_id="t", name="n", reason="failed", result=result,
                                       raw={}, exc=exc)
    assert entry.exception_message == f"{'y' * MESSAGE_MAX_CHARS}... [cut: {MB} characters " \
                                      "in all]"
    assert entry.traceback is not None
    assert len(entry.traceback) <= TRACEBACK_MAX_CHARS + MARK
    # a traceback Celery formatted (a lost pool child), and a reason given as the message
    long_tb = "Traceback (most recent call last):\n" + '  File "/a.py", line 1, in f\n' * 50_000
    entry = dead_letter_entry(task_id="t", name="n", reason="failed", result=result,
                                       raw={}, exc=exc, traceback=long_tb + "E: " + "z" * MB)
    assert entry.traceback is not None
    assert entry.traceback.startswith("[cut: the first ")
    assert len(entry.traceback) <= TRACEBACK_MAX_CHARS + MARK
    assert '  File "/a.py", line 1, in f\nE: zzz' in entry.traceback
    entry = dead_letter_entry(task_id="t", name="n", reason="stalled", result=result,
                                       raw={}, message="w" * MB)
    assert entry.exception_message is not None
    assert len(entry.exception_message) <= MESSAGE_MAX_CHARS + MARK


def test_a_secret_across_the_cut_is_redacted_whole() -> None:
    secret = "SECRET-VALUE-0123456789"

    def redact(text: str) -> str:
        return text.replace(secret, "[redacted]")

    for at in range(MESSAGE_MAX_CHARS - len(secret), MESSAGE_MAX_CHARS + 1):
        text = "x" * at + secret + "y" * MB
        out = cut_message(text, redact)
        assert "SECRET" not in out, at
        assert "0123" not in out, at
    frame = '  File "/srv/app/x.py", line 1, in f\n'
    part = "E: " + "x" * (TRACEBACK_PART_MAX_CHARS - 10) + secret + "\n"
    assert "SECRET" not in cut_traceback([frame] * 3000 + [part], redact)


def test_an_ordinary_traceback_is_kept_whole() -> None:
    exc = _raise_deep("bad row 17")
    _, message, traceback = pl.describe_exception(exc)
    assert message == "bad row 17"
    import traceback as tb

    assert traceback == "".join(tb.format_exception(type(exc), exc, exc.__traceback__))


_TEXT = st.lists(st.sampled_from(["a", ".", " ", "\n", "é", "x" * 1000, "\n" * 50,
                                  '  File "/a.py", line 1, in f\n']),
                 max_size=300).map("".join)


@settings(max_examples=100)
@given(_TEXT, st.integers(0, 2 * MESSAGE_MAX_CHARS))
def test_cut_sizes(text: str, pad: int) -> None:
    text = "m" * pad + text
    message = cut_message(text)
    assert len(message) <= MESSAGE_MAX_CHARS + MARK
    assert message.startswith(text[:MESSAGE_MAX_CHARS])
    assert (message == text) == (len(text) <= MESSAGE_MAX_CHARS)
    traceback = cut_traceback(text * 3)
    assert len(traceback) <= TRACEBACK_MAX_CHARS + (MARK + 1) * (
        TRACEBACK_MAX_CHARS // TRACEBACK_PART_MAX_CHARS + 2)
    last = (text * 3).splitlines(keepends=True)[-1:] or [""]
    if len(last[0]) <= TRACEBACK_PART_MAX_CHARS:
        assert traceback.endswith(last[0])


def test_cut_traceback_is_linear_in_its_parts() -> None:
    """1 MB of one-character lines and 1 MB in one line: each kept part read once."""
    seen: list[int] = []

    def redact(text: str) -> str:
        seen.append(len(text))
        return text

    assert len(cut_traceback("\n" * MB, redact)) <= TRACEBACK_MAX_CHARS + MARK
    assert sum(seen) <= TRACEBACK_MAX_CHARS
    seen.clear()
    assert len(cut_traceback("q" * MB, redact)) <= TRACEBACK_PART_MAX_CHARS + MARK
    assert seen == [TRACEBACK_PART_MAX_CHARS + REDACT_MARGIN]
    assert errortext.cut_head("abc", 2) == "ab... [cut: 3 characters in all]"


def test_chained_grouped_and_noted_messages_are_cut_before_formatting() -> None:
    big = "\n" * MB
    try:
        try:
            raise KeyError(big)
        except KeyError as inner:
            raise ExceptionGroup("g" * MB, [ValueError(big), TypeError(big)]) from inner
    except ExceptionGroup as exc:
        for _ in range(1000):
            exc.add_note(big)
        parts = errortext.exception_parts(exc)
        _, message, traceback = pl.describe_exception(exc)
    assert sum(len(p) for p in parts) < 200 * (TRACEBACK_PART_MAX_CHARS + REDACT_MARGIN)
    assert len(message) <= MESSAGE_MAX_CHARS + MARK
    assert len(traceback) <= TRACEBACK_MAX_CHARS + MARK
    # chained only: the innermost frame and the error come last, and are kept
    try:
        try:
            raise KeyError(big)
        except KeyError as inner:
            raise _raise_deep(big) from inner
    except ValueError as exc:
        _, _, traceback = pl.describe_exception(exc)
    assert len(traceback) <= TRACEBACK_MAX_CHARS + MARK
    assert "in innermost_frame\n" in traceback
    assert traceback.endswith("... [cut]\n")
