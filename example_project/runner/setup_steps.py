"""The setup steps of ``run.py``: Redis (``REDIS_URL``, a private ``redis-server`` or a
local one), the database (migrations, the admin user), then the workers, beat and the web
server, ready when each answers."""

from __future__ import annotations

import os
import secrets
import shutil
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from runner.errors import SetupError
from runner.processes import Proc, Processes, free_port, wait_until
from runner.scenario import IMPORTS_B, LONG_A, MAIN
from runner.ui import UI

#: Used when redis-server is not installed but a Redis answers on the standard port; a
#: database of its own keeps the example's queues apart from an application's on db 0.
LOCAL_REDIS = os.environ.get("EXAMPLE_FALLBACK_REDIS_URL", "redis://127.0.0.1:6379/15")


def _answers(url: str) -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=1).ping())
    except (redis.RedisError, OSError):
        return False


def start_redis(ui: UI, procs: Processes, notes: list[str]) -> tuple[str, Proc | None]:
    import redis

    url = os.environ.get("REDIS_URL", "").strip()
    if url:
        try:
            info = redis.Redis.from_url(url, socket_connect_timeout=3).info("server")
        except (redis.RedisError, ValueError) as exc:
            raise SetupError(
                f"REDIS_URL={url} does not answer ({exc}).\n"
                "Start that Redis, or unset REDIS_URL to let the example start its own "
                "redis-server.") from None
        notes.append(f"using REDIS_URL={url} (Redis {info.get('redis_version')}); keys under "
                     "'jobbers-example', queues celery, long, imports, jobbers")
        return url, None
    binary = shutil.which("redis-server")
    if binary is None and _answers(LOCAL_REDIS):
        # No redis-server to start, but one is reachable: use it, in a database of its own
        notes.append(f"redis-server is not installed; using the Redis that answers at "
                     f"{LOCAL_REDIS} (keys under 'jobbers-example'; REDIS_URL picks another)")
        return LOCAL_REDIS, None
    if binary is None:
        raise SetupError(
            "No Redis: REDIS_URL is not set and redis-server is not installed.\n"
            "Either install redis-server (the example then starts a private one):\n"
            "    sudo apt-get install redis-server        # Debian, Ubuntu\n"
            "    sudo dnf install redis                   # Fedora\n"
            "    brew install redis                       # macOS\n"
            "or point the example at a Redis you run:\n"
            "    docker run -d -p 6379:6379 redis:7\n"
            "    REDIS_URL=redis://127.0.0.1:6379/0 scripts/example")
    port = free_port()
    workdir = tempfile.mkdtemp(prefix="jobbers-example-redis-")
    proc = procs.start("redis-server", [binary, "--port", str(port), "--bind", "127.0.0.1",
                                        "--save", "", "--appendonly", "no", "--dir", workdir],
                       "redis.log")
    proc.workdir = workdir  # type: ignore[attr-defined]
    client = redis.Redis(port=port, socket_connect_timeout=1)

    def up() -> bool:
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False

    ui.status(f"waiting for redis-server on 127.0.0.1:{port}")
    wait_until("redis-server to answer", up, 15, procs)
    version = client.info("server").get("redis_version")
    client.close()
    notes.append(f"started a private redis-server {version} on 127.0.0.1:{port} (pid "
                 f"{proc.pid}); no persistence: its data goes when the example stops")
    return f"redis://127.0.0.1:{port}/0", proc


class MigrationProgress:
    """A file-like object for ``migrate``'s output that turns it into a progress line."""

    def __init__(self, ui: UI, total: int) -> None:
        self.ui = ui
        self.total = total
        self.done = 0

    def write(self, text: str) -> None:
        for line in text.splitlines():
            if line.strip().startswith("Applying "):
                self.done += 1
                name = line.strip()[len("Applying "):].split("...")[0]
                self.ui.status(f"applying migration {self.done}/{self.total}: {name}")

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


def migrate(ui: UI, notes: list[str]) -> None:
    from django.conf import settings
    from django.core.management import call_command
    from django.db import DatabaseError, connection
    from django.db.migrations.executor import MigrationExecutor

    db = settings.DATABASES["default"]
    where = (f"SQLite {db['NAME']}" if "sqlite" in db["ENGINE"] else
             f"PostgreSQL {db.get('USER') or ''}@{db.get('HOST') or 'localhost'}:"
             f"{db.get('PORT') or 5432}/{db['NAME']}")
    try:
        executor = MigrationExecutor(connection)
        plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
        progress = MigrationProgress(ui, len(plan))
        call_command("migrate", interactive=False, verbosity=1, stdout=progress)
    except DatabaseError as exc:
        raise SetupError(f"cannot use the database ({where}): {exc}\n"
                         "Check DATABASE_URL (postgres://user:password@host:port/dbname), "
                         "or unset it to use SQLite.") from None
    notes.append(f"database: {where}; " + (f"applied {len(plan)} migrations" if plan
                                           else "migrations already applied"))


def admin_user(var: Path, notes: list[str]) -> str:
    from django.contrib.auth import get_user_model

    password = os.environ.get("EXAMPLE_ADMIN_PASSWORD", "")
    saved = var / "admin-password"
    if not password and saved.exists():
        password = saved.read_text().strip()
    if not password:
        password = secrets.token_urlsafe(9)
    saved.write_text(password + "\n")
    saved.chmod(0o600)
    user_model = get_user_model()
    user, created = user_model.objects.get_or_create(
        username="admin", defaults={"email": "admin@example.invalid"})
    user.is_staff = user.is_superuser = user.is_active = True
    user.set_password(password)
    user.save()
    notes.append(f"{'created' if created else 'updated'} superuser 'admin' with password "
                 f"{password}  (kept in {saved}; EXAMPLE_ADMIN_PASSWORD sets another)")
    return password


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except (OSError, ValueError):
        return False


def start_services(ui: UI, procs: Processes, app: Any, jobbers: Any, port: int,
                   var: Path, notes: list[str]) -> dict[str, Proc]:
    workers = {
        MAIN: procs.worker(MAIN, "celery,jobbers", 4),
        LONG_A: procs.worker(LONG_A, "long", 1),
        IMPORTS_B: procs.worker(IMPORTS_B, "imports", 1),
    }
    beat = procs.celery("celery beat", ["beat", "-l", "INFO", "-s",
                                        str(var / "celerybeat-schedule")], "beat.log")
    web = procs.start("web server", [sys.executable, "manage.py", "runserver",
                                     f"127.0.0.1:{port}", "--noreload", "--skip-checks"],
                      "web.log")
    ready: dict[str, bool] = {}
    started = time.monotonic()
    before = jobbers.cleaner_status().last_run_at

    def check() -> bool:
        missing = [w for w in workers if not ready.get(w)]
        if missing:
            for reply in app.control.ping(destination=missing, timeout=0.3) or []:
                for name in reply:
                    ready[name] = True
        if not ready.get("web") and http_ok(f"http://127.0.0.1:{port}/admin/login/"):
            ready["web"] = True
        if not ready.get("beat"):
            last = jobbers.cleaner_status().last_run_at
            ready["beat"] = last is not None and last != before
        names = [*workers, "beat", "web"]
        shown = "  ".join(f"{n.split('@')[0]} {'✓' if ready.get(n) else '…'}" for n in names)
        ui.status(f"{shown}   ({time.monotonic() - started:.0f} s)")
        return all(ready.get(n) for n in names)

    wait_until("the workers, beat and the web server (logs: " + str(procs.log_dir) + ")",
               check, 90, procs, interval=0.2)
    notes.append(f"workers: {MAIN} (queue celery, 4 processes), {LONG_A} (queue long), "
                 f"{IMPORTS_B} (queue imports); pids {', '.join(str(w.pid) for w in workers.values())}")
    notes.append(f"celery beat (pid {beat.pid}): the jobbers cleaner every 1 s")
    notes.append(f"web server (pid {web.pid}): http://127.0.0.1:{port}/admin/")
    notes.append(f"logs: {procs.log_dir}/")
    return workers
