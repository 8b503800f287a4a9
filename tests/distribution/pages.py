"""Runs a documentation page as a reader would: from an empty directory, block after block.

Shell lines run in ``bash`` in that directory, after the page's own ``. .venv/bin/activate``
(kept as the shell's state), with a new user's environment (no project venv, no test
variables). Commands the test names as services (worker, beat, web server) start in the
background and must say they are ready; every other command must exit 0. Files are written
or extended as their titles say. The ``pycon`` blocks are one shell session, played by
``pycon_runner.py`` in the shell the page names. Substitutions are the test's only changes to
the page: each is stated with its reason and must be used, so that a stale one fails.
"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.distribution.markdown import Block, Step, blocks, session_steps
from tests.distribution.tools import INSTALL_TIMEOUT, Service, user_env

RUNNER = Path(__file__).with_name("pycon_runner.py")


@dataclass
class Substitution:
    old: str
    new: str
    why: str
    used: int = 0


@dataclass
class Page:
    path: Path
    workdir: Path
    logs: Path
    substitutions: list[Substitution]
    #: regex on a command -> the output that says it is ready
    services: dict[str, str]
    #: the command of the page's Python shell ("python" next to proj.py, "manage.py shell")
    shell: str
    #: regex on a command -> what the reader types at its prompts, in order
    answers: dict[str, list[str]] = field(default_factory=dict)
    deadline: float = 60.0
    started: list[Service] = field(default_factory=list)
    prelude: list[str] = field(default_factory=list)
    timings: list[tuple[str, float]] = field(default_factory=list)
    #: (command, standard output) of every command run to completion
    outputs: list[tuple[str, str]] = field(default_factory=list)

    def substitute(self, text: str) -> str:
        for sub in self.substitutions:
            if sub.old in text:
                sub.used += 1
                text = text.replace(sub.old, sub.new)
        return text

    def run(self) -> None:
        session: list[Step] = []
        for block in blocks(self.path):
            if block.lang != "pycon" and session:
                self.play(session)
                session = []
            if block.lang == "sh":
                for line, command in block.commands():
                    self.command(self.substitute(command), f"{self.path.name} line {line}")
            elif block.lang == "python" and block.title:
                self.write(block)
            elif block.lang == "pycon":
                session += session_steps(block)
            else:
                raise AssertionError(f"{self.where(block)}: the test does not know how to run "
                                     f"a {block.lang!r} block{'' if block.title else ' without title'}")
        if session:
            self.play(session)
        unused = [s.old for s in self.substitutions if not s.used]
        assert unused == [], f"substitutions the page no longer needs: {unused}"

    def where(self, block: Block) -> str:
        return f"{self.path.name} line {block.line}"

    def write(self, block: Block) -> None:
        name, append = block.file
        target = self.workdir / name
        assert self.workdir in target.resolve().parents, f"{self.where(block)}: {name} escapes"
        if append:
            assert target.exists(), f"{self.where(block)}: {name} is extended before it exists"
        target.parent.mkdir(parents=True, exist_ok=True)
        with target.open("a" if append else "w") as f:
            f.write(self.substitute(block.text))

    def command(self, command: str, where: str) -> None:
        if re.match(r"^(\.|source)\s", command):
            self.prelude.append(command)  # the shell's state for the commands that follow
            return
        script = "\n".join([*self.prelude, command])
        env = user_env()
        started = time.monotonic()
        for pattern, ready in self.services.items():
            if re.search(pattern, command):
                log = self.logs / f"{len(self.started)}-{pattern.split()[-1].strip('^$')}.log"
                service = Service(["bash", "-c", "\n".join([*self.prelude, f"exec {command}"])],
                                  cwd=self.workdir, log=log, env=env)
                self.started.append(service)
                service.wait_for_output(ready)
                self.timings.append((command, time.monotonic() - started))
                return
        answers = next((a for p, a in self.answers.items() if re.search(p, command)), None)
        if answers is not None:
            code, out = run_in_terminal(["bash", "-c", script], self.workdir, env, answers)
            err = ""
        else:
            proc = subprocess.run(["bash", "-c", script], cwd=self.workdir, env=env, text=True,
                                  capture_output=True, timeout=INSTALL_TIMEOUT, check=False)
            code, out, err = proc.returncode, proc.stdout, proc.stderr
        with (self.logs / "commands.log").open("a") as f:
            f.write(f"$ {command}\n{out}{err}\n")
        self.outputs.append((command, out))
        assert code == 0, f"{where}: `{command}` exited {code}:\n{(out + err)[-6000:]}"
        self.timings.append((command, time.monotonic() - started))

    def play(self, steps: list[Step]) -> None:
        started = time.monotonic()
        steps_file = self.logs / "pycon-steps.json"
        report_file = self.logs / "pycon-report.json"
        steps_file.write_text(json.dumps(
            [{"examples": [{**ex, "source": self.substitute(str(ex["source"])),
                            "want": self.substitute(str(ex["want"]))}
                           for ex in s.examples], "waits": s.waits} for s in steps]))
        env = user_env({"PYCON_STEPS": str(steps_file), "PYCON_REPORT": str(report_file),
                        "PYCON_DEADLINE": str(self.deadline)})
        script = "\n".join([*self.prelude, f"{self.shell} < {RUNNER}"])
        proc = subprocess.run(["bash", "-c", script], cwd=self.workdir, env=env, text=True,
                              capture_output=True, timeout=INSTALL_TIMEOUT, check=False)
        failure = f"`{self.shell}` exited {proc.returncode}:\n{proc.stdout}{proc.stderr}"
        assert proc.returncode == 0, failure
        assert report_file.exists(), failure
        report = json.loads(report_file.read_text())
        if not report["ok"]:
            failed = report["failed"]
            raise AssertionError(
                f"{self.path.name} line {failed['line']}:\n{failed['source']}"
                f"expected:\n{failed['want']}got (after {report['tries']} tries):\n"
                f"{failed['got']}")
        self.timings.append(("pycon session", time.monotonic() - started))

    def stop(self) -> None:
        for service in reversed(self.started):
            service.stop()


def run_in_terminal(argv: list[str], cwd: Path, env: dict[str, str], answers: list[str],
                    timeout: float = 120) -> tuple[int, str]:
    """Run ``argv`` on a terminal of its own (Django's createsuperuser insists on one) and
    type ``answers``, one at each prompt (output that stops after a colon)."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: the pty is its controlling terminal
        os.chdir(cwd)
        os.execvpe(argv[0], argv, env)
    out = b""
    answered_at = 0
    pending = list(answers)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.2)
            if not ready:
                continue
            try:
                data = os.read(fd, 4096)
            except OSError:  # EIO: the child closed the terminal
                data = b""
            if not data:
                break
            out += data
            # a prompt: output that stops after a colon, not at the end of a line
            if pending and len(out) > answered_at and out.rstrip(b" ").endswith(b":"):
                os.write(fd, pending.pop(0).encode() + b"\n")
                answered_at = len(out)
        else:
            os.kill(pid, 9)
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    return os.waitstatus_to_exitcode(status), out.decode(errors="replace")
