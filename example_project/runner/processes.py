"""Process supervision for ``run.py``: every process it starts, each in its own session,
watched while it runs and stopped in order at the end; waiting with a deadline."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from runner.errors import Failed

if TYPE_CHECKING:
    from runner.ui import UI


class Starts(Protocol):
    """What the processes tell the report: each one started (the report is above them)."""

    def started(self, proc: Proc) -> None: ...


#: The example project (``example_project/``): where the processes run.
HERE = Path(__file__).resolve().parents[1]


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    started: float = field(default_factory=time.monotonic)
    stopped_on_purpose: bool = False

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, lines: int = 15) -> str:
        try:
            text = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join("      | " + line for line in text[-lines:])


def group_pids(pgid: int) -> list[int]:
    """Live processes of a process group (Linux /proc; empty elsewhere)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            pids.append(int(stat.parent.name))
    return sorted(pids)


class Processes:
    """Every process this command starts, each in its own session (so Ctrl-C in the
    terminal reaches only this command, which stops them in order)."""

    def __init__(self, log_dir: Path, env: dict[str, str], report: Starts) -> None:
        self.log_dir = log_dir
        self.env = env
        self.report = report
        self.procs: list[Proc] = []

    def start(self, name: str, cmd: list[str], log_name: str, cwd: Path = HERE) -> Proc:
        log = self.log_dir / log_name
        with log.open("wb") as out:  # the child keeps its own descriptor
            popen = subprocess.Popen(cmd, cwd=cwd, env=self.env, stdout=out,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        proc = Proc(name, popen, log)
        self.procs.append(proc)
        self.report.started(proc)
        return proc

    def celery(self, name: str, args: list[str], log_name: str) -> Proc:
        return self.start(name, [sys.executable, "-m", "celery", "-A", "example", *args],
                          log_name)

    def worker(self, hostname: str, queues: str, concurrency: int) -> Proc:
        short = hostname.split("@")[0]
        return self.celery(f"worker {hostname}", [
            "worker", "-P", "prefork", "-c", str(concurrency), "-n", hostname, "-Q", queues,
            "-l", "INFO", "--without-mingle", "--without-gossip"], f"worker-{short}.log")

    def check_alive(self) -> None:
        for proc in self.procs:
            if not proc.stopped_on_purpose and not proc.alive():
                raise Failed(f"{proc.name} (pid {proc.pid}) exited with status "
                             f"{proc.popen.returncode}; the end of {proc.log}:\n{proc.tail()}")

    def stop_all(self, ui: UI, keep_last: Proc | None = None) -> None:
        """SIGTERM to each (workers at once: a warm shutdown), wait, SIGKILL what is left;
        ``keep_last`` (Redis) goes after everything that uses it."""
        first = [p for p in self.procs if p is not keep_last]
        for proc in first:
            if proc.alive():
                send_signal(proc.pid, signal.SIGTERM)
        for proc in [*first, *([keep_last] if keep_last else [])]:
            if proc is keep_last and proc.alive():
                send_signal(proc.pid, signal.SIGTERM)
            was_alive = proc.popen.returncode is None
            try:
                proc.popen.wait(20)
            except subprocess.TimeoutExpired:
                ui.out(f"    {proc.name} did not stop within 20 s: SIGKILL")
                kill_group(proc.pid)
                proc.popen.wait(5)
            # pool children or anything else left in its group
            if group_pids(proc.pid):
                kill_group(proc.pid)
            if was_alive:
                ui.out(ui.dim(f"    stopped {proc.name} (pid {proc.pid})"))


def send_signal(pid: int, sig: int) -> None:
    with suppress(ProcessLookupError):
        os.kill(pid, sig)


def kill_group(pgid: int) -> None:
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def wait_until(what: str, predicate: Callable[[], Any], timeout: float,
               procs: Processes | None = None, interval: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if procs is not None:
            procs.check_alive()
        if time.monotonic() > deadline:
            raise Failed(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)
