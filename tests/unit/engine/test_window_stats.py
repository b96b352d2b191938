"""Window statistics pinned on hand-made window attention with known answers."""

from __future__ import annotations

import math

import pytest
import torch

from headscope.engine.layout import Stage
from headscope.engine.window_stats import UNAVAILABLE, window_stats
from headscope.engine.windows import WindowedAttention, WindowIndex


def capture(probs: torch.Tensor, grid=(4, 4), window=(2, 2), shift=(0, 0), cell=(8, 8)) -> WindowedAttention:
    """One layer, one stage, with the given ``[nW, H, A, A]`` window softmax."""
    nw, H, A, _ = probs.shape
    stage = Stage(0, 0, 0, H, 1, window, (shift,), grid, cell)
    n = grid[0] * grid[1]
    head_out = torch.randn(nw, A, 2 * H)
    return WindowedAttention([stage], [probs], [head_out], torch.ones(n))


def test_uniform_windows_have_entropy_one_and_self_attention_zero():
    uniform = torch.full((4, 2, 4, 4), 0.25)
    st = window_stats(capture(uniform)).as_dict((32, 32))
    assert st["entropy"][0] == pytest.approx([1.0, 1.0], abs=1e-6)  # over the W*W keys, not all 16 cells
    eye = torch.eye(4).expand(4, 2, 4, 4).clone()
    st = window_stats(capture(eye)).as_dict((32, 32))
    assert st["entropy"][0] == pytest.approx([0.0, 0.0], abs=1e-6)
    assert st["distance_px"][0] == pytest.approx([0.0, 0.0], abs=1e-6)
    torch.testing.assert_close(torch.tensor(st["similarity"][0]), torch.ones(2, 2), atol=1e-6, rtol=0)


def test_distance_is_measured_between_cells_of_the_image_grid():
    # Every cell attends to the cell beside it in its 2 x 2 window (left <-> right): 8 px away.
    p = torch.zeros(4, 1, 4, 4)
    for a, b in ((0, 1), (1, 0), (2, 3), (3, 2)):
        p[:, 0, a, b] = 1
    st = window_stats(capture(p)).as_dict((32, 32))
    assert st["distance_px"][0] == pytest.approx([8.0], abs=1e-5)
    # Shifted by one cell, the wrapped window of cell (3, 3) holds cells (3, 0), (0, 3), (0, 0):
    # named in the image grid, the neighbour "beside" cell (3, 3) is cell (3, 0), 24 px away.
    att = capture(p, shift=(1, 1))
    ix = WindowIndex.build((4, 4), (2, 2), (1, 1), torch.device("cpu"))
    corner = 15
    row = att.rows(0, queries=[corner])[0, 0]
    assert row.nonzero().flatten().tolist() == [12]  # cell (3, 0)
    assert ix.cells[ix.window[corner]].sort().values.tolist() == [0, 3, 12, 15]
    d = window_stats(att).as_dict((32, 32))["distance_px"][0][0]
    assert d == pytest.approx((8 * 8 + 8 * 24) / 16, abs=1e-4)  # 8 cells in the middle, 8 wrap around


def test_padding_keys_count_for_entropy_but_not_for_distance():
    # A 3 x 3 grid in 2 x 2 windows: padded to 4 x 4; half of the last window's keys are padding.
    p = torch.full((4, 1, 4, 4), 0.25)
    att = capture(p, grid=(3, 3))
    st = window_stats(att).as_dict((24, 24))
    assert st["entropy"][0] == pytest.approx([1.0], abs=1e-6)
    rows = att.rows(0)[0]  # 9, 9 over the grid: rows of windows with padding sum below 1
    assert rows[8].sum() == pytest.approx(0.25) and rows[0].sum() == pytest.approx(1.0)
    # Cell (2, 2) has only itself in its window: distance 0 once padding is left out.
    assert st["distance_px"][0][0] == pytest.approx((4 * (2 * 8 + 8 * math.sqrt(2)) / 4 + 4 * 4 + 0) / 9, abs=1e-4)


def test_meaningless_fields_are_null_with_a_reason():
    st = window_stats(capture(torch.full((4, 2, 4, 4), 0.25))).as_dict((32, 32))
    for k in ("prefix_mass", "artifact_mass", "entropy_cls", "cls_cosine", "mass_patches"):
        assert st[k] is None and st["unavailable"][k] == UNAVAILABLE[k]
    assert "rollout" in st["unavailable"] and st["heads_per_layer"] == [2]
    assert st["rank"]["max"] == min(16, 4) and st["entropy_over"] == "window"
