"""Failure fingerprints (pure, no Django): one bug, one fingerprint; different bugs differ."""

from __future__ import annotations

import re
import sys

from hypothesis import given, settings
from hypothesis import strategies as st

from jobbers_django import fingerprint as fpmod
from jobbers_django import frames
from jobbers_django.fingerprint import app_frame, fingerprint, normalise_message


def _tb(*frames: tuple[str, str]) -> str:
    lines = ["Traceback (most recent call last):"]
    for path, func in frames:
        lines += [f'  File "{path}", line 10, in {func}', "    code()"]
    return "\n".join([*lines, "ValueError: boom"])


SITE = f"{sys.prefix}/lib/python3.11/site-packages"


def test_ids_and_numbers_are_taken_out():
    assert normalise_message(
        "order 12345 for user 5f0c7a1e-1b2c-4d3e-8f90-0123456789ab failed after 3.5s "
        "(object at 0x7f3a2b1c, hash deadbeef42, mail ann@example.com)"
    ) == ("order <n> for user <uuid> failed after <n>s (object at <hex>, hash <hex>, "
          "mail <email>)")


def test_stalls_on_different_workers_are_one_failure():
    a = normalise_message("worker imports-b@example:1887:7c194b last seen 2026-11-22T02:15:55Z, "
                          "no heartbeat for 2.4s")
    b = normalise_message("worker main@host:2001:a9f0e1 last seen 2026-11-23T11:01:02Z, "
                          "no heartbeat for 61.0s")
    assert a == b == "worker <worker> last seen <n>-<n>-<n>T<n>Z, no heartbeat for <n>s"
    assert normalise_message("on w1@host.example.com") == normalise_message("on w2@host.example.com")


def test_innermost_application_frame():
    tb = _tb((f"{SITE}/celery/app/trace.py", "trace_task"),
             ("/srv/app/shop/imports.py", "import_catalog"),
             ("/srv/app/shop/parsing.py", "parse_row"),
             (f"{SITE}/requests/api.py", "get"),
             ("/usr/lib/python3.11/json/decoder.py", "decode"))
    frame = app_frame(tb)
    assert frame.endswith("shop/parsing.py:parse_row")
    assert app_frame(_tb((f"{SITE}/celery/app/trace.py", "trace_task"))) == ""
    assert app_frame(None) == ""


def test_one_bug_one_fingerprint_across_hosts_lines_and_ids():
    a = fingerprint("shop.import", "builtins.ValueError", "bad row 17 in batch 9",
                    _tb(("/srv/app/shop/parsing.py", "parse_row")))
    b = fingerprint("shop.import", "builtins.ValueError", "bad row 4711 in batch 2",
                    _tb(("/srv/app/shop/parsing.py", "parse_row")).replace("line 10", "line 99"))
    assert a.value == b.value
    assert a.message == "bad row <n> in batch <n>"


def test_different_bugs_differ():
    base = ("shop.import", "builtins.ValueError", "bad row 1",
            _tb(("/srv/app/shop/parsing.py", "parse_row")))
    variants = [
        ("shop.export", *base[1:]),
        (base[0], "builtins.KeyError", *base[2:]),
        (*base[:2], "missing column 1", base[3]),
        (*base[:3], _tb(("/srv/app/shop/parsing.py", "parse_header"))),
    ]
    values = {fingerprint(*v).value for v in [base, *variants]}
    assert len(values) == 5


# -- bounded whatever the failure says (issue 24) ------------------------------------------

#: Texts each pattern was weak to: quadratic on main (a 32 KB ``a.a.a.`` took 15 s).
ADVERSARIAL = {
    "a.a.a.": "a.", "digits.": "1.", "a@a.": "a@" + "a." * 100 + " ", "spaces": " ",
    "hex": "a1", "hexdash": "aaaaaaaa-", "a.@": "a." * 60 + "@", "quotes": '"', "0x": "0x",
}
MB = 1 << 20


class _Seen:
    """A compiled pattern that fails as soon as it is given a text over ``limit`` (before
    running on it: on main that took hours) and counts its calls."""

    def __init__(self, pattern: re.Pattern[str], limit: int, calls: list[int]) -> None:
        self.pattern, self.limit, self.calls = pattern, limit, calls

    def _see(self, text: str) -> str:
        assert len(text) <= self.limit, f"a pattern was given {len(text)} characters"
        self.calls.append(len(text))
        return text

    def sub(self, repl: str, text: str) -> str:
        return self.pattern.sub(repl, self._see(text))

    def match(self, text: str) -> re.Match[str] | None:
        return self.pattern.match(self._see(text))


def _repeat(unit: str, size: int) -> str:
    return (unit * (size // len(unit) + 1))[:size]


def test_message_patterns_read_only_the_head(monkeypatch):
    lengths: list[int] = []
    monkeypatch.setattr(fpmod, "_SUBSTITUTIONS", tuple(
        (_Seen(p, 4096, lengths), r) for p, r in fpmod._SUBSTITUTIONS))
    for unit in ADVERSARIAL.values():
        message = _repeat(unit, MB)
        assert fpmod.normalise_message(message) == fpmod.normalise_message(
            message[:fpmod.MESSAGE_HEAD])
    assert lengths
    assert fpmod.MESSAGE_HEAD == 4096


def test_frame_pattern_reads_bounded_lines_from_the_end(monkeypatch):
    lengths: list[int] = []
    monkeypatch.setattr(frames, "_FRAME", _Seen(frames._FRAME, 8192, lengths))
    app = '  File "/srv/app/shop/parsing.py", line 3, in parse_row\n'
    long_line = '  File "/srv/app/x.py", line 1, in ' + " " * MB + "f\n"
    many = '  File "/usr/lib/python3.11/json/decoder.py", line 1, in decode\n' * 30_000
    assert fpmod.app_frame(app + long_line + many) == ""  # the app frame is too far up
    assert fpmod.FRAME_LINE_MAX == 8192
    assert len(lengths) <= fpmod.FRAME_LINES
    # innermost frames last, a huge message after them: still found, from the end
    lengths.clear()
    tb = app + long_line + "ValueError: " + _repeat("a.", MB)
    assert fpmod.app_frame(tb).endswith("shop/parsing.py:parse_row")


def test_frame_is_cut_and_its_trailing_spaces_dropped():
    assert fpmod.app_frame('  File "/srv/app/x.py", line 1, in run' + " " * 5000) \
        .endswith("x.py:run")
    frame = fpmod.app_frame('  File "/srv/app/x.py", line 1, in ' + " " * 5000 + "f")
    assert len(frame) == fpmod.FRAME_MAX


#: main's patterns, before they were bounded: the reference for ordinary messages.
_OLD = (
    (r"[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}",
     "<uuid>"),
    (r"\b[\w.+-]+@[\w.-]+:\d+:[0-9a-zA-Z]+", "<worker>"),
    (r"\b[\w.+-]+@[\w-]+(?:\.[\w-]+)+\b", "<email>"),
    (r"\b[\w.+-]+@[\w.-]+", "<worker>"),
    (r"\b0x[0-9a-fA-F]+\b", "<hex>"),
    (r"\b(?=[0-9a-fA-F]*\d)(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{8,}\b", "<hex>"),
    (r"\d+(?:[.,:]\d+)*", "<n>"),
    (r"\s+", " "),
)


def _old_normalise(message: str) -> str:
    for pattern, placeholder in _OLD:
        message = re.sub(pattern, placeholder, message)
    return message.strip()[:500]


#: What failure messages are made of, the characters the patterns turn on weighted up.
_MESSAGE_TEXT = st.lists(
    st.sampled_from([*"abcdefxyzABF0123456789.,:;-_+@ \t\n\"'()/<>=\u00e9", "0x",
                     "user@host", "@example.com", "5f0c7a1e-1b2c-4d3e-8f90-0123456789ab"]),
    max_size=400).map("".join)


@settings(max_examples=300)
@given(_MESSAGE_TEXT.map(lambda m: re.sub("['\"]|://", "", m)))
def test_ordinary_messages_group_as_before(message):
    """A guard, not a fix: messages of ordinary length without a quoted value or a URL
    normalise as main did (those two: tests/unit/test_fingerprint_grouping.py)."""
    assert fpmod.normalise_message(message) == _old_normalise(message)


@settings(max_examples=60)
@given(st.sampled_from(sorted(ADVERSARIAL)), st.integers(0, 64), _MESSAGE_TEXT)
def test_the_message_kept_depends_only_on_its_head(kind, kb, tail):
    message = _repeat(ADVERSARIAL[kind], fpmod.MESSAGE_HEAD + kb * 1024) + tail
    norm = fpmod.normalise_message(message)
    assert len(norm) <= 500
    assert norm == fpmod.normalise_message(message[:fpmod.MESSAGE_HEAD] + "x" * len(tail))
