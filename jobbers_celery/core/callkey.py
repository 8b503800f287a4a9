"""What a call's key is made of, one convention for the three flow controls that key by
arguments (``Unique``, ``RateLimit``, ``concurrency_key``). Pure.

``on`` names arguments: a name, a position (``>= 0``) or a non-empty tuple of them. An
argument is the task's parameter, however the caller passed it: a name is found whether it
was passed by name or by position, a position whether by position or by its parameter's
name, and a parameter the call leaves out is its default. That needs the task's ``run``
(Celery's is bound, so a bound task's ``self`` is not counted); without it (a task unknown
to this process) arguments are read as called. ``key`` instead: a function of
``(args, kwargs)``, as called, returning any JSON value. Each control passes its own error
class (a ``ValueError``): a key a call does not give raises it, naming the argument or the
exception type, never a value (arguments can be secrets).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, TypeGuard

from jobbers_celery.core.errors import InvalidTaskOption
from jobbers_celery.core.keydigest import canonical_json

__all__ = ["Arg", "KeyFunction", "On", "bind_all", "call_key", "check", "describe", "is_on",
           "select"]

Arg = str | int
On = Arg | tuple[Arg, ...]
KeyFunction = Callable[[tuple[Any, ...], dict[str, Any]], Any]

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


@dataclass(frozen=True, slots=True)
class _Shape:
    """A task function's signature, read once per function."""

    signature: inspect.Signature
    positional: tuple[str, ...]

    def default(self, name: str) -> Any:
        param = self.signature.parameters.get(name)
        return inspect.Parameter.empty if param is None else param.default


def _read(run: Callable[..., Any]) -> _Shape | None:
    try:
        sig = inspect.signature(run)
    except (TypeError, ValueError):
        return None
    return _Shape(sig, tuple(p.name for p in sig.parameters.values() if p.kind in _POSITIONAL))


_cached = lru_cache(maxsize=1024)(_read)


def _shape(run: Callable[..., Any] | None) -> _Shape | None:
    """``run``'s signature (``None``: no ``run``, or one it cannot be read from); cached per
    function (a bound ``run`` is a new object on each access, equal to the last)."""
    if run is None:
        return None
    try:
        return _cached(run)
    except TypeError:  # an unhashable callable: read each time
        return _read(run)


def _is_arg(value: object) -> bool:
    if isinstance(value, str):
        return value.isidentifier()
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def is_on(value: object) -> TypeGuard[On]:
    """Whether ``value`` is an ``on``: a name, a position or a non-empty tuple of them."""
    return _is_arg(value) or (isinstance(value, tuple) and len(value) > 0
                              and all(_is_arg(a) for a in value))


def check(on: object, key: object, where: str) -> On | None:
    """``on`` as declared (a list is taken as a tuple), checked with ``key``; raises
    :class:`InvalidTaskOption` saying ``where`` (``"rate_limit_by"``)."""
    if isinstance(on, list):
        on = tuple(on)
    if on is not None and not is_on(on):
        raise InvalidTaskOption(f"{where}: on must be an argument name, a position >= 0 or a "
                                f"non-empty tuple of them, got {on!r}")
    if key is not None and (on is not None or not callable(key)):
        raise InvalidTaskOption(f"{where}: key is a function of (args, kwargs), and takes "
                                "the place of on")
    return on


def select(on: On, run: Callable[..., Any] | None, args: Sequence[Any],
           kwargs: Mapping[str, Any], what: str, error: type[ValueError]) -> Any:
    """The value ``on`` names in a call of ``run`` (a list of values for a tuple). Raises
    ``error`` (``what``: ``"the rate-limit key"``) for an argument the call does not give."""
    shape = _shape(run)
    if isinstance(on, tuple):
        return [_value(a, shape, args, kwargs, what, error) for a in on]
    return _value(on, shape, args, kwargs, what, error)


def _value(arg: Arg, shape: _Shape | None, args: Sequence[Any], kwargs: Mapping[str, Any],
           what: str, error: type[ValueError]) -> Any:
    if isinstance(arg, int):
        if arg < len(args):
            return args[arg]
        name = shape.positional[arg] if shape and arg < len(shape.positional) else None
    else:
        name = arg
        if name not in kwargs and shape is not None and name in shape.positional:
            pos = shape.positional.index(name)
            if pos < len(args):
                return args[pos]
    if name is not None:
        if name in kwargs:
            return kwargs[name]
        if shape is not None:
            default = shape.default(name)
            if default is not inspect.Parameter.empty:
                return default
    shown = repr(arg) if isinstance(arg, str) else f"#{arg}"
    raise error(f"{what} argument {shown} was not passed (the call passes {len(args)} "
                "positional arguments)")


def call_key(key: KeyFunction, args: Sequence[Any], kwargs: Mapping[str, Any], what: str,
             error: type[ValueError]) -> Any:
    """What ``key`` returns for a call; its exception becomes ``error`` naming its type only
    (its message may hold an argument's value)."""
    try:
        return key(tuple(args), dict(kwargs))
    except Exception as exc:  # noqa: BLE001 - the user's function: said, not shown
        raise error(f"{what} function raised {type(exc).__name__}") from None


def bind_all(run: Callable[..., Any] | None, args: Sequence[Any], kwargs: Mapping[str, Any]
             ) -> dict[str, Any] | None:
    """Every argument of a call of ``run`` by its parameter's name, an argument equal to its
    parameter's default left out (so a value passed by name or by position, given or left
    to its default, is the same; and a parameter added later with a default does not change
    the key of calls that do not pass it); ``None`` when there is no ``run`` or the call
    does not fit its signature."""
    shape = _shape(run)
    if shape is None:
        return None
    try:
        bound = shape.signature.bind(*args, **kwargs)
    except TypeError:
        return None
    out: dict[str, Any] = {}
    for name, value in bound.arguments.items():
        param = shape.signature.parameters[name]
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            if value:
                out[name] = value
        elif param.default is param.empty or not _same(value, param.default):
            out[name] = value
    return out


def _same(value: object, default: object) -> bool:
    """Equal as a key (their canonical JSON), never by ``==``, which a value may define
    as it likes; a value JSON cannot write is not its default."""
    try:
        return canonical_json(value) == canonical_json(default)
    except (TypeError, ValueError):
        return value is default


def describe(on: On | None, key: KeyFunction | None, neither: str) -> str:
    """What a key is made of, for the operators (never a value); ``neither``: the text for
    no ``on`` and no ``key``."""
    if key is not None:
        return f"function {getattr(key, '__qualname__', type(key).__name__)}"
    if on is None:
        return neither
    return ", ".join(f"argument {a!r}" if isinstance(a, str) else f"argument #{a}"
                     for a in (on if isinstance(on, tuple) else (on,)))
