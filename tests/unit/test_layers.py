"""jobbers_celery's layers are its folders: every import points to a lower folder, or to a
module listed before it in its own folder, and each folder imports only the third-party
packages it is allowed.

Read from the source with ``ast`` (:mod:`tests.unit.importgraph`, which the jobbers_django
layer test reads with too): every ``import`` anywhere in a module counts (module level,
inside functions, under ``TYPE_CHECKING``), so neither a cycle nor a forbidden package can
hide in a function. docs/contributing.md draws the same picture.

jobbers_django sits above all of them and uses only the public API (``__all__``); its own
layers are checked by its own layer test.
"""

from __future__ import annotations

from pathlib import Path

from tests.unit import importgraph

PACKAGE = Path(__file__).resolve().parents[2] / "jobbers_celery"
NAME = "jobbers_celery"

# Lowest first. A folder's modules are listed in their order too: a module may import one
# listed before it in its folder, never one after it. Top-level modules are named by
# their layer ("root" and "entry"); every other module's layer is its folder.
FOLDERS: dict[str, list[str]] = {
    "core": ["backoff", "columns", "printable", "names", "errors", "softlimit", "errortext", "intake", "states",
             "codec", "keydigest", "callkey", "unique", "ratelimit", "fairshare", "options", "credentials", "redaction", "reprcut", "records", "workflow", "search", "pauses", "destinations", "alertrules", "config", "storable",
             "timefmt", "periodic", "progress", "series"],
    "store": ["base", "keys", "connect", "fastcall", "scripts", "errors", "parts", "sharded", "unique", "ratelimits",
              "fairshare", "prechecks", "stepbatch", "steps", "running", "reads", "series", "workflows", "search", "housekeeping", "scheduling", "runs",
              "deadletters", "alerts", "pauses", "periodic", "redis"],
    "telemetry": ["tracing", "history", "series", "metrics"],
    "deadletter": ["payloadjson", "spool", "aside", "errors", "sink", "redis_sink", "dispatcher",
                   "entry", "selection"],
    "resubmit": ["pace", "claimed", "pacer", "resubmit"],
    "alerts": ["events", "links", "render", "webhook", "service"],
    "lifecycle": ["payload", "bodyjson", "results", "chords", "liveness", "emptied", "publisher", "bulk", "search", "submits", "recorder",
                  "cleaner", "periodic", "scheduler", "pausing", "fleet", "ratelimits"],
    "root": ["composition", "jobbers"],
    "worker": ["hooks", "bulk", "shutdown", "logfilter", "taskrepr", "outage", "heartbeat", "start",
               "delays", "parts", "pause", "unique", "taskbase", "taskbeat", "taskpublish",
               "task", "canvas", "runtime", "signals", "request",
               "refusals", "periodic"],
    "cli": ["output", "base", "names", "aside", "dlq", "fair", "workflow", "periodic", "search", "workers", "history", "ratelimits"],
    "entry": ["codec", "metrics", "sinks", "install"],
    "testing": ["idle", "memory", "series", "unique", "ratelimits", "steps", "fairshare", "running", "reads", "workflows", "scheduling", "runs",
                "outbox", "search", "alerts", "pauses", "periodic", "store", "embedded", "sink"],  # the users' kit: on top, it installs jobbers
}
TOP_LEVEL = {"root", "entry"}  # layers whose modules sit at the package's top level

# Third-party packages each layer may import (the standard library is always allowed).
# Only the store talks to Redis; core is the standard library alone.
ALLOWED: dict[str, set[str]] = {
    "core": set(),
    "store": {"redis", "hiredis"},  # hiredis: redis[hiredis]'s, packs a step's command
    "telemetry": {"opentelemetry"},
    "deadletter": {"kombu"},  # the payload's JSON is kombu's (payloadjson), as Celery writes it
    "resubmit": set(),
    "alerts": set(),  # webhooks go through urllib: the standard library
    "lifecycle": {"celery", "kombu"},
    "root": {"celery", "kombu"},
    "worker": {"celery", "kombu", "billiard"},
    "cli": {"celery", "click", "kombu"},
    "entry": {"celery"},
    "testing": {"celery"},
}
# The one exception, named: the payload codec imports cryptography (the ``crypto`` extra),
# and only inside the function that runs once payload keys are set.
EXCEPTIONS = {(f"{NAME}.core.codec", "cryptography")}

def _name(layer: str, module: str) -> str:
    if layer in TOP_LEVEL:
        return f"{NAME}.{module}"
    return f"{NAME}.{layer}.{module}"


RANK: dict[str, tuple[int, int]] = {}
LAYER: dict[str, str] = {}
for _n, (_layer, _mods) in enumerate(FOLDERS.items()):
    for _i, _m in enumerate(_mods):
        RANK[_name(_layer, _m)], LAYER[_name(_layer, _m)] = (_n, _i), _layer
    if _layer not in TOP_LEVEL:  # the folder's __init__ comes after its modules
        RANK[f"{NAME}.{_layer}"], LAYER[f"{NAME}.{_layer}"] = (_n, len(_mods)), _layer
RANK[NAME], LAYER[NAME] = (len(FOLDERS), 0), "entry"  # the package's __init__: last of all


_READ = importgraph.read(PACKAGE, NAME)
MODULES = _READ.modules
GRAPH = _READ.graph
THIRD = _READ.third


def test_every_module_has_a_layer() -> None:
    assert sorted(set(MODULES) - set(RANK)) == []
    assert sorted(set(RANK) - set(MODULES)) == []  # no stale name in FOLDERS


def test_top_level_holds_only_the_root_and_the_entry_points() -> None:
    top = {m for m in MODULES if m.count(".") == 1 and not (PACKAGE / m.split(".")[1]).is_dir()}
    assert top == {_name(layer, m) for layer in TOP_LEVEL for m in FOLDERS[layer]}


def test_imports_point_to_a_lower_layer_or_an_earlier_module() -> None:
    upward = sorted(f"{m} {RANK[m]} imports {i} {RANK[i]}"
                    for m, imported in GRAPH.items() for i in imported
                    if RANK[i] >= RANK[m])
    assert upward == []


def test_each_layer_imports_only_its_third_party_packages() -> None:
    wrong = sorted(f"{m} ({LAYER[m]}) imports {t}"
                   for m, third in THIRD.items() for t in third
                   if t not in ALLOWED[LAYER[m]] and (m, t) not in EXCEPTIONS)
    assert wrong == []


def test_only_the_store_imports_redis() -> None:
    assert sorted(m for m, third in THIRD.items() if "redis" in third
                  and LAYER[m] != "store") == []


def test_no_import_cycle_among_the_files() -> None:
    assert importgraph.cycles(GRAPH) == []


def test_the_reader_sees_imports_inside_functions_and_type_checking_blocks() -> None:
    # the tests above would be blind without these
    assert f"{NAME}.worker.task" in GRAPH[f"{NAME}.install"]  # inside a function
    assert f"{NAME}.lifecycle.recorder" in GRAPH[f"{NAME}.lifecycle.cleaner"]  # TYPE_CHECKING
    assert "cryptography" in THIRD[f"{NAME}.core.codec"]  # inside a function
