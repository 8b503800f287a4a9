"""Take the screenshots of docs/howto/dlq-admin.md: the jobbers admin with demo data.

Rerun from the repository root after changing the admin's pages:

    apt-get install -y chromium chromium-driver redis-server   # Debian
    .venv/bin/pip install selenium      # for this script only, not a project dependency
    .venv/bin/python scripts/admin_screenshots.py [--keep]

It starts a private redis-server and ``runserver`` (the settings of the jobbers_django tests,
``tests/django/settings.py``, on a fresh SQLite database in a temporary directory) on free
ports, writes demo dead letters through the Django sink and demo task records into Redis,
logs in as a superuser in headless Chromium and saves ``docs/img/admin-*.png``. ``--keep``
leaves the server running (prints its URL, user ``demo``, password ``demo``) until Ctrl-C,
to look around.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "img"
WIDTH = 1600
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--hide-scrollbars"]

TRACEBACK = """Traceback (most recent call last):
  File "/srv/shop/.venv/lib/python3.11/site-packages/celery/app/trace.py", line 453, in trace_task
    R = retval = fun(*args, **kwargs)
  File "/srv/shop/shop/tasks.py", line 88, in {task}
    {call}
  File "/srv/shop/shop/{module}.py", line 41, in {function}
    raise {exception}(...)
{exception}: {message}
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(check: Any, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.1)


# ---------------------------------------------------------------------- demo data
def seed_dead_letters() -> str:
    """Dead letters of four tasks, some with several failures; returns the task id whose
    detail page is shown (three failures, a lifecycle in Redis)."""
    from jobbers_celery import DeadLetter
    from jobbers_django import services
    from jobbers_django.sink import write_entry

    now = datetime.now(UTC).replace(microsecond=0)

    def letter(name: str, n: int, **over: Any) -> DeadLetter:
        values: dict[str, Any] = {
            "task_id": str(uuid.uuid4()), "name": name, "version": 2, "queue": "imports",
            "reason": "failed", "args": [f"https://supplier-{n % 3}.example.com/feed.xml"],
            "kwargs": {"supplier_id": 40 + n % 3, "api_key": "sk_live_51HxYdemo"},
            "exception_type": "shop.tasks.SupplierTimeout",
            "exception_message": f"supplier-{n % 3}.example.com did not answer within 30s",
            "traceback": None, "attempt": 4, "retry_attempt": 3, "worker": "celery@web-2",
            "failed_at": now - timedelta(minutes=7 * n), "checkpoint": {"row": 1200 + n},
            "options": {"queue": "imports", "headers": {"Authorization": "Bearer demo"}},
        }
        values.update(over)
        if values["traceback"] is None and values["exception_type"]:
            payment = name == "shop.charge_payment"
            values["traceback"] = TRACEBACK.format(
                task=name.split(".")[1], exception=values["exception_type"],
                call="gateway.charge(order_id)" if payment else "supplier.fetch(url)",
                module="payments" if payment else "suppliers",
                function="charge" if payment else "fetch", message=values["exception_message"])
        return DeadLetter(**values)

    for n in range(14):
        write_entry(letter("shop.import_catalog", n))
    for n in range(6):
        write_entry(letter(
            "shop.charge_payment", n, version=1, queue="payments", args=[91800 + n],
            kwargs={"order_id": 91800 + n, "card_token": "tok_demo"},
            exception_type="shop.tasks.PaymentGatewayBusy",
            exception_message=f"503 from the payment gateway for order {91800 + n}",
            checkpoint=None, options={"queue": "payments"},
            failed_at=now - timedelta(minutes=11 * n + 3)))
    for n in range(3):
        write_entry(letter(
            "shop.sync_inventory", n, version=1, queue="celery", reason="stalled",
            exception_type=None, exception_message="no heartbeat for 64s (limit 60s)",
            traceback="", worker="celery@batch-1", kwargs={"warehouse": "north"},
            failed_at=now - timedelta(hours=2, minutes=n)))
    for n in range(2):
        write_entry(letter(
            "shop.send_newsletter", n, version=3, queue="mail", reason="dropped",
            exception_type=None, exception_message="no worker runs shop.send_newsletter "
            "version 3 (workers have version 2)", traceback="", worker="celery@mail-1",
            kwargs={"issue": 42}, failed_at=now - timedelta(hours=5, minutes=n)))

    # one task that stalled two days ago, was resubmitted, then failed again after a retry
    shown = letter("shop.import_catalog", 1, attempt=1, retry_attempt=0, reason="stalled",
                   exception_type=None, traceback="", worker="celery@web-1",
                   exception_message="worker celery@web-1 lost (no sign of life for 61s)",
                   failed_at=now - timedelta(days=2))
    write_entry(shown)
    write_entry(letter("shop.import_catalog", 1, task_id=shown.task_id, attempt=3,
                       retry_attempt=1, failed_at=now - timedelta(minutes=2)))

    payments = services.Selection(filters={"task_name": "shop.charge_payment"}, limit=2)
    services.discard(payments)
    return shown.task_id


def seed_records(jobbers: Any, shown: str) -> None:
    """Task records in Redis: the shown entry's lifecycle, running, stalled, scheduled."""
    from jobbers_celery import TaskState as S

    store = jobbers.store

    def create(task_id: str, name: str, queue: str) -> None:
        store.step(task_id, S.SUBMITTED, sources=(S.UNSUBMITTED,), name=name,
                   create={"name": name, "queue": queue, "ver": "2"},
                   set_fields={"msg": json.dumps({"args": [], "kwargs": {}, "options": {}}),
                               "retries": "0"}, reason="published")

    def error(kind: str, message: str) -> dict[str, str]:
        return {"err": json.dumps({"type": kind, "message": message})}

    timeout = ("shop.tasks.SupplierTimeout",
               "supplier-1.example.com did not answer within 30s")
    create(shown, "shop.import_catalog", "imports")
    store.step(shown, S.STARTED, start=True, worker="celery@web-1")
    store.step(shown, S.STALLED, reason="worker celery@web-1 lost")
    store.step(shown, S.SUBMITTED, reason="resubmitted from the dead-letter queue")
    store.step(shown, S.STARTED, start=True, worker="celery@web-2")
    store.step(shown, S.SCHEDULED, delay_ms=0, set_fields={**error(*timeout), "retries": "1"},
               reason="SupplierTimeout, retry 1 of 1 in 10s")
    store.step(shown, S.SUBMITTED, reason="run_at reached")
    store.step(shown, S.STARTED, start=True, worker="celery@web-2")
    store.step(shown, S.FAILED, set_fields=error(*timeout), reason="retries exhausted")

    for n, (name, progress) in enumerate([
        ("shop.import_catalog", {"rows": 48_200, "of": 120_000, "supplier_token": "x"}),
        ("shop.import_catalog", {"rows": 3_100, "of": 9_800}),
        ("shop.rebuild_search_index", {"shard": 7, "of": 12}),
    ]):
        task_id = str(uuid.uuid4())
        create(task_id, name, "imports")
        started = store.step(task_id, S.STARTED, start=True, worker=f"celery@batch-{n + 1}")
        store.heartbeat(task_id, started.attempt, progress=json.dumps(progress), name=name)
    from jobbers_django.models import DeadLetterEntry

    for task_id in DeadLetterEntry.objects.filter(reason="stalled", task_name="shop.sync_inventory"
                                                  ).values_list("task_id", flat=True)[:2]:
        create(task_id, "shop.sync_inventory", "celery")
        store.step(task_id, S.STARTED, start=True, worker="celery@batch-1")
        store.step(task_id, S.STALLED, set_fields=error(
            "jobbers.Stalled", "no heartbeat for 64s (limit 60s)"), reason="heartbeat silent")
    for n, delay in enumerate((45_000, 300_000, 1_800_000)):
        task_id = str(uuid.uuid4())
        create(task_id, "shop.charge_payment", "payments")
        store.step(task_id, S.STARTED, start=True, worker="celery@web-2")
        store.step(task_id, S.SCHEDULED, delay_ms=delay, set_fields={**error(
            "shop.tasks.PaymentGatewayBusy", f"503 from the payment gateway for order {n}"),
            "retries": "1"}, reason="PaymentGatewayBusy, retry 1 of 4")


# ---------------------------------------------------------------------- browser
def browser() -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tempfile.mkdtemp(prefix='jobbers-chromium-')}")
    options.add_argument(f"--window-size={WIDTH},900")
    service = Service(shutil.which("chromedriver") or "/usr/bin/chromedriver")
    return webdriver.Chrome(options=options, service=service)


def shoot(driver: Any, name: str, max_height: int = 2400) -> None:
    for _ in range(3):  # the window's inner height is less than its size: grow until it fits
        height = driver.execute_script("return document.documentElement.scrollHeight")
        inner = driver.execute_script("return window.innerHeight")
        if inner >= min(height, max_height):
            break
        size = driver.get_window_size()
        driver.set_window_size(WIDTH, min(size["height"] + height - inner, max_height + 200))
        time.sleep(0.3)  # let the resized page lay out before the capture
    path = OUT / f"admin-{name}.png"
    driver.save_screenshot(str(path))
    driver.set_window_size(WIDTH, 900)
    print("wrote", path.relative_to(ROOT))


def take(base: str, shown_pk: int, before_live: Any) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    driver = browser()
    try:
        driver.get(f"{base}/admin/login/")
        driver.find_element(By.NAME, "username").send_keys("demo")
        driver.find_element(By.NAME, "password").send_keys("demo")
        driver.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
        driver.execute_script(  # more room for the tables: the app list folded away
            "localStorage.setItem('django.admin.navSidebarIsOpen', 'false')")

        driver.get(f"{base}/admin/jobbers/deadletterentry/?status=dead")
        shoot(driver, "changelist", max_height=1500)
        driver.get(f"{base}/admin/jobbers/failuregroup/")
        shoot(driver, "groups")
        driver.get(f"{base}/admin/jobbers/deadletterentry/{shown_pk}/change/")
        shoot(driver, "detail", max_height=3000)

        driver.get(f"{base}/admin/jobbers/deadletterentry/?task_name=shop.import_catalog")
        driver.find_element(By.ID, "action-toggle").click()
        Select(driver.find_element(By.NAME, "action")).select_by_value("resubmit_selected")
        driver.find_element(By.CSS_SELECTOR, "button[name=index]").click()
        shoot(driver, "resubmit-confirmation")

        before_live()
        driver.get(f"{base}/admin/jobbers/deadletterentry/live/")
        shoot(driver, "live")
    finally:
        driver.quit()


def main() -> None:
    keep = "--keep" in sys.argv[1:]
    tmp = Path(tempfile.mkdtemp(prefix="jobbers-screens-"))
    redis_port, web_port = free_port(), free_port()
    redis_proc = subprocess.Popen(
        [shutil.which("redis-server") or "redis-server", "--port", str(redis_port),
         "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(tmp)],
        stdout=subprocess.DEVNULL)
    # the Django settings and Celery app of the jobbers_django tests, on SQLite
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.django.settings",
           "JOBBERS_TEST_DATABASE": "sqlite", "JOBBERS_TEST_DB_NAME": str(tmp / "db.sqlite3"),
           "JOBBERS_TEST_REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
           "PYTHONPATH": str(ROOT)}
    os.environ.update(env)
    sys.path.insert(0, str(ROOT))
    server = None
    try:
        wait_for(lambda: socket.create_connection(("127.0.0.1", redis_port)).close() or True,
                 "redis-server")
        import django

        django.setup()
        from django.contrib.auth import get_user_model
        from django.core.management import call_command

        from jobbers_django import services
        from jobbers_django.models import DeadLetterEntry

        call_command("migrate", verbosity=0)
        get_user_model().objects.create_superuser("demo", "demo@example.com", "demo")
        jobbers = services.get_jobbers()
        shown = seed_dead_letters()
        seed_records(jobbers, shown)
        shown_pk = DeadLetterEntry.objects.get(task_id=shown).pk

        server = subprocess.Popen(  # --insecure: serve the admin's static files, DEBUG off
            [sys.executable, "-m", "django", "runserver", "--noreload", "--insecure",
             f"127.0.0.1:{web_port}"], env=env, cwd=ROOT,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        base = f"http://127.0.0.1:{web_port}"
        wait_for(lambda: urllib.request.urlopen(f"{base}/admin/login/").status == 200,
                 "runserver")
        take(base, shown_pk, before_live=jobbers.clean)  # a fresh pass: not overdue
        if keep:
            print(f"{base}/admin/ (demo / demo); Ctrl-C stops it")
            server.wait()
    except KeyboardInterrupt:
        pass
    finally:
        for proc in (server, redis_proc):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                proc.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
