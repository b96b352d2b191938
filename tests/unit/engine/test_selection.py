"""The layers/heads/query grammar."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headscope.engine.layout import TokenLayout
from headscope.engine.selection import SelectionError, parse_indices, parse_query

LAYOUT = TokenLayout(["cls", "reg"], (3, 4), (14, 14))  # N = 2 + 12


@pytest.mark.parametrize(
    "spec,want",
    [
        ("all", list(range(12))),
        (None, list(range(12))),
        ("", list(range(12))),
        ("0,5,11", [0, 5, 11]),
        ("-1", [11]),
        ("0-3", [0, 1, 2, 3]),
        ("-3--1", [9, 10, 11]),
        (" 2 , 2,1 ", [2, 1]),
        ("ALL", list(range(12))),
    ],
)
def test_indices(spec, want):
    assert parse_indices(spec, 12, "layers") == want


@pytest.mark.parametrize("spec", ["12", "-13", "a", "1-", "3-1", "1,,2", "1.5", "0-99999999"])
def test_bad_indices(spec):
    with pytest.raises(SelectionError):
        parse_indices(spec, 12, "layers")


@pytest.mark.parametrize(
    "spec,want",
    [
        ("cls", [0]),
        ("all", None),
        ("0,13", [0, 13]),
        ("-1", [13]),
        ("patch:0,0", [2]),
        ("patch:2,3", [13]),
        ("patch:-1,-1", [13]),
        ("patch:0,1;1,0", [3, 6]),
    ],
)
def test_query(spec, want):
    assert parse_query(spec, LAYOUT) == want


@pytest.mark.parametrize("spec", ["14", "-15", "patch:3,0", "patch:0,4", "patch:1", "row", "patch:a,b", "1,x"])
def test_bad_query(spec):
    with pytest.raises(SelectionError):
        parse_query(spec, LAYOUT)


def test_cls_query_needs_a_cls_token():
    with pytest.raises(SelectionError, match="no CLS"):
        parse_query("cls", TokenLayout([], (2, 2), (16, 16)))


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=40))
def test_parsers_never_fail_unexpectedly(text):
    for fn in (lambda s: parse_indices(s, 12, "layers"), lambda s: parse_query(s, LAYOUT)):
        try:
            out = fn(text)
        except SelectionError:
            continue
        if out is not None:
            assert all(0 <= i < 14 for i in out)


def test_a_huge_index_is_out_of_range_not_unreadable():
    """``layers=99999999999999999999`` was "cannot read" (the grammar took 6 digits), where a
    smaller number out of range was "out of range (valid: ...)"; ``ablate`` and the query alike.
    The message says how long a number too long to show is."""
    from headscope.engine.ablation import AblationError, parse_ablate

    huge = "9" * 20
    with pytest.raises(SelectionError, match=r"layers: index of 20 digits is out of range for 12 layers"):
        parse_indices(huge, 12, "layers")
    with pytest.raises(SelectionError, match=r"heads: index 1234567 is out of range"):
        parse_indices("0-1234567", 6, "heads")
    with pytest.raises(AblationError, match=r"ablate: layer of 20 digits in '9+:0' is out of range"):
        parse_ablate(f"{huge}:0", 12, 6)
    with pytest.raises(AblationError, match=r"cannot read '0:1 0:2'; separate pairs with commas"):
        parse_ablate("0:1 0:2", 12, 6)  # quoted as typed (it said '0:10:2')
    assert parse_ablate("0 : 1, 2:3", 12, 6) == ((0, 1), (2, 3))
    with pytest.raises(SelectionError, match=r"query: token of 20 digits is out of range for 14 tokens"):
        parse_query(huge, LAYOUT)
    with pytest.raises(SelectionError, match=r"query: patch \(of 20 digits, 0\) is outside the 3 x 4 grid"):
        parse_query(f"patch:{huge},0", LAYOUT)
