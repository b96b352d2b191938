"""Selections against a windowed model's stages: one stage per request, cells of its grid."""

from __future__ import annotations

import pytest

from headscope.engine.layout import Stage, WindowedLayout
from headscope.engine.selection import SelectionError, StageSpanError, resolve_windowed

# Swin-T's stages (any input): 2 + 2 + 6 + 2 layers, 3/6/12/24 heads, 7 x 7 windows.
SPECS = [
    Stage(0, 0, 1, 3, 1, (7, 7), ((0, 0), (3, 3)), (56, 56), (4, 4)),
    Stage(1, 2, 3, 6, 2, (7, 7), ((0, 0), (3, 3)), (28, 28), (8, 8)),
    Stage(2, 4, 9, 12, 4, (7, 7), ((0, 0), (3, 3)) * 3, (14, 14), (16, 16)),
    Stage(3, 10, 11, 24, 8, (7, 7), ((0, 0), (0, 0)), (7, 7), (32, 32)),
]


def test_layout_follows_the_input():
    lay = WindowedLayout.at(SPECS, (4, 4), (224, 336))  # the cat at the default size
    assert [s.grid for s in lay.stages] == [(56, 84), (28, 42), (14, 21), (7, 11)]  # 21 -> 11: merging pads
    assert [s.cell_size for s in lay.stages] == [(4, 4), (8, 8), (16, 16), (32, 32)]
    assert lay.stages[3].windows == (1, 2) and lay.num_layers == 12
    assert lay.stage_of(9).index == 2 and lay.stage_of(10).index == 3
    assert lay.stages[2].tokens().count == 14 * 21 and lay.stages[2].tokens().num_prefix == 0


def test_one_stage_resolves_to_its_grid_and_heads():
    lay = WindowedLayout.at(SPECS, (4, 4), (224, 224))
    stage, layers, heads, rows = resolve_windowed("4-9", "all", "patch:13,0;0,1", lay)
    assert stage.index == 2 and layers == list(range(4, 10)) and heads == list(range(12))
    assert rows == [13 * 14, 1]
    stage, layers, heads, rows = resolve_windowed("-1", "-1", "all", lay)
    assert (stage.index, layers, heads, rows) == (3, [11], [23], None)


@pytest.mark.parametrize("layers", ["all", "1-2", "0,11", "9,10"])
def test_layers_of_two_stages_are_refused_naming_each_stage(layers):
    lay = WindowedLayout.at(SPECS, (4, 4), (224, 224))
    with pytest.raises(StageSpanError) as e:
        resolve_windowed(layers, "all", "0", lay)
    msg = str(e.value)
    assert e.value.code == "layers_span_stages"
    stages = ("stage 0 = layers 0-1 (56 x 56", "stage 1 = layers 2-3", "stage 2 = layers 4-9", "stage 3 = layers 10-11")
    assert all(s in msg for s in stages)


def test_cls_query_says_swin_has_none():
    lay = WindowedLayout.at(SPECS, (4, 4), (224, 224))
    with pytest.raises(SelectionError, match="Swin has no CLS token"):
        resolve_windowed("0", "all", "cls", lay)
    with pytest.raises(SelectionError, match="Swin has no CLS token"):
        resolve_windowed("0", "all", None, lay)  # the default query


@pytest.mark.parametrize(
    "layers,heads,query,match",
    [
        ("0", "3", "0", "out of range for 3 heads"),  # stage 0 has 3 heads, not 24
        ("0", "all", "patch:56,0", "outside the 56 x 56 grid"),
        ("10", "all", "49", "out of range for 49 tokens"),
        ("12", "all", "0", "out of range"),
    ],
)
def test_out_of_range_is_checked_against_the_stage(layers, heads, query, match):
    lay = WindowedLayout.at(SPECS, (4, 4), (224, 224))
    with pytest.raises(SelectionError, match=match):
        resolve_windowed(layers, heads, query, lay)


def test_rollout_stays_within_the_stage():
    lay = WindowedLayout.at(SPECS, (4, 4), (224, 224))
    assert resolve_windowed("4-9", "all", "0", lay, "rollout", 4)[0].index == 2
    assert resolve_windowed("10-11", "all", "0", lay, "rollout", -2)[0].index == 3  # -2 is layer 10
    with pytest.raises(StageSpanError, match="use rollout_start=4"):
        resolve_windowed("4-9", "all", "0", lay, "rollout", 0)


def test_dense_answers_are_bounded_on_big_stages():
    lay = WindowedLayout.at(SPECS, (4, 4), (224, 336))  # stage 0: 56 x 84 = 4704 cells
    with pytest.raises(SelectionError, match=r"4704 x 4704 maps for stage 0 .*stages 1, 2, 3 here"):
        resolve_windowed("0-1", "all", "all", lay)
    with pytest.raises(SelectionError, match="rollout would multiply"):
        resolve_windowed("0-1", "all", "0", lay, "rollout", 0)
    assert resolve_windowed("0-1", "all", "patch:0,0;55,83", lay)[3] == [0, 4703]  # rows are fine
    assert resolve_windowed("4-9", "all", "all", lay)[3] is None  # 14 x 21 cells
