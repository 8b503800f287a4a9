"""Which result backends get their write folded into the ``completed`` step (no network)."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery

from jobbers_celery.lifecycle import results
from jobbers_celery.store import RedisStore

STORE_URL = "redis://127.0.0.1:6390/1"


def why_not(backend_url: str, store_url: str = STORE_URL, **conf: Any) -> str | None:
    app = Celery("t", broker="memory://", backend=backend_url, set_as_current=False)
    app.conf.update(conf)
    return results._why_not(RedisStore.from_url(store_url), app.backend)


def fold_db(backend_url: str, store_url: str = STORE_URL) -> tuple[str | None, int | None]:
    app = Celery("t", broker="memory://", backend=backend_url, set_as_current=False)
    return results._fold_db(RedisStore.from_url(store_url), app.backend)


def test_same_server_and_db_folds():
    assert why_not(STORE_URL) is None
    assert why_not("redis://127.0.0.1:6390/1?socket_timeout=5") is None
    assert fold_db(STORE_URL) == (None, None)


def test_another_db_of_the_same_server_folds_with_a_select():
    # jobbers' default layout: records on the broker's db 0, results on another db
    assert fold_db("redis://127.0.0.1:6390/2") == (None, 2)
    assert fold_db("redis://127.0.0.1:6390/0", "redis://127.0.0.1:6390/3") == (None, 0)
    assert fold_db("redis+socket:///tmp/r.sock?virtual_host=3",
                   "unix:///tmp/r.sock?db=1") == (None, 3)


@pytest.mark.parametrize("url", [
    "redis://127.0.0.1:6391/1",        # another server
    "redis://localhost:6390/1",        # maybe the same server: not assumed
    "redis://other@127.0.0.1:6390/1",  # another ACL user may not write the same keys
    "rediss://127.0.0.1:6390/1?ssl_cert_reqs=required",
])
def test_another_endpoint_does_not_fold(url):
    assert why_not(url) == results.ELSEWHERE


def test_unix_socket_folds_only_on_the_same_path():
    assert why_not("redis+socket:///tmp/r.sock?virtual_host=3", "unix:///tmp/r.sock?db=3") is None
    assert why_not("redis+socket:///tmp/r.sock?virtual_host=3", "unix:///tmp/o.sock?db=3")
    assert why_not("redis+socket:///tmp/r.sock?virtual_host=3", STORE_URL)


@pytest.mark.parametrize(("url", "expected"), [
    ("cache+memory://", "CacheBackend"),
    ("sentinel://127.0.0.1:26379", "SentinelBackend"),
])
def test_other_backend_classes_do_not_fold(url, expected):
    assert why_not(url) == f"the result backend is {expected}, not Celery's RedisBackend"


@pytest.mark.parametrize("conf", [{"result_serializer": "pickle",
                                   "accept_content": ["json", "pickle"]},
                                  {"result_compression": "zlib"}])
def test_results_that_are_not_plain_json_do_not_fold(conf):
    assert why_not(STORE_URL, **conf) == (
        "results are not plain JSON (result_serializer or result_compression)")
