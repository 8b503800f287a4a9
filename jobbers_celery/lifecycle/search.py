"""Finding tasks by an argument's value: the index a publish writes, and the search.

The rule (paths, normal form, secrets, bounds) is :mod:`jobbers_celery.core.search`'s; the
index is written by the publish's own ``submit`` step (no round trip of its own) and read by
:mod:`jobbers_celery.store.search`. A path that is not indexed for the task name searched
is looked for in the newest ``jobbers_search_scan_limit`` records (of that name, or of every
task) that still hold their arguments: a completed task keeps none (its payload is deleted
when it completes), nor does a dead letter whose sink holds its payload. The answer says
which way it went and how much it read (:attr:`SearchResult.how`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from jobbers_celery.core.codec import CannotOpen, PayloadCodec
from jobbers_celery.core.intake import identity_over_limits
from jobbers_celery.core.redaction import Parameters, Redactor, parameters
from jobbers_celery.core.search import (
    ArgumentIndex,
    ArgumentPath,
    SearchError,
    SearchResult,
    digest,
    matches,
    normalize_query,
)
from jobbers_celery.lifecycle import payload as pl
from jobbers_celery.store.parts import SearchStore

__all__ = ["MAX_LIMIT", "ArgumentSearch"]

#: Tasks one search answers at most.
MAX_LIMIT = 1000
#: Task names whose parameters are kept read (a publish of a name it has not seen reads
#: them once).
_PARAMS_KEPT = 1024


class ArgumentSearch:
    """The index entries of a publish (:meth:`entries`, the recorder's) and the search
    (:meth:`find`, :meth:`Jobbers.search <jobbers_celery.Jobbers.search>`'s)."""

    def __init__(self, store: SearchStore, index: ArgumentIndex, redact: Redactor,
                 codec: PayloadCodec | None, scan_limit: int,
                 tasks: Callable[[str], Any] | None = None) -> None:
        """``tasks``: the task registered under a name (``app.tasks.get``), whose signature
        says which positional parameters are secret."""
        self.store = store
        self.index = index
        self.redact = redact
        self.codec = codec
        self.scan_limit = scan_limit
        self._tasks = tasks
        self._params: dict[str, Parameters | None] = {}

    def params(self, name: str) -> Parameters | None:
        """The positional parameter names of task ``name`` in this process (``None``:
        not registered here)."""
        try:
            return self._params[name]
        except KeyError:
            pass
        task = self._tasks(name) if self._tasks is not None else None
        if task is None:
            return None  # not registered (yet): asked again next time
        run = getattr(task, "run", None)
        found = parameters(run) if run is not None else None
        if len(self._params) >= _PARAMS_KEPT:
            self._params.clear()
        self._params[name] = found
        return found

    def entries(self, name: str, args: Any, kwargs: Any) -> list[str]:
        """The digests a publish of ``name`` is indexed under (empty: none)."""
        if not self.index.of(name):
            return []
        return self.index.entries(name, args, kwargs, self.redact, self.params(name))

    def find(self, argument: str, value: str, name: str | None = None,
             limit: int = 100) -> SearchResult:
        """Tasks whose ``argument`` (a path) holds ``value``, newest first, at most
        ``limit``. Raises :class:`SearchError` (a ``ValueError`` naming the input) for a
        malformed path, a value out of bounds, a path that reads a secret, or a limit out
        of 1 to :data:`MAX_LIMIT`."""
        try:
            path = ArgumentPath.parse(argument)
        except ValueError as exc:
            raise SearchError("argument", str(exc)) from None
        try:
            wanted = normalize_query(value)
        except ValueError as exc:
            raise SearchError("value", str(exc)) from None
        if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_LIMIT:
            raise SearchError("limit", f"limit is a whole number from 1 to {MAX_LIMIT}")
        if name is not None and (not isinstance(name, str) or not name
                                 or identity_over_limits("x", name)):
            raise SearchError("name", "name is a task name within the intake limits")
        if path.secret(self.redact) or (
                name is not None and path.secret(self.redact, self.params(name))):
            raise SearchError("argument", f"{path.text!r} reads a redacted key "
                              "(jobbers_redact_keys): secrets are never searched")
        covers = self.index.covers(path.text, name)
        if covers:
            # one value's index holds every name indexing the path: read past the others
            found = self.store.indexed(digest(path.text, wanted),
                                       limit + 1 if name is None else 4 * (limit + 1))
            if name is not None:
                found = [r for r in found if r.name == name]
            return SearchResult(path.text, wanted, name, found[:limit], indexed=covers,
                                more=len(found) > limit)
        if path.positional and (name is None or self.params(name) is None):
            raise SearchError("argument", f"{path.text!r} is a position: it is searched only "
                              "through an index, or by task name where this process knows the "
                              "task's parameters (a position may hold a secret); name a keyword")
        rows, total = self.store.recent(name, self.scan_limit)
        hits = []
        for record, msg in rows:
            if msg is None or not self._holds(record.name, msg, path, wanted):
                continue
            hits.append(record)
        return SearchResult(path.text, wanted, name, hits[:limit], examined=len(rows),
                            of=total, more=len(hits) > limit)

    def _holds(self, name: str, msg: str, path: ArgumentPath, wanted: str) -> bool:
        """Whether the payload ``msg`` holds ``wanted`` at ``path`` (opened where this
        process holds the key that sealed it; one it cannot open or read never matches)."""
        try:
            data = pl.loads(msg)
            if not isinstance(data, dict):
                return False
            args, kwargs = pl.open_arguments(data.get("args"), data.get("kwargs"), self.codec)
        except (CannotOpen, ValueError, TypeError):
            return False
        return matches(path, wanted, args, kwargs, self.redact, self.params(name))
