"""Plays a page's Python shell session in the venv the page made (standard library only).

Fed on standard input to the shell the page names (``python`` next to ``proj.py``, or
``python manage.py shell``), so the session sees exactly what the reader's shell sees. The
steps come from ``PYCON_STEPS`` (JSON, see tests/distribution/markdown.py); each example is compiled
in ``single`` mode like an interactive line (expression values are echoed) and its output
compared with the page's as doctest does, ``...`` standing for any text. A waiting step is
re-run every 0.2 s until it matches or ``PYCON_DEADLINE`` seconds pass. The first mismatch
ends the session; the outcome goes to ``PYCON_REPORT`` as JSON.
"""

from __future__ import annotations

import contextlib
import doctest
import io
import json
import os
import sys
import time
import traceback


def run_example(source: str, namespace: dict[str, object]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            exec(compile(source, "<stdin>", "single"), namespace)  # noqa: S102 (the page's line)
        except Exception:  # noqa: BLE001 (the session shows any error, as a shell does)
            exc_type, exc, _ = sys.exc_info()
            out.write("Traceback (most recent call last):\n  ...\n")
            out.write("".join(traceback.format_exception_only(exc_type, exc)))
    return out.getvalue()


def play() -> None:
    with open(os.environ["PYCON_STEPS"]) as f:
        steps = json.load(f)
    deadline_s = float(os.environ.get("PYCON_DEADLINE", "60"))
    checker = doctest.OutputChecker()
    flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    namespace: dict[str, object] = {"__name__": "__console__"}
    report: dict[str, object] = {"ok": True, "ran": 0}
    for step in steps:
        deadline = time.monotonic() + deadline_s
        tries = 0
        while True:
            tries += 1
            failed = None
            for ex in step["examples"]:
                got = run_example(ex["source"], namespace)
                if not checker.check_output(ex["want"], got, flags):
                    failed = {**ex, "got": got}
                    break
            if failed is None or not step["waits"] or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        if failed is not None:
            report.update(ok=False, failed=failed, tries=tries)
            break
        report["ran"] = int(report["ran"]) + len(step["examples"])  # type: ignore[call-overload]
    with open(os.environ["PYCON_REPORT"], "w") as f:
        json.dump(report, f)


play()
