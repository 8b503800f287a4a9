"""The argument search: the path and value rule (core/search.py, with property tests of the
parsing and bounds), the setting, and the index and bounded search on the in-memory fakes
(a publish indexes its values in its own submit step; a completed task is found through the
index, never through the scan; a secret is never indexed nor searched)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from celery import Celery
from hypothesis import given
from hypothesis import strategies as st

from jobbers_celery import TaskState
from jobbers_celery.core.config import JobbersConfig
from jobbers_celery.core.errors import ConfigurationError
from jobbers_celery.core.redaction import Parameters, redactor
from jobbers_celery.core.search import (
    MAX_PATH_CHARS,
    MAX_VALUE_CHARS,
    ArgumentIndex,
    ArgumentPath,
    digest,
    matches,
    normalize,
    normalize_query,
)
from jobbers_celery.jobbers import Jobbers
from jobbers_celery.testing import InMemoryDeadLetterSink, InMemoryStore, in_memory

R = redactor()
S = TaskState

# ---------------------------------------------------------------------- the rule


def test_a_path_names_a_keyword_or_a_position_then_keys_and_indexes() -> None:
    assert ArgumentPath.parse("order_id") == ArgumentPath("order_id", "order_id")
    path = ArgumentPath.parse("0.lines.2.sku")
    assert (path.first, path.rest, path.positional) == (0, ("lines", "2", "sku"), True)
    assert path.read([{"lines": [{}, {}, {"sku": "A-1"}]}], {}) == "A-1"
    assert ArgumentPath.parse("order.id").read([], {"order": {"id": 7}}) == 7
    assert ArgumentPath.parse("3").read([1], {}) is None
    assert ArgumentPath.parse("a.0").read([], {"a": {"0": "x"}}) == "x"  # a dict's key
    assert ArgumentPath.parse("a.b").read([], {"a": [1]}) is None
    # a keyword name reads the positional argument of its parameter, where it is known
    params = Parameters(("ref", "order_id"))
    assert ArgumentPath.parse("order_id").read(["r", 7], {}, params) == 7
    assert ArgumentPath.parse("order_id").read(["r", 7], {"order_id": 8}, params) == 8
    assert ArgumentPath.parse("order_id").read(["r", 7], {}) is None


@pytest.mark.parametrize("bad", ["", "a..b", "a b", "a.", "x" * (MAX_PATH_CHARS + 1),
                                 ".".join("a" * 9), "a/b", "ä", 7, None])
def test_a_malformed_path_is_refused(bad: Any) -> None:
    with pytest.raises(ValueError, match="path"):
        ArgumentPath.parse(bad)


@given(st.text(max_size=400))
def test_parsing_any_text_either_gives_a_path_or_says_why(text: str) -> None:
    try:
        path = ArgumentPath.parse(text)
    except ValueError as exc:
        said = str(exc)
    else:
        said = ""
        assert path.text == text
        assert len(text) <= MAX_PATH_CHARS
    if said:
        assert "path" in said
        assert len(said) < 400  # never quotes more than the bound


def test_values_have_one_normal_form() -> None:
    assert normalize(42) == normalize(42.0) == normalize("42") == normalize(" 42 ") == "42"
    assert normalize(True) == "true"
    assert normalize(False) == "false"
    assert normalize(1.5) == "1.5"
    assert normalize("AB-12") == "AB-12"  # case kept
    for never in (None, [1], {"a": 1}, float("nan"), float("inf"), "", "   ",
                  "x" * (MAX_VALUE_CHARS + 1), 10**400):
        assert normalize(never) is None


@given(st.one_of(st.text(max_size=600), st.integers(), st.floats(), st.booleans(), st.none(),
                 st.lists(st.integers(), max_size=3)))
def test_a_normal_form_is_bounded_and_stable(value: Any) -> None:
    found = normalize(value)
    if found is not None:
        assert 0 < len(found) <= MAX_VALUE_CHARS
        assert normalize(found) == found  # what a search types finds it
        assert normalize_query(found) == found


def test_a_query_out_of_bounds_is_refused() -> None:
    for bad in ("", "  ", "x" * (MAX_VALUE_CHARS + 1)):
        with pytest.raises(ValueError, match="1 to"):
            normalize_query(bad)


def test_a_digest_never_holds_the_value_and_tells_paths_apart() -> None:
    key = digest("order_id", "91800")
    assert len(key) == 32
    assert "91800" not in key
    assert key != digest("customer_id", "91800") != digest("order_id", "91801")


def test_the_setting_is_read_and_checked() -> None:
    index = ArgumentIndex.from_setting({"shop.import": ["order_id", "0"], "*": ["customer"]}, R)
    assert [p.text for p in index.of("shop.import")] == ["order_id", "0", "customer"]
    assert [p.text for p in index.of("other")] == ["customer"]
    assert index.covers("order_id", None) == ("shop.import",)
    assert index.covers("order_id", "other") == ()
    assert index.covers("customer", "other") == ("*",)
    assert not ArgumentIndex.from_setting({}, R)
    for bad, said in (([1], "dict"), ({"x": "order_id"}, "list"), ({"x": ["a b"]}, "segment"),
                      ({"": ["a"]}, "task name"), ({"x": [f"p{i}" for i in range(33)]},
                                                    "at most")):
        with pytest.raises(ConfigurationError, match=said):
            ArgumentIndex.from_setting(bad, R)


@pytest.mark.parametrize("path", ["password", "user.api_key", "card_number", "0.token",
                                  "customer.db_pwd"])
def test_a_path_reading_a_redacted_key_is_refused_by_the_setting(path: str) -> None:
    with pytest.raises(ConfigurationError, match="redacted key"):
        ArgumentIndex.from_setting({"*": [path]}, R)
    with pytest.raises(ConfigurationError, match="redacted key"):
        JobbersConfig.from_mapping({"jobbers_indexed_arguments": {"*": [path]}},
                                   "redis://localhost")


def test_the_scan_limit_is_bounded() -> None:
    for bad in (0, -1, True, "5", 10**7):
        with pytest.raises(ConfigurationError, match="search_scan_limit"):
            JobbersConfig.from_mapping({"jobbers_search_scan_limit": bad}, "redis://localhost")


def test_secrets_are_never_indexed_nor_matched() -> None:
    index = ArgumentIndex.from_setting({"login": ["1", "user"]}, R)
    params = Parameters(("user", "password"))
    # the password parameter never; the user, read by its parameter's name
    assert index.entries("login", ["ann", "hunter22"], {}, R, params) == [digest("user", "ann")]
    # its parameters unknown (published by name), a position may be the secret one: never
    assert index.entries("login", ["ann", "hunter22"], {}, R, None) == []
    assert not matches(ArgumentPath.parse("1"), "hunter22", ["ann", "hunter22"], {}, R, None)
    # a value that looks like a credential
    assert index.entries("login", [], {"user": "postgres://u:hunter22@db/x"}, R) == []
    assert not matches(ArgumentPath.parse("1"), "hunter22", ["ann", "hunter22"], {}, R, params)
    assert matches(ArgumentPath.parse("user"), "ann", [], {"user": "ann"}, R)


@given(st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=40)),
                    lambda inner: st.one_of(st.lists(inner, max_size=4),
                                            st.dictionaries(st.text(max_size=8), inner,
                                                            max_size=4)),
                    max_leaves=20),
       st.sampled_from(["0", "a", "a.b", "0.1", "a.0.b"]))
def test_reading_any_arguments_never_raises_and_the_index_agrees_with_the_match(
        value: Any, text: str) -> None:
    path = ArgumentPath.parse(text)
    args, kwargs = [value], {"a": value}
    index = ArgumentIndex.from_setting({"t": [text]}, R)
    entries = index.entries("t", args, kwargs, R)
    found = normalize(path.read(args, kwargs))
    assert len(entries) <= 1
    if entries:
        assert found is not None
        assert entries == [digest(text, found)]
        assert matches(path, found, args, kwargs, R)


# ---------------------------------------------------------------------- on the fakes
@pytest.fixture
def jobbers() -> Jobbers:
    app = Celery("fast_search", broker="memory://")
    app.conf.jobbers_indexed_arguments = {"shop.import_order": ["order_id", "0"]}
    app.conf.jobbers_search_scan_limit = 3
    return in_memory(app, InMemoryStore(), InMemoryDeadLetterSink())


def _publish(jobbers: Jobbers, task_id: str, name: str, args: Any = (),
             kwargs: Any = None) -> None:
    headers: dict[str, Any] = {"id": task_id, "task": name, "retries": 0}
    jobbers.recorder.publish(name, headers, (tuple(args), kwargs or {}, {}), "", "q",
                             {}, None, False)


def _complete(jobbers: Jobbers, task_id: str, name: str) -> None:
    store = jobbers.store
    store.start(task_id, name=name, worker="w", wid="w:1:a", heartbeat_ms=None, cap=None,
                lease_cap_ms=1000, defer_ms=1000, fields={})
    assert store.complete(task_id, 1, name=name, worker="w", wid="w:1:a", fields={},
                          delete=("msg",), write_result=None).applied


def test_an_indexed_argument_finds_its_tasks_newest_first_even_completed(
        jobbers: Jobbers) -> None:
    _publish(jobbers, "a", "shop.import_order", kwargs={"order_id": 91800})
    _publish(jobbers, "b", "shop.import_order", ["X"], {"order_id": "91800"})
    _publish(jobbers, "c", "shop.import_order", kwargs={"order_id": 7})
    _complete(jobbers, "a", "shop.import_order")
    found = jobbers.search("order_id", "91800")
    assert {r.task_id for r in found.tasks} == {"a", "b"}
    assert found.indexed == ("shop.import_order",)
    assert "indexed" in found.how
    # a position is indexed only where the publisher knows the task's parameters (these
    # are published by name: it may be a secret one)
    assert [r.task_id for r in jobbers.search("0", "X").tasks] == []
    assert jobbers.search("order_id", "91800", limit=1).more


def test_an_unindexed_path_is_searched_in_the_newest_records_that_hold_arguments(
        jobbers: Jobbers) -> None:
    for n in range(5):
        _publish(jobbers, f"t{n}", "shop.other", kwargs={"sku": f"S{n % 2}"})
        jobbers.store.advance(0.01)  # type: ignore[attr-defined]
    found = jobbers.search("sku", "S0", name="shop.other")
    # the scan limit is 3: of t4, t3, t2, the ones with S0
    assert [r.task_id for r in found.tasks] == ["t4", "t2"]
    assert (found.examined, found.of, found.indexed) == (3, 5, ())
    assert found.how == "searched the arguments of the last 3 of 5 tasks named shop.other"
    _complete(jobbers, "t4", "shop.other")  # its payload is gone: the scan cannot see it
    assert [r.task_id for r in jobbers.search("sku", "S0").tasks] == ["t2"]


def test_a_search_refuses_bad_input(jobbers: Jobbers) -> None:
    for kwargs, said in (({"argument": "a b", "value": "1"}, "path"),
                         ({"argument": "a", "value": ""}, "value"),
                         ({"argument": "password", "value": "x"}, "redacted"),
                         ({"argument": "a", "value": "1", "limit": 0}, "limit"),
                         ({"argument": "a", "value": "1", "limit": 1001}, "limit")):
        with pytest.raises(ValueError, match=said):
            jobbers.search(**kwargs)


def test_no_index_is_written_when_no_path_is_set() -> None:
    jobbers = in_memory(Celery("fast_search_none", broker="memory://"), InMemoryStore(),
                        InMemoryDeadLetterSink())
    assert jobbers.recorder.index is None
    _publish(jobbers, "a", "x", kwargs={"order_id": 1})
    assert "ix" not in jobbers.store.get_raw("a")


def test_an_index_that_fails_never_fails_the_publish(jobbers: Jobbers,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    def broken(name: str, args: Any, kwargs: Any) -> list[str]:
        raise RuntimeError("boom")

    caplog.set_level(logging.WARNING, logger="jobbers.lifecycle")  # whatever the root's is
    jobbers.recorder.index = broken
    _publish(jobbers, "a", "shop.import_order", kwargs={"order_id": 1})
    raw = jobbers.store.get_raw("a")
    assert raw["state"] == "submitted"
    assert "ix" not in raw
    assert "could not be indexed" in caplog.text


def test_the_index_leaves_an_app_that_is_not_finalized_alone() -> None:
    app = Celery("fast_search_lazy", broker="memory://", autofinalize=False)
    app.conf.jobbers_indexed_arguments = {"t": ["order_id"]}
    jobbers = in_memory(app, InMemoryStore(), InMemoryDeadLetterSink())
    assert jobbers.arguments.params("t") is None  # asked again once the app has its tasks
    assert not app.finalized
    _publish(jobbers, "a", "t", kwargs={"order_id": 3})
    assert jobbers.search("order_id", "3").tasks[0].task_id == "a"


def test_the_bounded_search_never_matches_a_payload_past_its_bound(jobbers: Jobbers) -> None:
    """One search holds at most SCAN_LIMIT payloads of SCAN_PAYLOAD_MAX characters: a
    bigger one is read past (counted, not matched), never loaded whole."""
    from jobbers_celery.core.search import SCAN_PAYLOAD_MAX

    _publish(jobbers, "big", "shop.ship", kwargs={"sku": "S-1", "pad": "x" * SCAN_PAYLOAD_MAX})
    _publish(jobbers, "small", "shop.ship", kwargs={"sku": "S-1"})
    found = jobbers.search("sku", "S-1", name="shop.ship")
    assert [r.task_id for r in found.tasks] == ["small"]
    assert found.examined == 2
