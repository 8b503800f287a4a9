"""The pieces of Celery's revoke that need no worker (the rest: tests/integration/test_revoke.py)."""

from __future__ import annotations

import pickle
import signal

from celery.exceptions import Ignore

from jobbers_celery.worker.request import revoke_reason
from jobbers_celery.worker.task import Revoked


def test_the_revoke_reason_names_the_signal_however_celery_passes_it() -> None:
    for given in (signal.SIGTERM, int(signal.SIGTERM), "SIGTERM", "TERM", None):
        assert revoke_reason(given) == "revoked with terminate (SIGTERM)", given
    assert revoke_reason("SIGKILL") == "revoked with terminate (SIGKILL)"
    assert revoke_reason("NOPE") == "revoked with terminate (NOPE)"


def test_revoked_is_an_ignore_that_crosses_the_pool_pipe() -> None:
    # a prefork child sends it back to the main process pickled (billiard's result pipe)
    back = pickle.loads(pickle.dumps(Revoked("cancellation honoured")))
    assert isinstance(back, Revoked)
    assert isinstance(back, Ignore)
    assert back.reason == "cancellation honoured"
