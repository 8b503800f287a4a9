"""What the distribution tests share: a new user's shell environment, empty virtual
environments, the build of the sdist and the wheel, and long-running processes (workers,
beat, the web server) started from such a venv.

Everything here runs outside the project's own ``.venv``: a venv made here starts empty
(``python -m venv``, no system site-packages) and gets only what a ``pip install`` line puts
in it, from PyPI. Processes run in a temporary directory, so the checkout is not importable.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import ROOT, wait_for

#: pip and builds fetch from PyPI: a slow mirror must not fail the suite at once
INSTALL_TIMEOUT = 600


def user_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a new user's shell: this one's without any virtual environment
    (the project's ``.venv/bin`` leaves PATH), without the test session's variables and
    without Python path overrides, plus ``extra``."""
    own = {str(ROOT / ".venv" / "bin"), str(Path(sys.prefix) / "bin")}
    env = {k: v for k, v in os.environ.items()
           if k not in {"VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "DJANGO_SETTINGS_MODULE",
                        "PYTEST_CURRENT_TEST", "PYTEST_ADDOPTS"}
           and not k.startswith("JOBBERS_TEST_")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if p and p not in own)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def base_python() -> str:
    """The interpreter a user would make a venv with: the one this venv was made from."""
    return str(Path(getattr(sys, "_base_executable", sys.executable)))


def run(cmd: list[str], cwd: Path, log: Path, env: dict[str, str] | None = None,
        timeout: float = INSTALL_TIMEOUT, stdin: str | None = None) -> str:
    """Run ``cmd`` to completion; its output is appended to ``log`` and returned. A non-zero
    exit fails with the output."""
    proc = subprocess.run(cmd, cwd=cwd, env=env or user_env(), capture_output=True, text=True,
                          timeout=timeout, input=stdin, check=False)
    out = proc.stdout + proc.stderr
    with log.open("a") as f:
        f.write(f"$ {' '.join(cmd)}\n{out}\n")
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {proc.returncode} in {cwd}:\n{out[-6000:]}")
    return out


@dataclass
class Venv:
    """A virtual environment made with ``python -m venv`` and nothing else."""

    path: Path

    @classmethod
    def create(cls, path: Path, log: Path) -> Venv:
        run([base_python(), "-m", "venv", str(path)], cwd=path.parent, log=log)
        return cls(path)

    def bin(self, name: str) -> str:
        return str(self.path / "bin" / name)

    @property
    def python(self) -> str:
        return self.bin("python")

    def pip(self, *args: str, cwd: Path, log: Path) -> str:
        return run([self.python, "-m", "pip", *args], cwd=cwd, log=log)

    def distributions(self, cwd: Path, log: Path) -> set[str]:
        """The names of the distributions installed, lower-case (pip itself included)."""
        script = ("import importlib.metadata as m\n"
                  "print('\\n'.join(sorted({d.metadata['Name'].lower() "
                  "for d in m.distributions()})))")
        out = run([self.python, "-c", script], cwd=cwd, log=log)
        return set(out.split())


@dataclass
class Dist:
    sdist: Path
    wheel: Path

    def sdist_names(self) -> list[str]:
        """The sdist's members, without the leading ``jobbers-<version>/``."""
        with tarfile.open(self.sdist) as tar:
            return [m.name.split("/", 1)[1] for m in tar.getmembers()
                    if "/" in m.name and m.isfile()]


def build(source: Path, out: Path, log: Path) -> Dist:
    """``python -m build``: the sdist, then the wheel built from that sdist (so a file the
    sdist lacks breaks the wheel), in an isolated build environment as pip would use."""
    run([sys.executable, "-m", "build", "--outdir", str(out), str(source)], cwd=source, log=log)
    (sdist,) = out.glob("*.tar.gz")
    (wheel,) = out.glob("*.whl")
    return Dist(sdist, wheel)


class Service:
    """A long-running process (worker, beat, web server) in its own session, so that stopping
    it stops its children too; its output goes to a log file."""

    def __init__(self, cmd: list[str], cwd: Path, log: Path, env: dict[str, str]) -> None:
        self.cmd = cmd
        self.log_path = log
        with log.open("w") as f:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=f,
                                         stderr=subprocess.STDOUT, start_new_session=True)

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for_output(self, text: str, timeout: float = 60) -> None:
        def seen() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"{' '.join(self.cmd)} exited {self.proc.returncode}:\n"
                                     f"{self.log[-6000:]}")
            return text in self.log

        wait_for(seen, timeout=timeout, interval=0.1, message=f"{text!r} from {self.cmd}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(20)
        with contextlib.suppress(ProcessLookupError):  # children the parent left behind
            os.killpg(self.proc.pid, signal.SIGKILL)
        if self.proc.poll() is None:
            self.proc.wait(10)


def copy_tree(source: Path, dest: Path) -> None:
    """The checkout's files, as a fresh clone has them (no .git, no venv, no caches)."""
    top_level = {".git", ".venv", "site", "dist", "build"}
    anywhere = {"__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache"}

    def ignore(folder: str, names: list[str]) -> set[str]:
        here = Path(folder).resolve()
        skip = {n for n in names if n in anywhere}
        if here == source.resolve():
            skip |= {n for n in names if n in top_level}
        if here == (source / "example_project").resolve():
            skip |= {"var"} & set(names)
        return skip

    shutil.copytree(source, dest, ignore=ignore)


def elapsed(since: float) -> str:
    return f"{time.monotonic() - since:.1f}s"
