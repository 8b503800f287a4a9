"""The example project (``example_project/``, run by ``scripts/example``).

``manage.py check`` passes, ``DATABASE_URL`` is understood, and the whole scenario runs end
to end headless (``run.py --no-serve``): its own private redis-server, real workers, beat
and web server, every task in its expected final state, the dead letters in the database,
exit status 0 and nothing it started left running. SQLite, logs and the beat schedule go to
a temporary directory, so the repository stays clean.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, free_port, subprocess_env

EXAMPLE = ROOT / "example_project"

pytestmark = [pytest.mark.worker, pytest.mark.timeout(150)]

#: label of each scenario row -> the state it must end in
EXPECTED = {
    "success": "completed",
    "retry+backoff": "completed",
    "retries run out": "failed",
    "bug": "failed",
    "same bug": "failed",
    "freeze": "stalled",
    "cancel": "cancelled",
    "version": "dropped",
    "SIGTERM": "completed",
    "SIGKILL": "completed",
    "max_concurrent 1": "completed",
    "max_concurrent 2": "completed",
    "max_concurrent 3": "completed",
}


def example_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """No Redis and no database given: the example starts its own Redis, uses SQLite."""
    env = subprocess_env({"EXAMPLE_VAR_DIR": str(tmp_path / "var"), "REDIS_URL": "",
                          "NO_COLOR": "1", **extra})
    if "DATABASE_URL" not in extra:
        env.pop("DATABASE_URL", None)
    return env


def alive_in(pids: set[int]) -> list[str]:
    """Processes that are one of ``pids`` or in a process group led by one of them."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        pid, pgid = int(stat.parent.name), int(fields[2])
        if fields[0] != "Z" and (pid in pids or pgid in pids):
            cmdline = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            found.append(f"{pid} (group {pgid}): {cmdline.strip()}")
    return found


def test_manage_py_check(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--fail-level", "WARNING"], cwd=EXAMPLE,
        env=example_env(tmp_path), capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues" in result.stdout


@pytest.mark.parametrize(("url", "expected"), [
    ("postgres://shop:s%40cret@db.internal:6543/shop?sslmode=require", {
        "ENGINE": "django.db.backends.postgresql", "NAME": "shop", "USER": "shop",
        "PASSWORD": "s@cret", "HOST": "db.internal", "PORT": "6543",
        "OPTIONS": {"sslmode": "require"}}),
    ("postgresql://postgres@127.0.0.1/jobbers_example", {
        "ENGINE": "django.db.backends.postgresql", "NAME": "jobbers_example",
        "USER": "postgres", "PASSWORD": "", "HOST": "127.0.0.1", "PORT": "", "OPTIONS": {}}),
    ("sqlite:////srv/shop/db.sqlite3", {
        "ENGINE": "django.db.backends.sqlite3", "NAME": "/srv/shop/db.sqlite3"}),
])
def test_database_url(tmp_path: Path, url: str, expected: dict[str, Any]) -> None:
    code = ("import json; from example import settings; "
            "print(json.dumps(settings.DATABASES['default']))")
    result = subprocess.run([sys.executable, "-c", code], cwd=EXAMPLE,
                            env=example_env(tmp_path, DATABASE_URL=url), capture_output=True,
                            text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    db = json.loads(result.stdout)
    assert {k: db.get(k) for k in expected} == expected


def test_database_url_refuses_unknown_schemes(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=EXAMPLE,
        env=example_env(tmp_path, DATABASE_URL="mysql://root@localhost/shop"),
        capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode != 0
    assert "DATABASE_URL must start with postgres:// or sqlite://" in result.stderr


def test_scenario_end_to_end(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "run.py", "--no-serve", "--timeout", "45", "--port", str(free_port()),
         "--var-dir", str(tmp_path / "var"), "--report", str(report)],
        cwd=EXAMPLE, env=example_env(tmp_path), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True)
    pids: set[int] = set()
    try:
        try:
            output, _ = proc.communicate(timeout=110)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)  # it stops what it started, then exits
            output, _ = proc.communicate(timeout=30)
            pytest.fail(f"the example did not finish in time:\n{output}")
        elapsed = time.monotonic() - started
        data = json.loads(report.read_text())
        pids = {p["pid"] for p in data["processes"]}
        assert proc.returncode == 0, output
        assert data["ok"], output
        assert data["exit_status"] == 0

        states = {t["label"]: t["state"] for t in data["tasks"]}
        assert states == EXPECTED, output
        assert {t["label"]: t["problems"] for t in data["tasks"] if t["problems"]} == {}

        by_label = {t["label"]: t for t in data["tasks"]}
        for label in ("SIGTERM", "SIGKILL"):  # resumed on the new worker from a checkpoint
            task = by_label[label]
            assert task["worker"] == "long-c@example"
            assert task["attempt"] == 2
            assert task["progress"]["resumed_from"] >= 3
        moves = [(a, b) for a, b, _ in by_label["SIGTERM"]["transitions"]]
        assert ("started", "unsubmitted") in moves
        moves = [(a, b) for a, b, _ in by_label["SIGKILL"]["transitions"]]
        assert ("started", "stalled") in moves
        assert ("stalled", "submitted") in moves

        dead = sorted((e["task_name"], e["reason"]) for e in data["dead_letters"])
        assert dead == [
            ("shop.import_supplier_feed", "failed"), ("shop.import_supplier_feed", "failed"),
            ("shop.recalculate_prices", "dropped"), ("shop.render_invoice_pdf", "stalled"),
            ("shop.sync_inventory", "failed"),
        ]
        feeds = {e["fingerprint"] for e in data["dead_letters"]
                 if e["task_name"] == "shop.import_supplier_feed"}
        assert len(feeds) == 1, "the same bug on two feeds must make one failure group"

        # what a person reads
        for text in ("[1/6] Environment", "private redis-server", "superuser 'admin'",
                     "/admin/", "Every task took its path", "curl -u admin:",
                     "stopped redis-server"):
            assert text in output, text
        assert (tmp_path / "var" / "db.sqlite3").exists()
        assert (tmp_path / "var" / "logs" / "worker-main.log").exists()
        assert elapsed < 60, f"the scenario took {elapsed:.0f} s"
        assert len(pids) == 7  # redis, 3 workers + the replacement, beat, web server
    finally:
        if not pids and report.exists():
            with contextlib.suppress(ValueError, KeyError):
                pids = {p["pid"] for p in json.loads(report.read_text())["processes"]}
        left = alive_in(pids | {proc.pid})
        for pid in pids | {proc.pid}:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
    assert left == [], "left running:\n" + "\n".join(left)


@pytest.mark.parametrize(("env", "says"), [
    # no redis-server, and no Redis answering where the example would look for one
    ({"PATH": "/nonexistent",
      "EXAMPLE_FALLBACK_REDIS_URL": f"redis://127.0.0.1:{free_port()}/15"},
     "sudo apt-get install redis-server"),
    ({"REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}, "does not answer"),
])
def test_without_redis_it_says_how_to_get_one(tmp_path: Path, env: dict[str, str],
                                              says: str) -> None:
    report = tmp_path / "report.json"
    result = subprocess.run(
        [sys.executable, "run.py", "--no-serve", "--var-dir", str(tmp_path / "var"),
         "--report", str(report)], cwd=EXAMPLE, env=example_env(tmp_path, **env),
        capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2, result.stdout + result.stderr
    assert says in result.stdout
    assert json.loads(report.read_text())["processes"] == []
