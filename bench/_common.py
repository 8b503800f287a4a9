"""Helpers shared by the benchmarks of ``bench/`` (one copy of each; benchmark scaffolding,
not library code).

- where things are: ``BENCH_DIR``, ``ROOT``, :func:`on_sys_path`, :func:`subprocess_env`;
- processes: :func:`free_port`, :class:`PrivateRedis` (a ``redis-server`` of the run's own),
  :class:`Worker` (a ``celery worker`` in its own session), :func:`stop_process_group`,
  :class:`LineProcess` (a fresh process driven line by line), :func:`rotated` (the order of
  interleaved variants), :func:`wait_for`, :func:`ping`;
- measuring: CPU from ``/proc`` (:func:`proc_cpu`, :func:`child_pids`,
  :func:`machine_busy`), :class:`Load` (the CPU the rest of the machine used over the
  measured spans), :class:`CallTimes` (the parts of a measured operation),
  :func:`commandstats` (``INFO commandstats``), :func:`code_version`;
- reading figures: :func:`pct`, :func:`distribution`, :class:`Spread` (median [min-max])
  and :func:`verdict`, the one word every benchmark prints against a target;
- the run: :func:`common_options` (``--json``, ``--redis-server``), :func:`banner` (a
  report's heading), :func:`write_json`, :func:`exit_code` and :func:`failed` (0 every
  target met, 2 one missed, 1 the benchmark failed).

The scripts import it as ``_common`` (``bench/`` is on ``sys.path``: the directory of the
script run, or :func:`on_sys_path`).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import glob
import json
import math
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
CLK_TCK = os.sysconf("SC_CLK_TCK")
NCPU = os.cpu_count() or 1


# =========================================================================== paths
def on_sys_path() -> None:
    """``bench/`` (the apps, this module) and the repository root (jobbers) importable."""
    for path in (str(ROOT), str(BENCH_DIR)):
        if path not in sys.path:
            sys.path.insert(0, path)


def subprocess_env(**extra: str) -> dict[str, str]:
    """This process's environment with ``bench/`` and the repository root on PYTHONPATH
    (for the workers and clients a benchmark starts), plus ``extra``."""
    return {**os.environ, **extra,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(BENCH_DIR), str(ROOT),
                                                        os.environ.get("PYTHONPATH")]))}


# =========================================================================== processes
def free_port() -> int:
    """A free loopback port, never 6379 (the machine's shared Redis)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port != 6379:
            return port


def wait_for(predicate: Callable[[], Any], timeout: float, what: str,
             interval: float = 0.05) -> Any:
    """Poll ``predicate`` until it returns something true (returned); RuntimeError after
    ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)


def ping(client: Any) -> bool:
    """Whether the Redis behind ``client`` answers (False while it is starting)."""
    try:
        return bool(client.ping())
    except Exception:  # noqa: BLE001 - not up yet
        return False


class PrivateRedis:
    """A ``redis-server`` of our own on a free loopback port, persistence off."""

    def __init__(self, binary: str) -> None:
        path = shutil.which(binary)
        if path is None:
            raise SystemExit(f"{binary} not found: install redis-server (apt-get install "
                             "redis-server) or pass --redis-server PATH")
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="jobbers-bench-redis-")
        self.proc = subprocess.Popen(
            [path, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.dir],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
        )
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


def stop_process_group(proc: subprocess.Popen[Any], grace: float = 30) -> None:
    """SIGTERM (a worker's warm shutdown), then SIGKILL to what is left of the process's
    session (pool children); ``proc`` must have been started with ``start_new_session``."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(grace)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(10)


class Worker:
    """``celery -A <module> worker -P <pool>`` in its own session, run from ``bench/``; ready
    when it touches ``ready_file`` (the app's ``worker_ready`` hook, given
    ``BENCH_READY_FILE`` in ``env``)."""

    def __init__(self, module: str, pool: str, concurrency: int, env: dict[str, str],
                 log_path: Path, ready_file: Path, name: str | None = None) -> None:
        self.name = name or f"bench-{os.getpid()}-{time.monotonic_ns() % 10**6}@localhost"
        self.log_path = log_path
        self.ready_file = ready_file
        cmd = [sys.executable, "-m", "celery", "-A", module, "worker", "-P", pool,
               "-n", self.name, "-l", "WARNING",
               "--without-mingle", "--without-gossip", "--without-heartbeat"]
        if pool == "prefork":
            cmd += ["-c", str(concurrency)]
        with log_path.open("w") as log:
            self.proc = subprocess.Popen(cmd, cwd=BENCH_DIR, env=env, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        self.pid = self.proc.pid

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def wait_ready(self, timeout: float = 90) -> None:
        def ready() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker exited early ({self.proc.returncode}):\n"
                                   + self.log_tail())
            return self.ready_file.exists()

        wait_for(ready, timeout, "the worker to be ready", interval=0.05)

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"worker died ({self.proc.returncode}):\n" + self.log_tail())

    def stop(self) -> None:
        stop_process_group(self.proc)


class LineProcess:
    """A fresh process of the benchmark's own, driven over its stdin (a line per command)
    and answering on its stdout (a JSON line per reply): ``overhead.py``'s client of one
    round, one layout of ``cleaner.py --compare-shards``."""

    def __init__(self, cmd: list[str], **popen: Any) -> None:
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, **popen)
        self.pid = self.proc.pid

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def reply(self) -> Any:
        """The next JSON line; None once the process has closed its stdout."""
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        return json.loads(line) if line else None


def rotated(items: Sequence[T], i: int) -> list[T]:
    """``items`` rotated by ``i``: the order of round ``i`` when variants run interleaved,
    so that none always runs first or after the same one (with two: A B, B A, ...)."""
    k = i % len(items) if items else 0
    return [*items[k:], *items[:k]]


# =========================================================================== measuring
def _stat_fields(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw[raw.rindex(")") + 2:].split()  # fields from 3 (state) on


def proc_cpu(pid: int) -> tuple[float, float]:
    """(own user+sys seconds, reaped children's user+sys seconds) of ``pid``."""
    f = _stat_fields(pid)
    if f is None:
        return 0.0, 0.0
    # stat fields 14-17: utime stime cutime cstime; f[0] is field 3
    return (int(f[11]) + int(f[12])) / CLK_TCK, (int(f[13]) + int(f[14])) / CLK_TCK


def child_pids(ppid: int) -> list[int]:
    out = []
    for path in glob.glob("/proc/[0-9]*/stat"):
        pid = int(path.split("/")[2])
        f = _stat_fields(pid)
        if f is not None and int(f[1]) == ppid:
            out.append(pid)
    return out


def machine_busy() -> float:
    """CPU seconds all CPUs of the machine spent busy since boot (/proc/stat)."""
    f = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in f[:8])
    return (user + nice + system + irq + softirq + steal) / CLK_TCK


class Load:
    """CPU the machine used outside the benchmark (this process and ``pids`` are the
    benchmark) over the measured spans, in all and per span label."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids
        self.other = self.wall = 0.0
        self.phases: dict[str, list[float]] = {}  # label -> [other CPU s, wall s]

    @contextlib.contextmanager
    def span(self, label: str = "") -> Iterator[None]:
        def sample() -> tuple[float, float]:
            own = sum(sum(proc_cpu(p)) for p in [os.getpid(), *self.pids])
            return time.monotonic(), machine_busy() - own

        t0, m0 = sample()
        try:
            yield
        finally:
            t1, m1 = sample()
            self.wall += t1 - t0
            self.other += max(0.0, m1 - m0)
            acc = self.phases.setdefault(label, [0.0, 0.0])
            acc[0] += max(0.0, m1 - m0)
            acc[1] += t1 - t0

    @property
    def share(self) -> float:
        """Share of all the machine's CPUs used by processes outside the benchmark."""
        return self.other / (self.wall * NCPU) if self.wall else 0.0

    def phase_share(self, label: str) -> float:
        other, wall = self.phases.get(label, [0.0, 0.0])
        return other / (wall * NCPU) if wall else 0.0


class CallTimes:
    """Wall time of each call of the callables wrapped, per label: the parts of a measured
    operation (a cleaner pass, a resubmit request)."""

    def __init__(self) -> None:
        self.calls: dict[str, list[float]] = {}  # label -> seconds of each call

    def wrap(self, label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed(*a: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                self.calls.setdefault(label, []).append(time.perf_counter() - t0)
        return timed

    def seconds(self, label: str) -> float:
        return sum(self.calls.get(label, ()))

    def count(self, label: str) -> int:
        return len(self.calls.get(label, ()))


def commandstats(client: Any) -> dict[str, tuple[int, int]]:
    """(calls, usec) per command name, from ``INFO commandstats``."""
    stats = client.info("commandstats")
    return {k.removeprefix("cmdstat_"): (int(v["calls"]), int(v["usec"]))
            for k, v in stats.items()}


#: The store's round trips: its script calls. ``INFO commandstats`` also counts the commands
#: a script runs (a step's HSET, ZADD, GET...), which are no round trip of their own; the
#: store sends no other command on a publish or a start (the broker's are lpush, sadd...).
STORE_COMMANDS = ("evalsha", "eval")


def commands_since(client: Any, before: dict[str, Any]) -> dict[str, int]:
    """Commands run since ``before`` (an ``INFO commandstats`` reply, read with
    ``decode_responses``), by name; the ``info`` calls of the measure left out."""
    after = client.info("commandstats")
    got = {k.removeprefix("cmdstat_"): int(v["calls"]) - int(before.get(k, {}).get(
        "calls", 0)) for k, v in after.items()}
    got.pop("info", None)
    return got


def per_task(calls: dict[str, int], tasks: int) -> dict[str, Any]:
    """``store_calls`` (round trips) and ``calls`` (every command) per task."""
    return {"store_calls": sum(calls.get(c, 0) for c in STORE_COMMANDS) / tasks,
            "calls": {k: round(v / tasks, 3) for k, v in sorted(calls.items()) if v}}


def interleaved_rounds(script: str, variants: list[str], url: str, client: Any,
                       rounds: int, child_args: list[str]) -> list[dict[str, dict[str, Any]]]:
    """``rounds`` rounds, each variant in a fresh ``script --child VARIANT URL *child_args``
    process (the store emptied before each, the order rotated from round to round); each
    child prints its figures as the JSON of its last line."""
    out: list[dict[str, dict[str, Any]]] = []
    for i in range(rounds):
        got: dict[str, dict[str, Any]] = {}
        for variant in rotated(variants, i):
            client.flushall()
            done = subprocess.run([sys.executable, script, "--child", variant, url,
                                   *child_args], capture_output=True, text=True,
                                  env=subprocess_env(), check=True, timeout=600)
            got[variant] = json.loads(done.stdout.strip().splitlines()[-1])
        out.append(got)
        print(f"  round {i + 1}: " + ", ".join(
            f"{v} {got[v]['us']:.0f} us" for v in variants), flush=True)
    return out


def code_version(*paths: str) -> str:
    """The commit of the checkout, and which of ``paths`` (default: both packages) have
    uncommitted changes: a run measures the working tree."""

    def git(*a: str) -> str:
        return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True,
                              timeout=10, check=False).stdout.rstrip()

    try:
        head = git("log", "-1", "--format=%h %s")[:90]
        if not head:
            return "? (not a git checkout)"
        dirty = [line[3:] for line in git("status", "--porcelain", "--", *(
            paths or ("jobbers_celery", "jobbers_django"))).splitlines()]
    except (OSError, subprocess.SubprocessError):
        return "? (no git)"
    return head + (f" + uncommitted changes in {', '.join(dirty)}" if dirty else " (clean)")


# =========================================================================== figures
def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    s = sorted(values)
    return s[max(0, min(len(s) - 1, math.ceil(q * len(s)) - 1))]


def distribution(values: list[float]) -> dict[str, float]:
    """n, min, median (also as p50), p95, p99, max and mean of ``values``."""
    median = statistics.median(values)
    return {"n": len(values), "min": min(values), "median": median, "p50": pct(values, 0.50),
            "p95": pct(values, 0.95), "p99": pct(values, 0.99), "max": max(values),
            "mean": statistics.fmean(values)}


@dataclass
class Spread:
    """Median and range of a figure over rounds (or of a ratio, paired round by round)."""

    median: float
    lo: float
    hi: float

    @classmethod
    def of(cls, values: list[float]) -> Spread:
        return cls(statistics.median(values), min(values), max(values))

    def cell(self, fmt: str, median_fmt: str | None = None) -> str:
        """``median [min-max]``, e.g. ``1.02 [0.97-1.10]``."""
        return f"{self.median:{median_fmt or fmt}} [{self.lo:{fmt}}-{self.hi:{fmt}}]"


def verdict(ok: bool) -> str:
    """The word printed after a figure judged against its target."""
    return "met" if ok else "NOT met"


# =========================================================================== the run
def common_options(ap: argparse.ArgumentParser,
                   json_help: str | None = "also write the results as JSON") -> None:
    """``--json PATH`` (unless ``json_help`` is None) and ``--redis-server``."""
    if json_help is not None:
        ap.add_argument("--json", metavar="PATH", help=json_help)
    ap.add_argument("--redis-server", default="redis-server", help="redis-server binary")


def banner(width: int, *lines: str) -> None:
    """A report's heading: a blank line, then ``lines`` between two rules."""
    print()
    print("=" * width)
    for line in lines:
        print(line)
    print("=" * width)


def write_json(path: str | None, data: Any, indent: str = "  ",
               default: Callable[[Any], Any] = str) -> None:
    """Write ``data`` to ``path`` (``--json``; nothing without one) and say so."""
    if path:
        Path(path).write_text(json.dumps(data, indent=2, default=default))
        print(f"{indent}results written to {path}")


def exit_code(ok: bool) -> int:
    """0 if every target is met, 2 if one is missed."""
    return 0 if ok else 2


def failed(exc: BaseException) -> int:
    """The benchmark could not measure (a check failed, a process died): exit code 1."""
    print(f"benchmark failed: {exc}", file=sys.stderr)
    return 1
