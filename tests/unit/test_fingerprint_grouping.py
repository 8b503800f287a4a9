"""Grouping quality of failure fingerprints on real-world messages
(tests/unit/grouping_cases.py): pairwise precision (two messages put in one group are one
bug) and recall (two messages of one bug are put in one group), with what main did before
quoted values, URL paths and key details were taken out (``_old_normalise``), and the
properties of the quoted-value rule. Pure, no Django."""

from __future__ import annotations

import itertools
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from jobbers_django import fingerprint
from jobbers_django.fingerprint import normalise_message
from tests.unit.grouping_cases import CASES
from tests.unit.test_fingerprint import _old_normalise


def _scores(normalise: object) -> tuple[float, float]:
    """Pairwise (precision, recall) of grouping CASES by (exception type, normalised
    message): what one task's failures at one code frame are grouped by."""
    assert callable(normalise)
    keys = [(kind, normalise(message)) for _, kind, message in CASES]
    same_bug = same_group = both = 0
    for (a, ka), (b, kb) in itertools.combinations(zip((c[0] for c in CASES), keys,
                                                       strict=True), 2):
        bug, group = a == b, ka == kb
        same_bug += bug
        same_group += group
        both += bug and group
    return both / same_group, both / same_bug


def test_real_world_messages_group_by_bug() -> None:
    precision, recall = _scores(normalise_message)
    before = _scores(_old_normalise)
    print(f"\ngrouping of {len(CASES)} messages ({len({c[0] for c in CASES})} bugs): "
          f"precision {precision:.3f}, recall {recall:.3f}; before: precision "
          f"{before[0]:.3f}, recall {before[1]:.3f}")
    assert len(CASES) >= 40
    assert precision == 1.0  # no two bugs share a group
    assert recall == 1.0  # every bug is one group
    assert before[1] < 0.6  # what the issue saw: one bug split by the values it quotes


def test_the_issues_warehouses_are_one_group() -> None:
    assert normalise_message("Stock sync failed for warehouse 'berlin'") == \
        normalise_message("Stock sync failed for warehouse 'hamburg'") == \
        "Stock sync failed for warehouse <str>"


def test_code_names_in_quotes_are_kept() -> None:
    assert normalise_message("'price'") != normalise_message("'sku'")
    assert normalise_message("name 'tax' is not defined") == "name 'tax' is not defined"
    assert normalise_message('column "a" does not exist') != normalise_message(
        'column "b" does not exist')
    assert normalise_message("'NoneType' object has no attribute 'get'") != \
        normalise_message("'dict' object has no attribute 'get'")
    assert normalise_message("unsupported operand type(s) for +: 'int' and 'str'") != \
        normalise_message("unsupported operand type(s) for +: 'NoneType' and 'int'")


_VALUE = st.text(st.characters(blacklist_characters="'\n", blacklist_categories=("Cs",)),
                 max_size=60)
_WORDS = st.sampled_from(["failed for", "got", "customer", "not found:", "refused by"])


@settings(max_examples=200)
@given(_WORDS, _VALUE, _VALUE)
def test_any_quoted_value_after_ordinary_words_groups(words: str, a: str, b: str) -> None:
    """Whatever the value between the quotes (not a sentence, not a Python type name),
    one message shape, one group."""
    assume_plain = not re.search(r"[.!?]\s*$|[\"`\u201c\u201d\u2018\u2019\u00ab\u00bb]", a + b) \
        and not {a, b} & fingerprint._TYPE_NAMES
    if assume_plain:
        assert normalise_message(f"sync {words} '{a}' now") == \
            normalise_message(f"sync {words} '{b}' now") == f"sync {words} <str> now"


@settings(max_examples=100)
@given(st.text(alphabet="'\"`\u201c\u201d\u2018\u2019\u00ab\u00bb a.:\n", max_size=5000))
def test_quotes_anywhere_stay_bounded(message: str) -> None:
    """A message of quotes (untrusted): read from its head only, kept at most 500."""
    norm = normalise_message(message)
    assert len(norm) <= 500
    assert norm == normalise_message(message[:4096])
