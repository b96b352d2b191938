"""Swin v1/v2 windowed capture equals an independent windowing of each block's own weights.

The reference (tests/helpers/swin_reference.py) partitions, rolls, looks up the relative position bias
and builds the region mask itself (nothing of it is taken from timm's Swin code); it only reads
each block's weights and its real input, recorded with plain pre-hooks on the blocks.
"""

from __future__ import annotations

import pytest
import timm
import torch

from headscope.engine.block_capture import CaptureError, UnsupportedModelError
from headscope.engine.layout import WindowedLayout
from headscope.engine.windows import WindowCapture, WindowedAttention, is_windowed
from headscope.zoo.loaders import capture_for
from helpers.swin_reference import make, reference_maps, swin_blocks

SMALL = dict(depths=(2, 2, 2, 2), embed_dim=16, num_heads=(1, 2, 2, 4))

# name, create kwargs, dynamic size, input (H, W)
CASES = [
    ("swin_tiny_patch4_window7_224", SMALL, False, (224, 224)),  # native: static masks, last stage unshifted
    ("swin_tiny_patch4_window7_224", dict(SMALL, depths=(2, 2, 2)), True, (120, 164)),  # padding on every stage
    ("swinv2_tiny_window8_256", SMALL, False, (256, 256)),
    ("swinv2_tiny_window8_256", dict(SMALL, depths=(2, 2, 2)), True, (200, 140)),  # padding, grids below a window
]


@pytest.mark.parametrize("name,kwargs,dynamic,hw", CASES, ids=[f"{c[0]}-{c[3][0]}x{c[3][1]}" for c in CASES])
def test_window_capture_matches_independent_windowing(name, kwargs, dynamic, hw):
    model = make(name, kwargs, dynamic)
    version = "v2" if "v2" in name else "v1"
    torch.manual_seed(1)
    batch = 2 if dynamic else 1  # batch-mates split apart; the native cases are the big ones
    x = torch.randn(batch, 3, *hw)
    ref = reference_maps(model, x, version)
    cap = capture_for(model)
    assert isinstance(cap, WindowCapture) and cap.version == version
    with torch.no_grad():
        plain = model.forward_features(x)
        with cap.capturing():
            hooked = model.forward_features(x)
    res = cap.results()
    torch.testing.assert_close(hooked, plain, atol=0, rtol=0)  # the model's own output, untouched
    assert len(res) == batch and all(isinstance(r, WindowedAttention) for r in res)
    layout = WindowedLayout.at(cap.stages, (4, 4), hw)
    shifted = padded = 0
    for b in range(batch):
        assert res[b].num_layers == len(ref) == layout.num_layers
        for layer, r in enumerate(ref):
            stage = layout.stage_of(layer)
            assert res[b].stage_of(layer).grid == stage.grid  # the layout predicts the real grids
            n = stage.grid[0] * stage.grid[1]
            got = res[b].rows(layer)
            assert got.shape == r[b].shape == (stage.heads, n, n)
            torch.testing.assert_close(got, r[b], atol=2e-6, rtol=1e-5)
            # A selection equals the same slice of the full map.
            part = res[b].rows(layer, [stage.heads - 1, 0], [n - 1, 0, n // 2])
            torch.testing.assert_close(part, got[[stage.heads - 1, 0]][:, [n - 1, 0, n // 2]])
            # Each row's mass sits inside its window: at most W*W cells, and it sums to 1
            # unless the window hangs over the grid's edge (the rest went to the padding).
            window_area = stage.window[0] * stage.window[1]
            assert ((got > 0).sum(-1) <= window_area).all()
            sums = got.sum(-1)
            assert (sums <= 1 + 1e-5).all()
            has_pad = stage.grid[0] % stage.window[0] or stage.grid[1] % stage.window[1]
            if not has_pad:
                torch.testing.assert_close(sums, torch.ones_like(sums), atol=1e-5, rtol=0)
            padded += bool(has_pad)
            shifted += any(stage.shift_of(layer))
    assert shifted, "the case must exercise shifted windows"
    if dynamic:
        assert padded, "the case must exercise padding"


def test_shifted_rows_are_named_in_the_image_grid():
    """A corner cell of a shifted block attends across the image: the roll wraps its window."""
    model = make("swin_tiny_patch4_window7_224", dict(SMALL, depths=(2,)), False)
    cap = WindowCapture(model)
    with torch.no_grad(), cap.capturing():
        model.forward_features(torch.randn(1, 3, 224, 224))
    (att,) = cap.results()
    gh, gw = att.stages[0].grid  # 56 x 56, window 7, shift 3 in layer 1
    last = (gh - 1) * gw + gw - 1  # bottom-right cell
    row = att.rows(1, queries=[last])[0, 0].reshape(gh, gw)
    # Rolled by -3, its window holds image rows/cols 52-55 and 0-2 (wrapped round); the mask keeps
    # it to the 4 x 4 cells of its own region, the wrapped 3 x 3 to theirs.
    assert row[-4:, -4:].sum() == pytest.approx(1.0, abs=1e-5)
    top_left = att.rows(1, queries=[0])[0, 0].reshape(gh, gw)
    assert top_left[:3, :3].sum() == pytest.approx(1.0, abs=1e-5)
    assert top_left[-4:, -4:].sum() < 1e-30  # same window, other region: exp(-100) at most
    # An unshifted block keeps the window at the origin.
    assert att.rows(0, queries=[0])[0, 0].reshape(gh, gw)[:7, :7].sum() == pytest.approx(1.0, abs=1e-5)


def test_window_rows_and_head_outputs_follow_the_grid():
    model = make("swinv2_tiny_window8_256", dict(SMALL, depths=(2, 2)), True)
    cap = WindowCapture(model)
    with torch.no_grad(), cap.capturing():
        model.forward_features(torch.randn(1, 3, 136, 200))
    (att,) = cap.results()
    for layer in range(att.num_layers):
        s = att.stage_of(layer)
        n = s.grid[0] * s.grid[1]
        w = att.window_rows(layer)
        assert w.shape == (s.heads, n, s.window[0] * s.window[1])
        torch.testing.assert_close(w.sum(-1), torch.ones(s.heads, n), atol=1e-5, rtol=0)  # the softmax's own support
        assert att.head_out_cells(layer).shape[0] == n


def test_fused_v1_is_switched_off_only_during_the_capture():
    model = make("swin_tiny_patch4_window7_224", dict(SMALL, depths=(2, 2)), False)
    blocks = swin_blocks(model)
    for b in blocks:
        b.attn.fused_attn = True
    x = torch.randn(1, 3, 224, 224)
    cap = WindowCapture(model)
    with torch.no_grad(), cap.capturing():
        assert not any(b.attn.fused_attn for b in blocks)
        model.forward_features(x)
    assert all(b.attn.fused_attn for b in blocks)
    (att,) = cap.results()
    for b in blocks:
        b.attn.fused_attn = False
    ref = reference_maps(model, x, "v1")
    torch.testing.assert_close(att.rows(3), ref[3][0], atol=2e-6, rtol=1e-5)


def test_empty_and_double_captures_raise():
    model = make("swin_tiny_patch4_window7_224", dict(SMALL, depths=(2,)), False)
    cap = WindowCapture(model)
    with cap.capturing():
        pass
    with pytest.raises(CaptureError, match="expected once"):
        cap.results()
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad(), cap.capturing():
        model.forward_features(x)
        model.forward_features(x)
    with pytest.raises(CaptureError):
        cap.results()
    for blk in swin_blocks(model):  # hooks are gone
        assert not blk._forward_pre_hooks and not blk.attn.attn_drop._forward_pre_hooks


def test_stages_of_swin_t():
    model = timm.create_model("swin_tiny_patch4_window7_224", pretrained=False, num_classes=0)
    cap = capture_for(model)
    st = cap.stages
    assert [(s.first_layer, s.last_layer) for s in st] == [(0, 1), (2, 3), (4, 9), (10, 11)]
    assert [s.grid for s in st] == [(56, 56), (28, 28), (14, 14), (7, 7)]
    assert [s.heads for s in st] == [3, 6, 12, 24]
    assert all(s.window == (7, 7) for s in st)
    assert st[0].shifts == ((0, 0), (3, 3)) and st[3].shifts == ((0, 0), (0, 0))  # window >= 7 x 7 grid
    assert is_windowed(model)


def test_other_windowed_designs_are_refused():
    model = timm.create_model("swinv2_cr_tiny_224", pretrained=False, num_classes=0)
    with pytest.raises(UnsupportedModelError, match="supported families: .*swin"):
        capture_for(model)
