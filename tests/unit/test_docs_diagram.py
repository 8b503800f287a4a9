"""The state diagram on the lifecycle page draws exactly the transition table of states.py."""

from __future__ import annotations

import re
from pathlib import Path

from jobbers_celery.core.states import TERMINAL, TRANSITIONS, TaskState

PAGE = Path(__file__).resolve().parents[2] / "docs" / "reference" / "lifecycle.md"
START = "[*]"
EDGE = re.compile(r"^(?P<src>\S+)\s*-->\s*(?P<dst>[^\s:]+)\s*(?::\s*(?P<label>.*))?$")
CLASS = re.compile(r"^class\s+(?P<states>.+?)\s+(?P<name>\w+)$")


def mermaid_block() -> list[str]:
    blocks = re.findall(r"^```mermaid\n(.*?)^```$", PAGE.read_text(), re.MULTILINE | re.DOTALL)
    assert len(blocks) == 1, f"expected one mermaid block in {PAGE}, found {len(blocks)}"
    lines = [line.strip() for line in blocks[0].splitlines() if line.strip()]
    assert lines[0] == "stateDiagram-v2"
    return lines[1:]


def diagram_edges() -> list[tuple[str, str]]:
    edges = []
    for line in mermaid_block():
        if "-->" in line:
            match = EDGE.match(line)
            assert match, f"unparsed edge line: {line!r}"
            edges.append((match["src"], match["dst"]))
    return edges


def table_edges() -> set[tuple[str, str]]:
    return {(src.value, dst.value) for src, targets in TRANSITIONS.items() for dst in targets}


def test_diagram_edges_are_the_transition_table():
    edges = [e for e in diagram_edges() if START not in e]
    assert len(edges) == len(set(edges)), "an edge is drawn twice"
    assert set(edges) == table_edges()


def test_diagram_uses_only_state_names_and_one_start_marker():
    states = {s.value for s in TaskState}
    edges = diagram_edges()
    assert [e for e in edges if START in e] == [(START, TaskState.UNSUBMITTED.value)]
    assert {node for e in edges for node in e} == states | {START}


def test_diagram_shades_the_terminal_states():
    shaded: set[str] = set()
    for line in mermaid_block():
        match = CLASS.match(line)
        if match and match["name"] == "terminal":
            shaded |= {s.strip() for s in match["states"].split(",")}
    assert shaded == {s.value for s in TERMINAL}
