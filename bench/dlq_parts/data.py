"""The scenario: 50 task names (10 modules x 5 functions) of Zipf-like popularity, a past
incident that left 25 % of all entries, two task names that stopped failing, and 40 kinds
of failure per task name (2,000 in all) with realistic messages and tracebacks, each with
the fingerprint ``jobbers_django`` gives it."""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass
from typing import Any

DAYS = 30
SEED = 20261122
MODULES = ("shop.imports", "billing.invoices", "mail.outbox", "search.indexer",
           "media.thumbnails", "reports.daily", "crm.sync", "inventory.stock",
           "payments.webhooks", "analytics.events")
FUNCS = ("sync_batch", "send_one", "rebuild", "fetch_url", "process_row")
QUEUES = ("celery", "io", "reports", "mail", "media")
HELPERS = ("_load_page", "_post", "_parse_row", "_write_rows", "_render", "_lookup",
           "_upload", "_notify")
#: (exception type, message template, library frame it is raised in). ``{n}``: a number,
#: ``{uuid}``: a uuid, both varying per entry (the fingerprint takes them out).
FAILURES = (
    ("builtins.ValueError", "upstream rejected row {n} of catalog-{n}", None),
    ("requests.exceptions.ConnectionError",
     ("HTTPSConnectionPool(host='api.partner.example', port=443): Max retries exceeded with "
      "url: /v2/items/{n} (Caused by NewConnectionError('Failed to establish a new "
      "connection: [Errno 111] Connection refused'))"),
     ("requests/adapters.py", 700, "send", "raise ConnectionError(e, request=request)")),
    ("requests.exceptions.HTTPError",
     "502 Server Error: Bad Gateway for url: https://api.partner.example/v2/orders/{uuid}",
     ("requests/models.py", 1024, "raise_for_status",
      "raise HTTPError(http_error_msg, response=self)")),
    ("django.db.utils.OperationalError",
     "could not serialize access due to concurrent update",
     ("django/db/backends/utils.py", 105, "_execute", "return self.cursor.execute(sql, params)")),
    ("builtins.KeyError", "'sku_{n}'", None),
    ("smtplib.SMTPServerDisconnected", "Connection unexpectedly closed: timed out",
     ("smtplib.py", 405, "getreply",
      'raise SMTPServerDisconnected("Connection unexpectedly closed: " + str(e))')),
    ("botocore.exceptions.ClientError",
     ("An error occurred (SlowDown) when calling the PutObject operation (reached max "
      "retries: {n}): Please reduce your request rate."),
     ("botocore/client.py", 1023, "_make_api_call",
      "raise error_class(parsed_response, operation_name)")),
    ("celery.exceptions.SoftTimeLimitExceeded", "SoftTimeLimitExceeded()",
     ("billiard/pool.py", 229, "soft_timeout_sighandler", "raise SoftTimeLimitExceeded()")),
    ("builtins.TimeoutError", "read timed out after {n} s", None),
    ("shop.errors.InvalidPayload", "order {uuid} has no line items", None),
    ("builtins.AttributeError", "'NoneType' object has no attribute 'customer_id'", None),
    ("json.decoder.JSONDecodeError", "Expecting value: line {n} column {n} (char {n})",
     ("json/decoder.py", 355, "raw_decode",
      'raise JSONDecodeError("Expecting value", s, err.value) from None')),
)
#: Reasons other than an exception: (reason, exception type, message template).
OTHER_KINDS = (
    ("stalled", "", ("stalled: no heartbeat for {n}s (max_heartbeat_interval 300s); last "
                     "heartbeat 2026-11-{n}T{n}:{n}:{n}Z; worker "
                     "celery@worker-{n}.prod.example.internal")),
    ("stalled", "", ("stalled: worker celery@worker-{n}.prod.example.internal "
                     "(celery@worker-{n}.prod.example.internal:{n}:{n}) not seen for {n}s, "
                     "since 2026-11-{n}T{n}:{n}:{n}Z (jobbers_worker_lost_after 60s); last "
                     "heartbeat 2026-11-{n}T{n}:{n}:{n}Z")),
    ("stalled", "", "the worker shut down (on_shutdown=stop)"),
    ("dropped", "jobbers_celery.worker.request.VersionMismatch",
     "message version {n} differs from worker version {n}"),
)
GROUPS_PER_TASK = 40
TASK_ZIPF = 1.1   # popularity of task names: rank r has weight 1 / r**TASK_ZIPF
GROUP_ZIPF = 1.3  # within a task: group j has weight 1 / (j + 1)**GROUP_ZIPF
#: Popularity ranks of task names that stopped failing 10-25 days ago (fixed, renamed): the
#: list endpoint's hard case, a filter whose newest entries are far down the recency order.
STOPPED_RANKS = (3, 8)
#: The popularity rank of the task name of a past incident: an outage 8-10 days ago that left
#: INCIDENT_SHARE of all entries (what operators list by task name to resubmit after a fix).
INCIDENT_RANK = 1
INCIDENT_SHARE = 0.25


def task_names() -> list[str]:
    names = [f"{m}.{f}" for m in MODULES for f in FUNCS]
    random.Random(SEED).shuffle(names)  # popularity rank: position in this list
    return names


def traceback_text(module: str, func: str, helper: str, exc_type: str,
                   lib: tuple[str, int, str, str] | None) -> str:
    """A formatted traceback through Celery, JobbersTask and the application, without the
    last line (``<type>: <message>``, appended per entry)."""
    site = "/srv/app/.venv/lib/python3.12/site-packages"
    path = f"/srv/app/{module.replace('.', '/')}.py"
    lines = [
        "Traceback (most recent call last):",
        f'  File "{site}/celery/app/trace.py", line 453, in trace_task',
        "    R = retval = fun(*args, **kwargs)",
        "                 ^^^^^^^^^^^^^^^^^^^^",
        f'  File "{site}/jobbers_celery/worker/task.py", line 212, in __call__',
        "    return super().__call__(*args, **kwargs)",
        f'  File "{path}", line 88, in {func}',
        f"    rows = {helper}(client, page, **options)",
        f'  File "{path}", line 141, in {helper}',
    ]
    if lib is None:
        lines.append(f"    raise {exc_type.rsplit('.', 1)[-1]}(detail)")
    else:
        lib_path, line, lib_func, code = lib
        root = site if "/" in lib_path and not lib_path.startswith("json/") \
            else "/usr/lib/python3.12"
        lines += ["    response = session.request(method, url, timeout=30)",
                  f'  File "{root}/{lib_path}", line {line}, in {lib_func}',
                  f"    {code}"]
    return "\n".join(lines) + "\n"


def instantiate(template: str, n: int, uid: str) -> str:
    return template.replace("{n}", str(n)).replace("{uuid}", uid)


@dataclass
class Group:
    idx: int
    task_name: str
    queue: str
    version: int | None
    reason: str
    exception_type: str
    template: str
    traceback: str  # "" or without its last line
    fingerprint: str
    message: str
    frame: str
    weight: float
    win_a: float  # active window, as fractions of the DAYS before now (1 = now)
    win_b: float
    retry_s: int


def make_groups() -> list[Group]:
    """~2,000 kinds of failure over 50 task names, with real fingerprints (the sink's own
    function), each checked to be the same for two different instances of its message."""
    from jobbers_django.fingerprint import fingerprint

    rng = random.Random(SEED)
    groups: list[Group] = []
    names = task_names()
    others = sum(1 / (r + 1) ** TASK_ZIPF for r in range(len(names)) if r != INCIDENT_RANK)
    for rank, name in enumerate(names):
        module, func = name.rsplit(".", 1)
        t_weight = 1 / (rank + 1) ** TASK_ZIPF
        if rank == INCIDENT_RANK:
            t_weight = others * INCIDENT_SHARE / (1 - INCIDENT_SHARE)
        queue = QUEUES[MODULES.index(module) % len(QUEUES)]
        version = None if rank % 3 == 0 else 1 + rank % 4
        weights = [1 / (j + 1) ** GROUP_ZIPF for j in range(GROUPS_PER_TASK)]
        total = sum(weights)
        kinds: list[tuple[str, str, str, Any]] = []
        for j in range(GROUPS_PER_TASK - len(OTHER_KINDS)):
            exc, tpl, lib = FAILURES[(j + rank) % len(FAILURES)]
            helper = HELPERS[(j // len(FAILURES) + rank) % len(HELPERS)]
            kinds.append(("failed", exc, tpl, traceback_text(module, func, helper, exc, lib)))
        kinds[3:3] = [(r, e, t, "") for r, e, t in OTHER_KINDS]  # not the most frequent
        for j, (reason, exc, tpl, tb) in enumerate(kinds):
            def fp(n: int, uid: str, name: str = name, exc: str = exc, tpl: str = tpl,
                   tb: str = tb) -> Any:
                msg = instantiate(tpl, n, uid)
                return fingerprint(name, exc, msg, tb + f"{exc}: {msg}" if tb else "")

            a, b = fp(123, str(uuid.UUID(int=rng.getrandbits(128)))), fp(98765, str(uuid.uuid4()))
            if a != b:
                raise RuntimeError(f"fingerprint of {name}/{exc} varies with the message")
            # still happening (1.0), or stopped some time ago
            win_b = 1.0 if j == 0 or rng.random() < 0.4 else rng.uniform(0.2, 1.0)
            if rank in STOPPED_RANKS:  # last failure 10 days ago, others 10-25 days ago
                win_b = 1 - 10 / DAYS if j == 0 else rng.uniform(1 - 25 / DAYS, 1 - 10 / DAYS)
            win_a = 0.0 if j == 0 else max(0.0, win_b - rng.uniform(0.05, 1.0) * win_b)
            if rank == INCIDENT_RANK:  # all of it 8-10 days ago
                win_a, win_b = 1 - 10 / DAYS, 1 - 8 / DAYS
            groups.append(Group(
                idx=len(groups), task_name=name, queue=queue, version=version, reason=reason,
                exception_type=exc, template=tpl, traceback=tb, fingerprint=a.value,
                message=a.message, frame=a.frame, weight=t_weight * weights[j] / total,
                win_a=win_a, win_b=win_b, retry_s=rng.choice((30, 60, 120, 300, 600)),
            ))
    if len({g.fingerprint for g in groups}) != len(groups):
        raise RuntimeError("two generated failure groups share a fingerprint")
    return groups
