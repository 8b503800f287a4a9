"""docs/howto/unique.md, rate-limits.md and fair-shares.md, run as their reader runs them:
jobbers from the built wheel in an empty venv, the pages' Python blocks as written, their
console sessions typed at the venv's ``celery`` in an empty directory (the checkout is not
importable: no ``PYTHONPATH``). No worker: what the pages show happens at the publish and in
the store.

The pages assume an app; the test's preamble is what the Celery quickstart makes, and no
more: ``proj.py`` holds ``app = Celery("proj", broker=..., backend=...)`` on the test's own
redis-server and ``install(app)``; the pages' blocks start with ``JobbersTask`` imported and
``app`` in scope (``PREAMBLE``, ``SHOP_PREAMBLE``).

The test's changes to the pages (each still needed, or the test fails):
* The pages' Python blocks go into ``shop.py`` next to ``proj.py`` (which includes it), not
  into ``proj.py``: the consoles type ``celery -A proj`` and name the tasks
  ``shop.call_partner`` and ``shop.import_rows``, the names Celery gives to functions of a
  module ``shop``. The module's name is read from the consoles' task names; were they
  ``proj.*`` the test fails (the change is no longer needed).
* unique.md's calls (the ``delay`` lines of its first block, and its second block) run in a
  Python process next to the project, in ``shop``'s namespace, as if typed after it: at
  module level they would publish at every ``celery -A proj``. Each call's comment is a
  claim the test knows and checks (a message sent or not, which id answers).
* fair-shares.md's console shows a key with parked tasks: before typing it, the test
  publishes two calls of one account past the cap its row shows (``CAP``).
"""

from __future__ import annotations

import ast
import io
import json
import re
import shlex
import subprocess
import time
import tokenize
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, RedisServer
from tests.distribution.markdown import Block, blocks
from tests.distribution.tools import Dist, Venv, run, user_env

pytestmark = [pytest.mark.timeout(900)]

HOWTO = ROOT / "docs" / "howto"
UNIQUE, RATE_LIMITS, FAIR = HOWTO / "unique.md", HOWTO / "rate-limits.md", HOWTO / "fair-shares.md"

#: ``proj.py``: the app the pages assume ({url}: the test's redis-server), including the
#: module that holds the pages' blocks ({module})
PREAMBLE = '''from celery import Celery
from jobbers_celery import install

app = Celery("proj", broker="{url}", backend="{url}", include=["{module}"])
jobbers = install(app)
'''
#: The top of that module: what the pages' blocks take as given
SHOP_PREAMBLE = "from jobbers_celery import JobbersTask\nfrom proj import app\n"

#: Runs steps in the namespace of the pages' module, as typed after it; argv[1] is a JSON
#: list of ``[kind, source]``, ``eval`` (an expression) or ``exec`` (statements). For each:
#: what it printed, the broker's message count after it, and for a value with an ``id``
#: (an AsyncResult) its jobbers record's state and history reasons.
CLIENT = '''
import contextlib, importlib, io, json, sys

import jobbers_celery
import redis
from jobbers_celery import get_jobbers

module = importlib.import_module(sys.argv[2])
namespace = dict(vars(module))
broker = redis.Redis.from_url(module.app.conf.broker_url)
jobbers = get_jobbers(module.app)
steps = []
for kind, source in json.loads(sys.argv[1]):
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        value = eval(source, namespace) if kind == "eval" else exec(source, namespace)
    step = {"printed": printed.getvalue(), "messages": broker.llen("celery")}
    if hasattr(value, "id"):
        record = jobbers.get(value.id)
        step.update(id=value.id, state=record.state.value if record else None,
                    reasons=[t.reason for t in jobbers.history(value.id)])
    elif value is not None:
        step["value"] = value
    steps.append(step)
print("CLIENT " + json.dumps({"jobbers_from": jobbers_celery.__file__, "steps": steps}))
'''

Rows = dict[str, dict[str, str]]

#: The columns whose values depend on the moment (what waits, runs, is parked; a key's
#: digest): the page's value and the output's need only have the same form
RATE_VARIES = {"WAITING": r"\d+"}
FAIR_VARIES = {"KEY": r"[0-9a-f]{8}", "PARKED": r"\d+", "ON THEIR WAY": r"\d+",
               "RUNNING": r"\d+"}
#: What a rate-limits command's comment claims, as a check of the row it printed
RATE_CLAIMS = {
    "lifted: unlimited": lambda row: row["OVERRIDE"] == "off" and row["IN FORCE"] == "unlimited",
    "the declared rate again":
        lambda row: row["OVERRIDE"] == "-" and row["IN FORCE"] == row["DECLARED"],
}


def python_blocks(page: Path) -> list[Block]:
    """The page's ``python`` blocks; its other blocks are ``console`` sessions."""
    found = blocks(page)
    unknown = [b.line for b in found if b.lang not in {"python", "console"}]
    assert unknown == [], f"{page.name}: blocks the test does not know how to run at {unknown}"
    return [b for b in found if b.lang == "python"]


def console(page: Path) -> list[tuple[str, list[str]]]:
    """The page's one console session: each ``$`` command with the lines it shows."""
    (block,) = [b for b in blocks(page) if b.lang == "console"]
    session: list[tuple[str, list[str]]] = []
    for line in block.text.splitlines():
        if line.startswith("$ "):
            session.append((line[2:], []))
        else:
            assert session, f"{page.name} line {block.line}: output before any command"
            session[-1][1].append(line)
    return session


def shell_comment(command: str) -> str | None:
    """A console command's ``#`` comment, without the ``#``."""
    m = re.search(r"\s#\s*(?P<text>.*)$", command)
    return m["text"].strip() if m else None


def comment(line: str) -> str | None:
    """A Python line's ``#`` comment, without the ``#``."""
    tokens = tokenize.generate_tokens(io.StringIO(line).readline)
    return next((t.string[1:].strip() for t in tokens if t.type == tokenize.COMMENT), None)


def split_calls(block: Block) -> tuple[str, list[tuple[str, str]]]:
    """unique.md's first block: its declaration, and its calls (top-level expressions) with
    what their comments claim."""
    lines = block.text.splitlines(keepends=True)
    calls: list[tuple[str, str]] = []
    taken: set[int] = set()
    for node in ast.parse(block.text).body:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            assert node.end_lineno is not None
            source = "".join(lines[node.lineno - 1:node.end_lineno])
            claim = comment(lines[node.end_lineno - 1])
            assert claim, f"unique.md line {block.line + node.lineno}: a call without a claim"
            calls.append((source.strip(), claim))
            taken |= set(range(node.lineno - 1, node.end_lineno))
    return "".join(line for n, line in enumerate(lines) if n not in taken), calls


def table(lines: list[str], where: str) -> tuple[list[str], Rows]:
    """An aligned table (two spaces or more between columns): its header and its rows by
    their first cell."""
    lines = [line for line in lines if line.strip()]
    assert lines, f"{where}: no table"
    header = re.split(r"\s{2,}", lines[0].strip())
    rows: Rows = {}
    for line in lines[1:]:
        cells = re.split(r"\s{2,}", line.strip())
        assert len(cells) == len(header), f"{where}: {line!r} does not fit {header}"
        rows[cells[0]] = dict(zip(header, cells, strict=True))
    return header, rows


def output_table(output: str, first: str, where: str) -> tuple[list[str], Rows]:
    """The table a command printed, from its header (whose first column is ``first``)."""
    lines = output.splitlines()
    start = next((n for n, line in enumerate(lines) if line.startswith(first + " ")), None)
    assert start is not None, f"{where}: no {first} header in:\n{output}"
    return table(lines[start:], where)


def same_table(page_lines: list[str], output: str, where: str, varies: dict[str, str]) -> Rows:
    """The output's table has the page's header and rows: every value the same, save those
    of the columns that vary, which need only the same form. Returns the output's rows."""
    page_header, page_rows = table(page_lines, f"{where} (the page)")
    header, rows = output_table(output, page_header[0], f"{where} (the output)")
    assert header == page_header, f"{where}: the page shows {page_header}, the command {header}"
    assert rows.keys() == page_rows.keys(), f"{where}: {list(rows)}, the page's {list(page_rows)}"
    for name, page_row in page_rows.items():
        for column, shown in page_row.items():
            got = rows[name][column]
            if column not in varies:
                assert got == shown, f"{where}: {name}'s {column} {got!r}, the page's {shown!r}"
            else:
                assert re.fullmatch(varies[column], shown), f"{where}: the page's {name} {shown!r}"
                assert re.fullmatch(varies[column], got), f"{where}: {name}'s {column} {got!r}"
    return rows


@dataclass
class Project:
    """The reader's directory: ``proj.py``, the pages' module, the venv with the wheel."""

    work: Path
    venv: Venv
    module: str
    log: Path

    def celery(self, command: str, where: str) -> str:
        """A console line as typed (its ``celery`` is the venv's); it must exit 0."""
        argv = shlex.split(command, comments=True)
        assert argv[0] == "celery", f"{where}: `{command}` is not a celery command"
        return run([self.venv.bin("celery"), *argv[1:]], cwd=self.work, log=self.log,
                   env=user_env(), timeout=120)

    def refused(self, command: str) -> str:
        """A command that must exit 2 (a usage error): its output."""
        argv = shlex.split(command)
        proc = subprocess.run([self.venv.bin("celery"), *argv[1:]], cwd=self.work,
                              env=user_env(), capture_output=True, text=True, timeout=120,
                              check=False)
        with self.log.open("a") as f:
            f.write(f"$ {command}\n{proc.stdout}{proc.stderr}\n")
        assert proc.returncode == 2, f"`{command}` exited {proc.returncode}:\n{proc.stderr}"
        return proc.stderr

    def client(self, steps: list[tuple[str, str]]) -> list[dict[str, Any]]:
        out = run([self.venv.python, "-c", CLIENT, json.dumps(steps), self.module],
                  cwd=self.work, log=self.log, env=user_env(), timeout=120)
        line = next(line for line in out.splitlines() if line.startswith("CLIENT "))
        report = json.loads(line.removeprefix("CLIENT "))
        assert str(self.venv.path) in report["jobbers_from"], report  # the wheel's, not ours
        return list(report["steps"])


def task_module() -> str:
    """The module the consoles' task names say the pages' tasks are in."""
    names = {word for page in (RATE_LIMITS, FAIR) for command, shown in console(page)
             for word in " ".join([command, *shown]).split() if re.fullmatch(r"\w+\.\w+", word)}
    modules = {name.split(".")[0] for name in names}
    assert len(modules) == 1, f"the consoles' task names {sorted(names)} name several modules"
    (module,) = modules
    assert module != "proj", "the consoles name the tasks proj.*: shop.py is no longer needed"
    return module


@pytest.fixture(scope="module")
def venv(dist: Dist, tmp_path_factory: pytest.TempPathFactory) -> Venv:
    """An empty venv with the built wheel installed, as the quickstart's ``pip install``."""
    home = tmp_path_factory.mktemp("howto-flow")
    started = time.monotonic()
    venv = Venv.create(home / "venv", log=home / "install.log")
    venv.pip("install", str(dist.wheel), cwd=home, log=home / "install.log")
    print(f"venv and wheel in {time.monotonic() - started:.1f}s")
    return venv


@pytest.fixture
def project(venv: Venv, own_redis: RedisServer, tmp_path: Path) -> Project:
    """``proj.py`` and the pages' module, in an empty directory."""
    module = task_module()
    work = tmp_path / "project"
    work.mkdir()
    (work / "proj.py").write_text(PREAMBLE.format(url=own_redis.url(0), module=module))
    parts = [SHOP_PREAMBLE]
    first = python_blocks(UNIQUE)[0]
    declaration, _ = split_calls(first)
    parts.append(f"# {UNIQUE.name} line {first.line}\n{declaration}")
    for page in (RATE_LIMITS, FAIR):
        for block in python_blocks(page):
            parts.append(f"# {page.name} line {block.line}\n{block.text}")
    source = "\n".join(parts)
    functions = [n.name for n in ast.parse(source).body if isinstance(n, ast.FunctionDef)]
    assert len(functions) == len(set(functions)), f"two pages declare one name: {functions}"
    (work / f"{module}.py").write_text(source)
    return Project(work, venv, module, log=tmp_path / "commands.log")


def test_unique_publishes_once_per_key_as_its_comments_say(project: Project) -> None:
    first, duplicate = python_blocks(UNIQUE)
    _, calls = split_calls(first)
    assert len(calls) == 3, calls
    steps = project.client([*(("eval", source) for source, _ in calls), ("exec", duplicate.text)])
    messages, ids = 0, list[str]()
    for (source, claim), step in zip(calls, steps[:len(calls)], strict=True):
        where = f"unique.md: `{source}`"  # the line, its comment included
        if claim.startswith("not published"):
            assert step["messages"] == messages, f"{where}: a message was sent: {step}"
            assert claim == "not published: the first one's AsyncResult", f"{where}: unknown claim"
            assert step["id"] == ids[0], f"{where}: {step['id']}, the first was {ids[0]}"
        else:
            assert claim in {"published", "another key: published"}, f"{where}: unknown claim"
            assert step["messages"] == messages + 1, f"{where}: no message sent: {step}"
            assert step["id"] not in ids, f"{where}: {step}"
            assert step["state"] == "submitted", f"{where}: {step}"
            messages += 1
        ids.append(step["id"])
    # raise_duplicate=True on the key the first call holds: DuplicateTask, its holder the
    # first call's id (the except branch prints it), nothing sent
    held = steps[-1]
    assert held["printed"] == f"already pending: {ids[0]}\n", held
    assert held["messages"] == messages, held


def test_the_rate_limits_console_as_typed(project: Project) -> None:
    where = "rate-limits.md console"
    for command, shown in console(RATE_LIMITS):
        rows = same_table(shown, project.celery(command, where), f"{where}: `{command}`",
                          RATE_VARIES)
        argv = shlex.split(command, comments=True)
        assert argv[:5] == ["celery", "-A", "proj", "jobbers", "rate-limits"], command
        match argv[5:]:
            case []:
                continue
            case ["set", name, rate]:
                assert rows[name]["OVERRIDE"] == rate, f"`{command}`: {rows}"
            case ["clear", name]:
                pass
            case _:
                raise AssertionError(f"{where}: the test does not know `{command}`")
        claim = shell_comment(command)
        if claim is not None:
            assert claim in RATE_CLAIMS, f"`{command}`: the test does not know {claim!r}"
            assert RATE_CLAIMS[claim](rows[name]), f"`{command}`  # {claim}: {rows[name]}"
        if argv[5] != "set":
            continue
        # the listing, in a process of its own, shows the override set
        listing = project.celery("celery -A proj jobbers rate-limits", where)
        _, listed = output_table(listing, "TASK", f"{where}: the listing after `{command}`")
        assert {k: v for k, v in listed[name].items() if k != "WAITING"} == \
            {k: v for k, v in rows[name].items() if k != "WAITING"}, (command, listed, rows)
    # "`set` with a bad rate, a name no task has, ... exits 2 with the reason"
    assert "Invalid value for RATE" in project.refused(
        f"celery -A proj jobbers rate-limits set {project.module}.call_partner 2/x")
    assert f"no task named {project.module}.no_such_task" in project.refused(
        f"celery -A proj jobbers rate-limits set {project.module}.no_such_task 2/s")
    # "... or a task without `rate_limit_by` in the app ... exits 2"
    assert "is not a task with rate_limit_by here" in project.refused(
        f"celery -A proj jobbers rate-limits set {project.module}.import_rows 2/s")


def test_the_fair_console_shows_what_is_held_back(project: Project) -> None:
    ((command, shown),) = console(FAIR)
    _, page_rows = table(shown, "fair-shares.md console")
    ((name, page_row),) = page_rows.items()
    cap = int(page_row["CAP"])
    function = name.split(".", 1)[1]
    steps = project.client([*[("eval", f'{function}.delay("acme", [])')] * (cap + 2),
                            ("exec", "from jobbers_celery.core.fairshare import key_digest"),
                            ("eval", 'key_digest("acme")')])
    *published, _, digest = steps
    # the cap's worth sent, the two past it parked (recorded, nothing sent)
    assert [s["messages"] for s in published] == [*range(1, cap + 1), cap, cap], published
    assert [s["state"] for s in published] == ["submitted"] * cap + ["scheduled"] * 2, published
    short = digest["value"][:8]
    # the parked task's history says why, as the page's reason does
    (reason,) = {" ".join(r.split()) for r in re.findall(
        r"`(key [0-9a-f]{8} at max_concurrent=\d+: [^`]*)`", FAIR.read_text())}
    page_digest = reason.split()[1]
    assert published[-1]["reasons"][-1] == reason.replace(page_digest, short), published[-1]
    rows = same_table(shown, project.celery(command, "fair-shares.md console"),
                      f"fair-shares.md: `{command}`", FAIR_VARIES)
    assert rows[name] == {"NAME": name, "KEY": short, "PARKED": "2", "ON THEIR WAY": str(cap),
                          "RUNNING": "0", "CAP": str(cap)}, rows
