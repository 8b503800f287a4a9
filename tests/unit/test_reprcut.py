"""The cut copy of large arguments gives Celery's own ``argsrepr`` text (core/reprcut.py)."""

from __future__ import annotations

from collections import OrderedDict, namedtuple
from decimal import Decimal
from typing import Any

from celery import Celery
from celery.utils.functional import regen
from celery.utils.saferepr import saferepr
from hypothesis import given, settings
from hypothesis import strategies as st

from jobbers_celery.core import reprcut
from jobbers_celery.worker import taskrepr

Pair = namedtuple("Pair", "x y")


class Blank:
    """An object whose repr is empty: it costs no character of the cut."""

    def __repr__(self) -> str:
        return ""


class Rows(list):  # type: ignore[type-arg]  # a list subclass: saferepr writes it as a list
    pass


_leaves = st.one_of(
    st.integers(-10**6, 10**6), st.booleans(), st.none(), st.floats(allow_nan=False),
    st.text(max_size=8), st.binary(max_size=4), st.just(Blank()), st.just(Decimal("1.5")),
    st.just(frozenset({1})))
_keys = st.one_of(st.text(max_size=6), st.integers(-99, 99), st.tuples(st.integers()))


def _containers(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.lists(children, max_size=12),
        st.lists(children, max_size=12).map(tuple),
        st.lists(children, max_size=12).map(Rows),
        st.dictionaries(_keys, children, max_size=8),
        st.dictionaries(_keys, children, max_size=8).map(OrderedDict),
        st.tuples(children, children).map(lambda t: Pair(*t)),
        st.lists(children, max_size=12).map(lambda items: regen(iter(items))),
    )


_values = st.recursive(_leaves, _containers, max_leaves=60)


@settings(max_examples=600, deadline=None)
@given(value=_values.filter(lambda v: v is not None), maxlen=st.integers(1, 80),
       maxlevels=st.integers(1, 5))
def test_the_cut_copy_reads_as_the_whole(value: Any, maxlen: int, maxlevels: int) -> None:
    part = reprcut.shown_part(value, maxlen, maxlevels)
    assert part is not None
    assert saferepr(part, maxlen, maxlevels=maxlevels) == saferepr(value, maxlen,
                                                                   maxlevels=maxlevels)


@settings(max_examples=200, deadline=None)
@given(size=st.integers(0, 3000), maxlen=st.integers(1, 1100),
       shape=st.sampled_from(["pairs", "ids", "rows", "nested"]))
def test_large_arguments_at_celerys_sizes(size: int, maxlen: int, shape: str) -> None:
    value: Any = {
        "pairs": ({"task": "bench.add", "args": []}, regen(iter([(i, i) for i in range(size)]))),
        "ids": ([f"id-{i}" for i in range(size)],),
        "rows": ({"rows": [{"id": i, "name": ""} for i in range(size)]},),
        "nested": ([[i] * 3 for i in range(size)], [Blank()] * size),
    }[shape]
    part = reprcut.shown_part(value, maxlen, 3)
    assert saferepr(part, maxlen, maxlevels=3) == saferepr(value, maxlen, maxlevels=3)


def test_a_copy_keeps_no_more_than_the_cut_can_show() -> None:
    part = reprcut.shown_part(([(i, i) for i in range(100_000)],), 1024, 3)
    assert part is not None
    assert len(part[0]) <= reprcut.budget(1024) + 2


def test_a_cycle_and_no_level_limit_are_left_to_celery() -> None:
    loop: list[Any] = [1, 2]
    loop.append(loop)
    assert reprcut.shown_part(loop, 100, 3) is None
    assert reprcut.shown_part([1, 2], 100, 0) is None


def test_only_large_arguments_are_copied() -> None:
    assert not reprcut.is_large((1, 2, "x"))
    assert not reprcut.is_large({"a": "x" * 10_000})
    assert reprcut.is_large((list(range(reprcut.LARGE + 1)),))
    assert reprcut.is_large({"ids": list(range(reprcut.LARGE + 1))})
    assert reprcut.is_large(tuple(range(reprcut.LARGE + 1)))


def test_the_reprs_passed_to_celery_are_celerys_own() -> None:
    app = Celery("reprs", set_as_current=False)
    args = ({"task": "bench.add"}, [(i, i) for i in range(10_000)])
    kwargs = {"ids": list(range(5_000)), "name": "x"}
    got = taskrepr.celery_reprs(app, args, kwargs)
    levels = app.conf.task_repr_maxlevels
    assert got == {
        "argsrepr": saferepr(args, app.amqp.argsrepr_maxsize, maxlevels=levels),
        "kwargsrepr": saferepr(kwargs, app.amqp.kwargsrepr_maxsize, maxlevels=levels)}
    assert taskrepr.celery_reprs(app, (1, 2), {}) == {}


def test_large_arguments_with_a_secret_are_redacted_as_before() -> None:
    from jobbers_celery import JobbersTask
    from jobbers_celery.core.redaction import redactor

    app = Celery("reprs-secret", set_as_current=False)

    @app.task(base=JobbersTask, name="t.load")
    def load(rows: list[Any], password: str) -> None: ...

    args = ([{"id": i, "token": f"tok-{i}"} for i in range(2_000)], "hunter2")
    body: tuple[Any, ...] = (args, {}, {})
    ours = taskrepr.celery_reprs(app, args, {})
    celerys = {"argsrepr": saferepr(args, app.amqp.argsrepr_maxsize,
                                    maxlevels=app.conf.task_repr_maxlevels), "kwargsrepr": "{}"}
    assert ours["argsrepr"] == celerys["argsrepr"]
    headers = {"argsrepr": ours["argsrepr"], "kwargsrepr": "{}"}
    taskrepr.redact_headers(app, load, headers, body, redactor())
    taskrepr.redact_headers(app, load, celerys, body, redactor())
    assert headers == celerys
    assert "tok-1" not in headers["argsrepr"]


def test_no_cut_configured_is_left_to_celery() -> None:
    app = Celery("reprs-nocut", set_as_current=False)
    app.amqp.argsrepr_maxsize = None  # type: ignore[assignment]
    assert reprcut.shown_part(list(range(1000)), None, 3) is None  # type: ignore[arg-type]
    assert "argsrepr" not in taskrepr.celery_reprs(app, (list(range(1000)),), {})


def test_the_reprs_jobbers_passes_do_not_travel_in_the_message_properties() -> None:
    """Celery copies apply_async's leftover options into the message's properties: the
    repr jobbers passes must not travel there unredacted (found by review)."""
    from jobbers_celery import JobbersTask
    from jobbers_celery.testing import InMemoryDeadLetterSink, InMemoryStore, in_memory
    from tests.unit.test_fast_bulk_publish import FakeProducer, default_producer

    app = Celery("reprs-props", broker="memory://", set_as_current=False)
    store = InMemoryStore()
    in_memory(app, store, InMemoryDeadLetterSink())

    @app.task(base=JobbersTask, name="t.load2", shared=False)
    def load(rows: list[Any], password: str) -> None: ...

    seen: list[dict[str, Any]] = []

    class Recording(FakeProducer):
        def publish(self, body: Any, **kwargs: Any) -> None:
            seen.append(kwargs)
            super().publish(body, **kwargs)

    producer = Recording(store)
    with default_producer(app, producer):
        load.delay([{"id": i, "token": f"tok-{i}"} for i in range(300)], "hunter2")
    (sent,) = seen
    assert "argsrepr" not in sent
    assert "kwargsrepr" not in sent
    assert "tok-1" not in sent["headers"]["argsrepr"]
    assert "hunter2" not in sent["headers"]["argsrepr"]
