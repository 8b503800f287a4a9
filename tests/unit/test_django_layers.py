"""jobbers_django's layers: every import points to a lower layer, or to a module listed
before it in its own layer, and each layer imports only the third-party packages it is
allowed; no import cycle.

Read from the source with ``ast`` (:mod:`tests.unit.importgraph`): every ``import`` anywhere
in a module counts (module level, inside functions, under ``TYPE_CHECKING``). A module in a
folder takes the folder's layer; a top-level module is named in the layer it belongs to.
That jobbers_django imports only jobbers_celery's public API (``__all__``) is the rule of
tests/unit/test_django_public_api.py; ``jobbers_celery`` is allowed everywhere here.
"""

from __future__ import annotations

from pathlib import Path

from tests.unit import importgraph

PACKAGE = Path(__file__).resolve().parents[2] / "jobbers_django"
NAME = "jobbers_django"

# Lowest first. A layer's modules are listed in their order too: a module may import one
# listed before it in its layer, never one after it. A folder's package ``__init__`` comes
# after its modules (a nested package is listed by name, after its own modules).
FOLDERS: dict[str, list[str]] = {
    # settings, the id fields and converters, fingerprints, keyset pages: Django at most
    "basics": ["conf", "fields", "frames", "fingerprint", "converters", "querysets"],
    # the tables, and who may read or act on them
    "models": ["models", "permissions"],
    "migrations": [],  # any order: a migration imports no other (see UNORDERED)
    # the Celery side (the app, its Jobbers, live tasks); redaction reads the task's
    # parameter names and opens sealed arguments through it
    "bridge": ["bridge", "redaction"],
    # the dead-letter actions: which entries, resubmit and discard, paced runs
    "dlq": ["selection", "actions", "runs", "run_step"],
    # what Celery loads by name: the sink (jobbers_dead_letter_sink) and the paced-resubmit
    # step task
    "services": ["alerting", "sink", "tasks"],
    # the REST API: one module per resource
    "api": ["parsers", "serializers.fields", "serializers.requests", "serializers.responses", "serializers.search",
            "serializers.history", "serializers", "base", "deadletters", "runs", "tasks",
            "workflows", "history", "workers", "fairshares", "periodic", "search", "alerts", "ratelimits", "schema"],
    # the set-aside listing and its endpoint (admin/aside.py and the command list it too)
    "views": ["setaside"],
    "templatetags": ["jobbers_text"],
    "admin": ["pagination", "base", "display", "charts", "filters", "aside", "history",
              "actions",
              "lifecycle", "workflows", "live", "workers", "ratelimits", "periodic", "search", "entries", "groups", "runs", "alerts"],
    "management": ["commands.jobbers_publish_pending", "commands.jobbers_dlq", "commands"],
    # what Django loads: the URLs a project includes, the app config
    "entry": ["urls", "apps"],
    # the actions and paced runs by their documented names, for users only: above every
    # module, so none of jobbers_django's own code goes through them (see the test below)
    "reexports": ["services", "runs"],
}
TOP_LEVEL = {"basics", "models", "bridge", "services", "views", "entry", "reexports"}
UNORDERED = {"migrations"}  # folders whose modules share one rank

# Third-party packages each layer may import (the standard library and jobbers_celery's
# public API are always allowed). Only the API speaks DRF; only the Celery side imports
# Celery.
ALLOWED: dict[str, set[str]] = {
    "basics": {"django"},
    "models": {"django"},
    "migrations": {"django"},
    "bridge": {"django", "celery", "kombu"},
    "dlq": {"django"},
    "services": {"django", "celery"},
    "api": {"django", "rest_framework", "drf_spectacular"},
    "views": {"rest_framework", "drf_spectacular"},
    "templatetags": {"django"},
    "admin": {"django"},
    "management": {"django"},
    "entry": {"django"},
    "reexports": set(),
}
# The one exception, named: the API's permission classes live with the rule they apply,
# which the admin shares (jobbers_django.permissions.CanRead is documented).
EXCEPTIONS = {(f"{NAME}.permissions", "rest_framework")}
ALWAYS = {"jobbers_celery"}


def _name(layer: str, module: str) -> str:
    if layer in TOP_LEVEL:
        return f"{NAME}.{module}"
    return f"{NAME}.{layer}.{module}"


READ = importgraph.read(PACKAGE, NAME)
MODULES, GRAPH, THIRD = READ.modules, READ.graph, READ.third

RANK: dict[str, tuple[int, int]] = {}
LAYER: dict[str, str] = {}
for _n, (_layer, _mods) in enumerate(FOLDERS.items()):
    if _layer in UNORDERED:
        _mods = sorted(m.rpartition(".")[2] for m in MODULES
                       if m.startswith(f"{NAME}.{_layer}."))
    for _i, _m in enumerate(_mods):
        _rank = (_n, 0) if _layer in UNORDERED else (_n, _i)
        RANK[_name(_layer, _m)], LAYER[_name(_layer, _m)] = _rank, _layer
    if _layer not in TOP_LEVEL:  # the folder's __init__ comes after its modules
        RANK[f"{NAME}.{_layer}"], LAYER[f"{NAME}.{_layer}"] = (_n, len(_mods)), _layer
RANK[NAME], LAYER[NAME] = (len(FOLDERS), 0), "entry"  # the package's __init__: last of all
#: The modules that only re-export for users (their documented names); none of
#: jobbers_django's own modules imports them.
REEXPORTS = {f"{NAME}.services", f"{NAME}.runs"}


def test_every_module_has_a_layer() -> None:
    assert sorted(set(MODULES) - set(RANK)) == []
    assert sorted(set(RANK) - set(MODULES)) == []  # no stale name in FOLDERS


def test_imports_point_to_a_lower_layer_or_an_earlier_module() -> None:
    upward = sorted(f"{m} {RANK[m]} imports {i} {RANK[i]}"
                    for m, imported in GRAPH.items() for i in imported
                    if RANK[i] >= RANK[m])
    assert upward == []


def test_no_module_of_the_package_goes_through_the_reexports() -> None:
    through = sorted(f"{m} imports {i}" for m, imported in GRAPH.items()
                     for i in imported & REEXPORTS)
    assert through == []
    assert {m for m in MODULES if LAYER.get(m) == "reexports"} == REEXPORTS


def test_each_layer_imports_only_its_third_party_packages() -> None:
    wrong = sorted(f"{m} ({LAYER[m]}) imports {t}"
                   for m, third in THIRD.items() for t in third - ALWAYS
                   if t not in ALLOWED[LAYER[m]] and (m, t) not in EXCEPTIONS)
    assert wrong == []


def test_no_import_cycle_among_the_files() -> None:
    assert importgraph.cycles(GRAPH) == []


def test_the_reader_sees_imports_inside_functions_and_type_checking_blocks(
        tmp_path: Path) -> None:
    # the tests above would be blind without these
    assert f"{NAME}.tasks" in GRAPH[f"{NAME}.apps"]  # inside AppConfig.ready only
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "low.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import rest_framework\n"
        "def f():\n    from pkg.sub import high\n")
    (package / "sub" / "high.py").write_text("from ..low import f\nimport django.db\n")
    read = importgraph.read(package, "pkg")
    assert read.graph["pkg.low"] == {"pkg.sub.high"}  # ``from pkg.sub import high``
    assert read.graph["pkg.sub.high"] == {"pkg.low"}  # relative, a name inside a module
    assert (read.third["pkg.low"], read.third["pkg.sub.high"]) == ({"rest_framework"},
                                                                  {"django"})
    assert importgraph.cycles(read.graph) == [["pkg.low", "pkg.sub.high", "pkg.low"]]
