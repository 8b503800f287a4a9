"""How ``run.py`` ends early: each exception maps to an exit status in ``run.main``."""

from __future__ import annotations


class SetupError(Exception):
    """The example cannot run here; the message says what to do."""


class Failed(Exception):
    """Something went wrong after the setup (a process died, a timeout)."""


class Stop(BaseException):
    """SIGTERM or SIGHUP: unwind and stop everything, like Ctrl-C."""

