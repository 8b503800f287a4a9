"""The page runner itself: a page that is right passes, a page that is wrong fails where it
is wrong. Small pages of its own, the system's ``python3``, no venv, a few seconds."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.distribution.pages import Page, Substitution

PAGE = '''# A page

```sh
echo hello > greeting.txt
```

```python title="mod.py"
X = 1
```

```python title="mod.py (continued)"
Y = X + 1
```

```sh
python3 -u -c "print('up', flush=True); import time; time.sleep(1); open('flag', 'w').close(); time.sleep(60)"
```

```pycon
>>> import os, mod
>>> mod.Y, open("greeting.txt").read()
(2, 'hello\\n')
>>> os.path.exists("flag")                    # a moment later
True
>>> for i in range(3):
...     print(i, "WORD")
...
0 WORD
1 ...
2 WORD
>>> import uuid; str(uuid.uuid4())[8]
'-'
```
'''


def make(tmp_path: Path, text: str, subs: list[Substitution] | None = None) -> Page:
    (tmp_path / "page.md").write_text(text)
    work = tmp_path / "work"
    work.mkdir()
    return Page(tmp_path / "page.md", work, logs=tmp_path,
                substitutions=subs or [Substitution("WORD", "word", "the test's own")],
                services={r"^python3 -u -c": "up"}, shell="python3", deadline=20)


def run(page: Page) -> None:
    try:
        page.run()
    finally:
        page.stop()


def test_a_right_page_passes(tmp_path: Path) -> None:
    page = make(tmp_path, PAGE)
    run(page)
    assert (tmp_path / "work" / "mod.py").read_text() == "X = 1\nY = X + 1\n"
    assert page.started[0].proc.poll() is not None  # stopped


def test_a_wrong_output_fails_at_its_line(tmp_path: Path) -> None:
    with pytest.raises(AssertionError, match=r"page.md line 21:\nmod.Y, open"):
        run(make(tmp_path, PAGE.replace("(2, 'hello\\n')", "(3, 'hello\\n')")))


def test_a_wait_that_never_ends_fails(tmp_path: Path) -> None:
    page = make(tmp_path, PAGE.replace("open('flag', 'w').close(); ", ""))
    page.deadline = 2
    with pytest.raises(AssertionError, match=r"line 23:\nos.path.exists"):
        run(page)


def test_a_failing_command_fails(tmp_path: Path) -> None:
    with pytest.raises(AssertionError, match=r"line 4: `false` exited 1"):
        run(make(tmp_path, PAGE.replace("echo hello > greeting.txt", "false")))


def test_a_substitution_no_longer_needed_fails(tmp_path: Path) -> None:
    subs = [Substitution("WORD", "word", "used"), Substitution("127.0.0.1:6379", "x", "unused")]
    with pytest.raises(AssertionError, match=r"no longer needs: \['127.0.0.1:6379'\]"):
        run(make(tmp_path, PAGE, subs))


def test_an_unknown_block_fails(tmp_path: Path) -> None:
    with pytest.raises(AssertionError, match=r"line 3: the test does not know how to run a 'text'"):
        run(make(tmp_path, PAGE.replace("```sh\necho hello", "```text\necho hello", 1)))
