"""Secrets at rest (``jobbers_payload_keys``): the codec seals task arguments where jobbers
keeps them, opens them only where they are published again or shown to a key holder, and a
process without the key shows a placeholder and never fails a task."""

from __future__ import annotations

import base64
import json
import logging
import sys
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobbers_celery import (
    ENCRYPTED,
    ConfigurationError,
    JobbersConfig,
    PayloadCodec,
    TaskState,
    readable_arguments,
    unopenable,
)
from jobbers_celery.core.codec import SEALED, CannotOpen, is_sealed, new_key, parse_keys
from jobbers_celery.deadletter.entry import dead_letter_entry
from jobbers_celery.lifecycle import payload as pl
from jobbers_celery.lifecycle import recorder
from jobbers_celery.lifecycle.publisher import Publisher
from jobbers_celery.lifecycle.scheduler import Scheduler
from jobbers_celery.store import StepResult
from jobbers_celery.testing import InMemoryStore

OLD = new_key("old")
NEW = new_key("new")
OTHER = new_key("new")  # same id as NEW, another key

json_scalars = (st.none() | st.booleans() | st.integers() | st.text()
                | st.floats(allow_nan=False, allow_infinity=False))
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(), inner, max_size=4), max_leaves=20)
arguments = st.tuples(st.lists(json_values, max_size=4),
                      st.dictionaries(st.text(), json_values, max_size=4))


def codec(*keys: str) -> PayloadCodec:
    return PayloadCodec.of(list(keys))


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (k, *_strings(v))]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


# ---------------------------------------------------------------------- properties
@given(arguments)
def test_sealed_arguments_open_to_the_same_json_values(args_kwargs):
    args, kwargs = args_kwargs
    sealed = pl.seal_arguments({"args": args, "kwargs": kwargs, "options": {"queue": "q"}},
                               codec(NEW, OLD))
    assert sealed["args"] == []
    assert is_sealed(sealed["kwargs"])
    assert sealed["options"] == {"queue": "q"}  # left readable for the publish
    stored = json.loads(pl.dumps(sealed))  # as every store keeps it: JSON
    assert pl.open_arguments(stored["args"], stored["kwargs"], codec(NEW, OLD)) == (args, kwargs)


@given(st.text())
def test_any_text_round_trips_lone_surrogates_included(text):
    c = codec(NEW)
    assert c.open(c.seal(text)) == text


@given(arguments)
def test_a_sealed_value_holds_no_plaintext_of_its_input(args_kwargs):
    args, kwargs = args_kwargs
    envelope = pl.seal_arguments({"args": args, "kwargs": kwargs}, codec(NEW))["kwargs"]
    stored = pl.dumps(envelope)
    skeleton = pl.dumps({**envelope, "data": ""})
    for leaf in _strings([args, kwargs]):
        if len(leaf) >= 6 and leaf not in skeleton:
            for form in (leaf, json.dumps(leaf)[1:-1]):
                assert form not in stored


@given(arguments)
@settings(max_examples=50)
def test_a_value_sealed_with_an_old_key_opens_after_a_rotation(args_kwargs):
    args, kwargs = args_kwargs
    sealed = pl.seal_arguments({"args": args, "kwargs": kwargs}, codec(OLD))
    assert sealed["kwargs"]["kid"] == "old"
    rotated = codec(NEW, OLD)  # the new key first: it seals, both open
    assert pl.open_arguments(sealed["args"], sealed["kwargs"], rotated) == (args, kwargs)
    assert pl.seal_arguments({"args": args, "kwargs": kwargs}, rotated)["kwargs"]["kid"] == "new"
    with pytest.raises(CannotOpen, match="'old'"):  # once the old key is dropped
        pl.open_arguments(sealed["args"], sealed["kwargs"], codec(NEW))


def _tampered(envelope: dict[str, str], how: int, where: int) -> dict[str, Any]:
    raw = bytearray(base64.b64decode(envelope["data"]))
    out: dict[str, Any] = dict(envelope)
    if how == 0:  # one bit flipped: nonce, ciphertext or tag
        raw[where % len(raw)] ^= 1 << (where % 8)
        out["data"] = base64.b64encode(bytes(raw)).decode()
    elif how == 1:  # cut short
        out["data"] = base64.b64encode(bytes(raw[:where % len(raw)])).decode()
    elif how == 2:  # another key id held here (the id is authenticated)
        out["kid"] = "old"
    elif how == 3:
        out[SEALED] = "v2"
    elif how == 4:
        out["data"] = envelope["data"][:-2] + "!!"
    else:  # moved into another envelope's place: a fresh seal's nonce with this data
        other = base64.b64decode(codec(NEW, OLD).seal("x")["data"])
        out["data"] = base64.b64encode(other[:12] + bytes(raw[12:])).decode()
    return out


@given(st.text(min_size=1), st.integers(0, 5), st.integers(0, 10_000))
@settings(max_examples=100)
def test_tampered_envelopes_are_refused(text, how, where):
    c = codec(NEW, OLD)
    bad = _tampered(c.seal(text), how, where)
    with pytest.raises(CannotOpen):
        c.open(bad)
    assert readable_arguments([], bad, c) == ([ENCRYPTED], {})


# ---------------------------------------------------------------------- keys
def test_a_wrong_or_missing_key_shows_the_placeholder_and_says_why():
    sealed = pl.seal_arguments({"args": ["hunter2"], "kwargs": {}}, codec(NEW))
    args, kwargs = sealed["args"], sealed["kwargs"]
    for reader in (None, codec(), codec(OLD), codec(OTHER)):
        assert readable_arguments(args, kwargs, reader) == ([ENCRYPTED], {})
        why = unopenable(args, kwargs, reader)
        assert why is not None
        assert "'new'" in why
        assert "hunter2" not in why
    assert unopenable(args, kwargs, codec(OLD, NEW)) is None
    assert readable_arguments(args, kwargs, codec(OLD, NEW)) == (["hunter2"], {})
    # values in clear are shown and published as they are, with or without keys
    assert readable_arguments([1], {"a": 2}, None) == ([1], {"a": 2})
    assert unopenable([1], {"a": 2}, codec(NEW)) is None


def test_without_keys_nothing_is_sealed_and_cryptography_is_not_needed():
    payload = {"args": [1], "kwargs": {"password": "hunter2"}, "options": {}}
    assert pl.seal_arguments(payload, codec()) == payload
    assert pl.seal_arguments(payload, None) == payload
    assert not codec().enabled


@pytest.mark.parametrize(("keys", "message"), [
    ("k1:" + "A" * 44, "must be a list"),
    ([OLD[4:]], r"jobbers_payload_keys\[0\]"),  # no id
    (["bad id:" + OLD.split(":")[1]], "its id must be"),
    (["k1:not base64!"], "not base64"),
    (["k1:" + base64.b64encode(b"x" * 16).decode()], "must be 32 bytes"),
    ([NEW, OTHER], "used twice"),
    ([NEW, 5], r"jobbers_payload_keys\[1\]"),
])
def test_bad_keys_are_refused_at_start_without_quoting_them(keys, message):
    with pytest.raises(ConfigurationError, match=message) as err:
        JobbersConfig.from_mapping({"jobbers_payload_keys": keys}, "redis://h/0")
    assert OLD.split(":")[1] not in str(err.value)
    assert NEW.split(":")[1] not in str(err.value)


def test_keys_are_never_shown_in_the_configs_repr():
    config = JobbersConfig.from_mapping({"jobbers_payload_keys": [NEW]}, "redis://h/0")
    assert [k.kid for k in parse_keys(config.payload_keys)] == ["new"]
    assert NEW.split(":")[1] not in repr(config)
    assert NEW.split(":")[1] not in repr(parse_keys([NEW]))


def test_without_the_crypto_extra_keys_are_refused_naming_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "cryptography.hazmat.primitives.ciphers.aead", None)
    with pytest.raises(ConfigurationError, match=r"jobbers\[crypto\]"):
        JobbersConfig.from_mapping({"jobbers_payload_keys": [new_key()]}, "redis://h/0")
    JobbersConfig.from_mapping({}, "redis://h/0")  # no keys: no cryptography needed


def test_a_new_key_is_in_the_settings_form():
    kid, _, secret = new_key().partition(":")
    assert kid.startswith("k")
    assert len(base64.b64decode(secret)) == 32
    assert new_key("2026-q4").startswith("2026-q4:")


# ---------------------------------------------------------------------- the seal points
SECRET = "s3cr3t-hunter2-value"


def _recorder(c: PayloadCodec | None) -> Any:
    return recorder.Recorder(InMemoryStore(), SimpleNamespace(), codec=c)


def _msg(rec: Any, task_id: str = "t-1") -> str:
    """The payload the store keeps for ``task_id``."""
    msg: str = rec.store.get_raw(task_id)["msg"]
    return msg


def test_the_record_holds_the_published_arguments_sealed():
    rec = _recorder(codec(NEW))
    rec.publish("proj.login", {"id": "t-1"}, (["ann", SECRET], {"token": SECRET}, {}), "",
                "celery", {}, version=None, dead_letter=True)
    rec.publish_later("t-2", "proj.login", {"args": [SECRET], "kwargs": {}, "options": {
        "queue": "celery"}}, version=None, dead_letter=True, delay_ms=1000, reason="later")
    for msg in (_msg(rec, "t-1"), _msg(rec, "t-2")):
        assert SECRET not in msg
        stored = pl.loads(msg)
        assert stored["options"]["queue"] == "celery"
        assert SECRET in str(pl.open_arguments(stored["args"], stored["kwargs"], codec(NEW)))


def test_arguments_that_are_not_json_are_kept_sealed_too():
    rec = _recorder(codec(NEW))
    rec.publish("proj.login", {"id": "t-1"}, ([object(), SECRET], {}, {}), "", "celery", {},
                version=None, dead_letter=True)
    msg = _msg(rec)
    assert SECRET not in msg
    assert pl.loads(msg)["unserializable"] is True


def _dead_letter(msg: str, c: PayloadCodec | None) -> Any:
    return dead_letter_entry(
        task_id="t-1", name="proj.login", reason="failed",
        result=StepResult(applied=True, previous="started", now_ms=1_700_000_000_000,
                          attempt=1), raw={"msg": msg, "ver": "1", "queue": "celery"}, codec=c)


def test_a_dead_letter_keeps_the_sealed_form_and_seals_arguments_recorded_in_clear():
    clear = pl.dumps({"args": [SECRET], "kwargs": {"k": SECRET}, "options": {"queue": "q"}})
    sealed_msg = pl.dumps(pl.seal_arguments(pl.loads(clear), codec(OLD)))
    for msg in (clear, sealed_msg):
        entry = _dead_letter(msg, codec(NEW, OLD))
        assert SECRET not in json.dumps(entry.to_json())  # sink, outbox and spool keep this
        assert entry.options == {"queue": "q"}
        assert entry.unpublishable is None
        assert pl.open_arguments(entry.args, entry.kwargs, codec(NEW, OLD)) == (
            [SECRET], {"k": SECRET})
    # a sealed record dead-lettered by a process without keys: kept sealed, not failed
    entry = _dead_letter(sealed_msg, None)
    assert entry.args == []
    assert is_sealed(entry.kwargs)


def test_the_spool_file_of_a_dead_letter_holds_no_plaintext(tmp_path):
    from jobbers_celery.deadletter.spool import DeadLetterSpool

    clear = pl.dumps({"args": [SECRET], "kwargs": {"k": SECRET}, "options": {}})
    path = DeadLetterSpool(tmp_path).write([_dead_letter(clear, codec(NEW))])
    assert SECRET not in path.read_text()


UNSTORABLE = ([float("nan"), float("inf"), float("-inf"), "nul\x00x", "\ud800"],
              {"k": float("nan"), "\x00key": [float("inf")]})


def test_opened_arguments_are_shown_in_the_storable_form_and_published_as_they_are():
    """NaN, Infinity, NUL and lone surrogates sealed raw: what a key holder shows (the
    command line's ``--json``, the pages) is the storable form, valid JSON; a republish
    still gets the real values."""
    args, kwargs = UNSTORABLE
    sealed = pl.seal_arguments({"args": args, "kwargs": kwargs, "options": {}}, codec(NEW))
    shown = readable_arguments(sealed["args"], sealed["kwargs"], codec(NEW))
    assert shown == (["NaN", "Infinity", "-Infinity", "nul\\u0000x", "\\ud800"],
                     {"k": "NaN", "\\u0000key": ["Infinity"]})
    json.dumps(shown, allow_nan=False).encode()  # strict JSON, encodable as UTF-8
    sent: list[dict[str, Any]] = []
    app = SimpleNamespace(send_task=lambda name, **kw: sent.append(kw))
    Publisher(app, InMemoryStore(), codec(NEW)).republish(
        "t-1", "proj.login", sealed, 0, 1_000)
    assert json.dumps([sent[0]["args"], sent[0]["kwargs"]]) == json.dumps([args, kwargs])


def test_a_republish_opens_the_arguments_and_refuses_without_the_key():
    sent: list[dict[str, Any]] = []
    app = SimpleNamespace(send_task=lambda name, **kw: sent.append(kw))
    data = pl.seal_arguments({"args": [SECRET], "kwargs": {"a": 1}, "options": {}}, codec(NEW))
    Publisher(app, InMemoryStore(), codec(NEW)).republish(
        "t-1", "proj.login", data, 0, 1_000)
    assert (sent[0]["args"], sent[0]["kwargs"]) == ([SECRET], {"a": 1})
    for reader in (None, codec(OLD)):
        with pytest.raises(CannotOpen):
            Publisher(app, InMemoryStore(), reader).republish(
                "t-1", "proj.login", data, 0, 1_000)
    assert len(sent) == 1  # never published with the sealed form as arguments


def test_a_scheduler_without_the_key_leaves_the_due_task_to_one_that_holds_it(caplog):
    msg = pl.dumps(pl.seal_arguments({"args": [SECRET], "kwargs": {}, "options": {}},
                                     codec(NEW)))
    sent: list[Any] = []
    app = SimpleNamespace(send_task=lambda name, **kw: sent.append(kw))
    config = JobbersConfig.from_mapping({}, "redis://h/0")
    store = InMemoryStore()
    store.submit("t-1", sources=(TaskState.UNSUBMITTED,), reason="published",
                 name="proj.login", create={"name": "proj.login", "queue": "celery"},
                 fields={"msg": msg, "retries": "1"}, later=(0, "countdown"))
    without = Scheduler(store, config, Publisher(app, store, codec(OLD)))
    with caplog.at_level(logging.WARNING, logger="jobbers.scheduler"):
        assert without.run_once()[0] == 0
    leased = store.publishing()
    assert list(leased) == ["t-1"]  # unconfirmed: its lease expires
    store.advance(config.publish_lease + 1)
    assert without.run_once()[0] == 0  # without the key: left alone
    assert store.publishing() == leased  # not claimed again
    holder = Scheduler(store, config, Publisher(app, store, codec(NEW)))
    assert holder.run_once()[0] == 1  # a worker holding it claims it
    assert store.publishing() == {}
    # only the key holder published
    assert [(s["args"], s["kwargs"]) for s in sent] == [([SECRET], {})]
    assert any("holds that key" in r.getMessage() and SECRET not in r.getMessage()
               for r in caplog.records)


# ---------------------------------------------------------------------- hostile shapes
def test_a_publishers_kwargs_shaped_like_a_sealed_value_are_sealed_and_come_back_whole():
    fake = {SEALED: "v1", "kid": "new", "data": "AAAA"}  # a publisher's own kwargs
    rec = _recorder(codec(NEW))
    rec.publish("proj.login", {"id": "t-1"}, ([], fake, {}), "", "celery", {}, version=None,
                dead_letter=True)
    stored = pl.loads(_msg(rec))
    assert stored["kwargs"] != fake  # sealed like any other
    assert pl.open_arguments(stored["args"], stored["kwargs"], codec(NEW)) == ([], fake)


@pytest.mark.parametrize("kid", ["k1\n", "x" * 33, "\x1b]0;owned\x07", ""])
def test_only_a_key_id_of_the_settings_form_makes_a_sealed_value(kid):
    assert not is_sealed({SEALED: "v1", "kid": kid, "data": "AAAA"})
    assert not is_sealed({SEALED: "v" * 17, "kid": "k1", "data": "AAAA"})
    with pytest.raises(ConfigurationError, match="its id must be"):
        parse_keys([f"{kid}:{NEW.split(':')[1]}"])
