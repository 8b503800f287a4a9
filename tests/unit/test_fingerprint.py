"""Failure fingerprints (pure, no Django): one bug, one fingerprint; different bugs differ."""

from __future__ import annotations

import sys

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
