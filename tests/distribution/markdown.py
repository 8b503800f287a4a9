"""The fenced code blocks of a Markdown page, as the page's tests run them.

A page is read, never copied into a test: when the page is wrong, its test fails. Blocks are
``sh`` (commands, one a line), ``python title="path"`` (a file to write, or to extend when the
title says ``(continued)`` or ``(added at the end)``) and ``pycon`` (a Python shell session,
doctest syntax). Which commands keep running (a worker, beat, a web server) is the test's to
say.
"""

from __future__ import annotations

import doctest
import re
from dataclasses import dataclass
from pathlib import Path

FENCE = re.compile(r'^```(?P<lang>[\w-]*)(?:\s+title="(?P<title>[^"]*)")?\s*$')
#: File titles that extend a file instead of writing it
APPEND = re.compile(r"^(?P<path>\S+)\s+\((?:continued|added at the end)\)$")
#: A shell-session comment that says the reader waits before this line: "# a moment later"
LATER = re.compile(r"#[^\n]*\blater\b")


@dataclass(frozen=True)
class Block:
    lang: str
    title: str | None
    text: str
    line: int  # of the opening fence, 1-based

    @property
    def file(self) -> tuple[str, bool]:
        """``(path, append)`` of a file block."""
        assert self.title, f"line {self.line}: a file block needs a title"
        m = APPEND.match(self.title)
        return (m["path"], True) if m else (self.title, False)

    def commands(self) -> list[tuple[int, str]]:
        """The commands of a shell block with their line numbers, one a line, blank lines
        skipped."""
        return [(self.line + 1 + i, c) for i, c in enumerate(self.text.splitlines())
                if c.strip()]


def blocks(page: Path) -> list[Block]:
    found: list[Block] = []
    lines = page.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m and m["lang"]:
            start = i
            i += 1
            body = []
            while lines[i].rstrip() != "```":
                body.append(lines[i])
                i += 1
            found.append(Block(m["lang"], m["title"], "\n".join(body) + "\n", start + 1))
        i += 1
    return found


@dataclass(frozen=True)
class Step:
    """Shell examples run together: a step that ``waits`` is re-run until its outputs match
    (the reader looks again), within a deadline; any other step runs once."""

    examples: list[dict[str, str | int]]
    waits: bool


def session_steps(block: Block) -> list[Step]:
    """A pycon block as steps. An example whose comment says ``later`` starts a waiting step
    that runs to the first example showing output; every other example is a step of its
    own."""
    parsed = doctest.DocTestParser().get_examples(block.text)
    steps: list[Step] = []
    current: list[dict[str, str | int]] | None = None
    for ex in parsed:
        item: dict[str, str | int] = {"source": ex.source, "want": ex.want,
                                      "line": block.line + 1 + ex.lineno}
        if current is None and LATER.search(ex.source.splitlines()[0]):
            current = []
        if current is not None:
            current.append(item)
            if ex.want:
                steps.append(Step(current, waits=True))
                current = None
        else:
            steps.append(Step([item], waits=False))
    assert current is None, f"line {block.line}: a 'later' step shows no output to wait for"
    return steps
