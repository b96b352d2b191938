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
