"""Finding tasks by an argument's value: which argument paths are indexed
(``jobbers_indexed_arguments``), how a path reads a value out of a task's arguments, and how
a value is normalized and bounded. Pure.

A **path** names one value of a task's arguments: segments joined by dots, each 1 to 64 of
``A-Z a-z 0-9 _ -``. The first is a keyword argument's name, or a whole number for a
positional argument (``0`` is the first); each next one is a key of the dict reached so far,
or, in a list, a whole number (its index). ``order_id``, ``0``, ``order.customer.id``,
``lines.0.sku``. A keyword name also reads the positional argument of the parameter of
that name where the task's signature is known (registered in the process that publishes or
searches). A key with a dot in it cannot be named.

A **value** is indexed and matched in one normal form (:func:`normalize`): a string without
its surrounding white space, case kept; a whole number in decimals (``42``, ``42.0`` and
``"42"`` are one value); ``true``/``false``; another finite number as Python writes it.
``None``, lists, dicts and strings over :data:`MAX_VALUE_CHARS` characters are never indexed
and never match: a value comes from an untrusted message, so its cost is bounded before
anything looks at it.

**Secrets** are never indexed: a path with a segment that is a redacted key
(``jobbers_redact_keys``: ``password``, ``card_number``...) is refused by the setting (a
:class:`~jobbers_celery.core.errors.ConfigurationError`) and by a search (``ValueError``); a
positional path whose parameter is such a name in the task's signature is skipped, and so
is a string value that looks like a credential (a URL with a password, ``token=...``). An
index holds a digest of the path and value (:func:`digest`), never the value.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from jobbers_celery.core.errors import ConfigurationError
from jobbers_celery.core.records import TaskRecord
from jobbers_celery.core.redaction import Parameters, Redactor

__all__ = ["ANY_TASK", "MAX_INDEXED_PATHS", "MAX_PATH_CHARS", "MAX_PER_VALUE",
           "MAX_VALUE_CHARS", "SCAN_LIMIT", "SCAN_PAYLOAD_MAX", "ArgumentIndex", "ArgumentPath", "SearchError",
           "SearchResult", "digest", "matches", "normalize", "normalize_query"]

#: The name under which paths indexed for every task are set.
ANY_TASK = "*"
#: Characters of a value indexed or matched (a longer string is neither).
MAX_VALUE_CHARS = 256
#: Characters of a path.
MAX_PATH_CHARS = 200
#: Segments of a path.
MAX_SEGMENTS = 8
#: Paths a task's publish indexes at most (its name's and ``"*"``'s together), and paths the
#: setting may name in all.
MAX_INDEXED_PATHS = 32
#: Tasks one value's index keeps, the newest (an older one is still found by the bounded
#: search while it holds its payload).
MAX_PER_VALUE = 10_000
#: Records a search of a path that is not indexed reads at most (newest first), by default
#: (``jobbers_search_scan_limit``).
SCAN_LIMIT = 5_000
#: Characters of a payload the bounded search reads: a record whose payload is longer is
#: counted as read but not matched, so one search holds at most SCAN_LIMIT of these.
SCAN_PAYLOAD_MAX = 64 * 1024
#: Task names the setting may name.
_MAX_NAMES = 256
_SEGMENT_RE = re.compile(r"[A-Za-z0-9_\-]{1,64}")
#: Bits of a whole number normalized (about 300 decimal digits): a bigger one is not a
#: value anyone types, and its text would cost more than the bound.
_MAX_INT_BITS = 1000


class SearchError(ValueError):
    """A search that cannot be made; ``field`` names the input at fault (``argument``,
    ``value``, ``name``, ``limit``), for a front end's 400."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


@dataclass(frozen=True, slots=True)
class ArgumentPath:
    """A parsed path: the positional index or keyword name first, then the keys."""

    text: str
    first: int | str
    rest: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: object) -> ArgumentPath:
        """Raises ``ValueError`` saying what is wrong (never quoting more than the bound)."""
        if not isinstance(text, str):
            raise ValueError(f"a path is a string, not {type(text).__name__}")  # noqa: TRY004
        if not text or len(text) > MAX_PATH_CHARS:
            raise ValueError(f"a path is 1 to {MAX_PATH_CHARS} characters")
        segments = text.split(".")
        if len(segments) > MAX_SEGMENTS:
            raise ValueError(f"a path has at most {MAX_SEGMENTS} segments")
        for segment in segments:
            if not _SEGMENT_RE.fullmatch(segment):
                raise ValueError(
                    f"{text!r}: each segment of a path is 1 to 64 of A-Z a-z 0-9 _ - "
                    "(segments joined by dots; a whole number first: a positional argument)")
        head = segments[0]
        return cls(text, int(head) if head.isdigit() else head, tuple(segments[1:]))

    @property
    def positional(self) -> bool:
        return isinstance(self.first, int)

    def keys(self) -> list[str]:
        """The segments that are dict keys or keyword names (what the redaction rule reads)."""
        named = [] if isinstance(self.first, int) else [self.first]
        return named + [s for s in self.rest if not s.isdigit()]

    def secret(self, redact: Redactor, params: Parameters | None = None) -> bool:
        """Whether a value this path reads is secret: a key of it is a redacted key, or the
        parameter of its positional argument is named as one (``params`` known)."""
        if any(redact.is_secret_key(k) for k in self.keys()):
            return True
        if isinstance(self.first, int) and params is not None:
            return redact.is_secret_key(params.name_of(self.first))
        return False

    def read(self, args: Any, kwargs: Any, params: Parameters | None = None) -> Any:
        """The value at this path, ``None`` where there is none (or where the arguments
        are not a list and a dict). A keyword name also reads the positional argument of
        the parameter of that name (``params`` known): ``order_id`` finds
        ``import_order(7)`` of ``def import_order(order_id)`` too."""
        value: Any
        first = self.first
        if isinstance(first, str) and params is not None and first in params.positional and (
                not isinstance(kwargs, Mapping) or first not in kwargs):
            first = params.positional.index(first)
        if isinstance(first, int):
            if not isinstance(args, list | tuple) or first >= len(args):
                return None
            value = args[first]
        else:
            if not isinstance(kwargs, Mapping):
                return None
            value = kwargs.get(first)
        for segment in self.rest:
            if isinstance(value, Mapping):
                value = value.get(segment)
            elif isinstance(value, list | tuple) and segment.isdigit():
                n = int(segment)
                value = value[n] if n < len(value) else None
            else:
                return None
        return value


def normalize(value: Any) -> str | None:
    """The form a value is indexed and matched in; ``None``: not indexable (see the module)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value) if value.bit_length() <= _MAX_INT_BITS else None
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        if value.is_integer() and abs(value) < 2**63:
            return str(int(value))
        return repr(value)
    if isinstance(value, str):
        if len(value) > MAX_VALUE_CHARS + 64:  # bounded before it is stripped
            return None
        text = value.strip()
        return text if 0 < len(text) <= MAX_VALUE_CHARS else None
    return None


def normalize_query(text: object) -> str:
    """A value someone searches for, in normal form; raises ``ValueError`` when it is
    empty or over :data:`MAX_VALUE_CHARS` characters (no indexed value could match)."""
    if not isinstance(text, str):
        raise ValueError("the value is a string")  # noqa: TRY004
    found = normalize(text)
    if found is None:
        raise ValueError(f"the value is 1 to {MAX_VALUE_CHARS} characters (surrounding "
                         "white space left out)")
    return found


def digest(path: str, value: str) -> str:
    """The index's name for ``value`` at ``path``: 32 hex digits of BLAKE2b (the value is
    never in a key, and a key's length never depends on it)."""
    data = f"{path}\x00{value}".encode("utf-8", "surrogatepass")
    return hashlib.blake2b(data, digest_size=16).hexdigest()


@dataclass(frozen=True, slots=True)
class ArgumentIndex:
    """The paths indexed per task name (``"*"``: every task), read from the setting."""

    paths: Mapping[str, tuple[ArgumentPath, ...]] = field(default_factory=dict)

    @classmethod
    def from_setting(cls, setting: object, redact: Redactor) -> ArgumentIndex:
        """``{"shop.tasks.import_order": ["order_id", "0"], "*": ["customer_id"]}``;
        raises :class:`ConfigurationError` naming what is wrong."""
        where = "jobbers_indexed_arguments"
        if setting is None:
            return cls()
        if not isinstance(setting, Mapping):
            raise ConfigurationError(
                f"{where} must be a dict of task name (or \"*\") -> list of argument paths, "
                f"got {type(setting).__name__}")
        if len(setting) > _MAX_NAMES:
            raise ConfigurationError(f"{where} names at most {_MAX_NAMES} tasks")
        out: dict[str, tuple[ArgumentPath, ...]] = {}
        total = 0
        for name, paths in setting.items():
            if not isinstance(name, str) or not name or len(name) > 256:
                raise ConfigurationError(f"{where}: a key is a task name (or \"*\"), "
                                         f"got {name!r:.80}")
            if isinstance(paths, str) or not isinstance(paths, Sequence):
                raise ConfigurationError(f"{where}[{name!r}] must be a list of argument "
                                         f"paths, got {paths!r:.80}")
            parsed: list[ArgumentPath] = []
            for text in paths:
                try:
                    path = ArgumentPath.parse(text)
                except ValueError as exc:
                    raise ConfigurationError(f"{where}[{name!r}]: {exc}") from None
                if path.secret(redact):
                    raise ConfigurationError(
                        f"{where}[{name!r}]: {path.text!r} reads a redacted key "
                        "(jobbers_redact_keys): a secret is never indexed")
                if path not in parsed:
                    parsed.append(path)
            total += len(parsed)
            out[name] = tuple(parsed)
        if total > MAX_INDEXED_PATHS:
            raise ConfigurationError(f"{where} names at most {MAX_INDEXED_PATHS} paths in "
                                     f"all, got {total}")
        return cls(out)

    def __bool__(self) -> bool:
        return any(self.paths.values())

    def of(self, name: str) -> tuple[ArgumentPath, ...]:
        """The paths a publish of ``name`` indexes (its own, then ``"*"``'s)."""
        own = self.paths.get(name, ())
        shared = self.paths.get(ANY_TASK, ())
        if not shared:
            return own
        return own + tuple(p for p in shared if p not in own)

    def covers(self, path: str, name: str | None) -> tuple[str, ...]:
        """The task names whose publishes index ``path`` (``"*"``: every task), as far as a
        search of ``name`` (``None``: any) reads them: empty when the index cannot answer."""
        names = tuple(n for n, paths in self.paths.items()
                      if any(p.text == path for p in paths))
        if ANY_TASK in names:
            return (ANY_TASK,)
        if name is not None:
            return (name,) if name in names else ()
        return names

    def entries(self, name: str, args: Any, kwargs: Any, redact: Redactor,
                params: Parameters | None = None) -> list[str]:
        """The digests a publish of ``name`` with these arguments is indexed under (its
        values at the paths of :meth:`of` that are indexable and not secret)."""
        out: list[str] = []
        for path in self.of(name):
            # a position whose parameter is unknown here may be a secret one: not indexed
            if path.positional and (params is None or path.secret(redact, params)):
                continue
            value = normalize(path.read(args, kwargs, params))
            if value is None or _looks_secret(value, redact):
                continue
            key = digest(path.text, value)
            if key not in out:
                out.append(key)
        return out


def _looks_secret(value: str, redact: Redactor) -> bool:
    """A string the redaction rule would hide in part (a URL with a password, ``token=``)."""
    return redact.text(value) != value


def matches(path: ArgumentPath, value: str, args: Any, kwargs: Any, redact: Redactor,
            params: Parameters | None = None) -> bool:
    """Whether these arguments hold ``value`` (normal form) at ``path``: the bounded
    search's test, the index's rule (a secret never matches; nor a position whose
    parameter is unknown here, which may be a secret one: a match would confirm a guess)."""
    if path.positional and (params is None or path.secret(redact, params)):
        return False
    found = normalize(path.read(args, kwargs, params))
    return found == value and not _looks_secret(found, redact)


@dataclass(frozen=True, slots=True)
class SearchResult:
    """What a search found, newest first, and how: through the index (``indexed``:
    the names it covers, ``"*"`` for all) or by reading the newest ``examined`` of ``of``
    records (of the name, or of every task) that still held their arguments."""

    path: str
    value: str
    name: str | None
    tasks: list[TaskRecord]
    indexed: tuple[str, ...] = ()
    examined: int = 0
    of: int = 0
    #: more matched than the limit asked for
    more: bool = False

    @property
    def how(self) -> str:
        """One line for people: which way the tasks were found."""
        if self.indexed:
            names = "every task" if self.indexed == (ANY_TASK,) else ", ".join(self.indexed)
            return f"indexed argument (for {names})"
        return (f"searched the arguments of the last {self.examined:,} of {self.of:,} "
                f"tasks{' named ' + self.name if self.name else ''}")
