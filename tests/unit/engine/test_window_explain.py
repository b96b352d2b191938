"""Explain and temperature for Swin v1/v2 against an independent windowing of each block's weights.

The reference (tests/helpers/swin_reference.py) partitions, rolls, looks up the relative position bias
and builds the region mask by hand; it reads only each block's weights and its real input.
"""

from __future__ import annotations

import pytest
import torch

from headscope.engine.block_capture import CaptureError
from headscope.engine.window_explain import explain_window_head
from headscope.engine.windows import WindowCapture, WindowedAttention
from helpers.swin_reference import make, reference_explain, reference_maps, swin_blocks

SMALL = dict(depths=(2, 2, 2), embed_dim=16, num_heads=(1, 2, 4))

# name, create kwargs, dynamic size, input (H, W): padded grids on every stage, shifted blocks
CASES = [
    ("swin_tiny_patch4_window7_224", SMALL, True, (120, 164)),
    ("swinv2_tiny_window8_256", SMALL, True, (200, 140)),
    ("swin_tiny_patch4_window7_224", dict(SMALL, depths=(2,)), False, (224, 224)),  # native size, static mask
]
IDS = [f"{c[0].split('_')[0]}-{c[3][0]}x{c[3][1]}" for c in CASES]


def capture(model, x) -> tuple[WindowedAttention, list[torch.Tensor]]:
    """The capture of ``x`` and every block's real proj output ``[nW, A, D]`` (hooks on the modules)."""
    outs: list[torch.Tensor] = []
    hooks = [b.attn.proj.register_forward_hook(lambda m, a, o: outs.append(o)) for b in swin_blocks(model)]
    cap = WindowCapture(model)
    with torch.no_grad(), cap.capturing():
        model.forward_features(x)
    for h in hooks:
        h.remove()
    (att,) = cap.results()
    return att, outs


def cells_to_explain(att: WindowedAttention, layer: int) -> list[int]:
    """The first and last cell, a middle one, and a cell whose window holds padding (if any)."""
    gh, gw = att.stage_of(layer).grid
    ix = att.index(layer)
    padded = [c for c in range(gh * gw) if (ix.cells[ix.window[c]] < 0).any()]
    return sorted({0, gh * gw - 1, (gh // 2) * gw + gw // 2, *padded[-1:]})


@pytest.mark.parametrize("name,kwargs,dynamic,hw", CASES, ids=IDS)
def test_explain_equals_an_independent_windowing(name, kwargs, dynamic, hw):
    model = make(name, kwargs, dynamic)
    version = "v2" if "v2" in name else "v1"
    torch.manual_seed(2)
    x = torch.randn(1, 3, *hw)
    att, proj_out = capture(model, x)
    blocks = swin_blocks(model)
    seen = {"shifted": 0, "padding": 0, "masked": 0}
    for layer, blk in enumerate(blocks):
        s = att.stage_of(layer)
        ix = att.index(layer)
        for cell in cells_to_explain(att, layer):
            head = s.heads - 1
            hc = explain_window_head(att, blk.attn, layer, head, cell)
            ref = reference_explain(model, x, version, layer, head, cell)
            assert hc.key_tokens == ref["key_tokens"] and cell in hc.key_tokens
            assert hc.key_tokens[hc.place] == cell
            A = s.window[0] * s.window[1]
            assert hc.k.shape == hc.v.shape == (A, hc.head_dim) and hc.scores.shape == (A,)
            for f in ("q", "k", "v", "bias", "scores", "head_output"):
                torch.testing.assert_close(getattr(hc, f), ref[f].float(), atol=2e-5, rtol=1e-5, msg=f)
            assert hc.scale == pytest.approx(ref["scale"], rel=1e-6)
            torch.testing.assert_close(hc.attention, ref["attention"], atol=2e-6, rtol=1e-5)
            if any(s.shift_of(layer)):
                assert hc.mask is not None
                torch.testing.assert_close(hc.mask, ref["mask"].float(), atol=0, rtol=0)
                seen["masked"] += bool((hc.mask < 0).any())
            else:
                assert hc.mask is None and not ref["mask"].any()
            # scores = scale * q.k + bias + mask, as the answer's own fields say
            parts = hc.scale * hc.dot + hc.bias + (hc.mask if hc.mask is not None else 0)
            torch.testing.assert_close(hc.scores, parts, atol=2e-5, rtol=1e-5)
            # softmax(scores) is the served row's nonzero entries; padding keys are in the softmax only
            row = att.rows(layer, [head], [cell])[0, 0]
            keys = torch.tensor(hc.key_tokens)
            real = keys >= 0
            torch.testing.assert_close(hc.attention[real], row[keys[real]], atol=2e-6, rtol=1e-5)
            assert row.sum() == pytest.approx(float(hc.attention[real].sum()), abs=1e-5)
            outside = torch.ones_like(row, dtype=torch.bool)
            outside[keys[real]] = False
            assert not row[outside].any()
            # the shares plus the bias are the projection output, captured by a hook on the module
            y = proj_out[layer][ix.window[cell], ix.pos[cell]]
            torch.testing.assert_close(hc.attn_output, y, atol=2e-5, rtol=1e-5)
            torch.testing.assert_close(hc.head_contributions.sum(0) + hc.proj_bias, y, atol=2e-5, rtol=1e-5)
            torch.testing.assert_close(hc.attn_output, ref["attn_output"], atol=5e-5, rtol=1e-4)
            seen["shifted"] += any(s.shift_of(layer))
            seen["padding"] += bool((keys < 0).any())
    assert seen["shifted"] and seen["masked"], seen
    if dynamic:
        assert seen["padding"], seen


@pytest.mark.parametrize("name,kwargs,dynamic,hw", CASES[:2], ids=IDS[:2])
@pytest.mark.parametrize("T", [0.25, 3.0, 40.0])
def test_temperature_rows_equal_softmax_of_the_real_scores(name, kwargs, dynamic, hw, T):
    """softmax(scores / T) over the window, the mask's -100 included: at T = 40 a masked key
    weighs exp(-2.5) of its neighbour; a softmax of ``log p`` kept it at 0 wherever p underflowed."""
    model = make(name, kwargs, dynamic)
    version = "v2" if "v2" in name else "v1"
    torch.manual_seed(3)
    x = torch.randn(1, 3, *hw)
    att, _ = capture(model, x)
    ref = reference_maps(model, x, version, temperature=T)
    ref1 = reference_maps(model, x, version)
    masked_gain = 0.0
    for layer, r in enumerate(ref):
        got = att.rows(layer, temperature=T)
        torch.testing.assert_close(got, r[0], atol=2e-6, rtol=1e-5)
        part = att.rows(layer, [0], [3, 0], temperature=T)
        torch.testing.assert_close(part, got[[0]][:, [3, 0]], atol=0, rtol=0)
        ix = att.index(layer)
        keys = ix.cells[ix.window]  # N, A: each query's window
        support = torch.zeros(got.shape[1:], dtype=torch.bool)
        rows = torch.arange(keys.shape[0])[:, None].expand_as(keys)
        support[rows[keys >= 0], keys[keys >= 0]] = True
        assert not got[:, ~support].any()  # still only the window's cells
        if any(att.stage_of(layer).shift_of(layer)):
            masked_gain = max(masked_gain, float(got[ref1[layer][0] < 1e-30].max()))
    if T >= 10:
        assert masked_gain > 1e-3, "the masked keys take weight at a high temperature"
    # explain's scores give the same tempered row
    layer = 1
    hc = explain_window_head(att, swin_blocks(model)[layer].attn, layer, 0, 5)
    keys = torch.tensor(hc.key_tokens)
    tempered = torch.softmax(hc.scores.double() / T, -1).float()
    row = att.rows(layer, [0], [5], temperature=T)[0, 0]
    torch.testing.assert_close(row[keys[keys >= 0]], tempered[keys >= 0], atol=2e-6, rtol=1e-5)


def test_capture_keeps_the_windows_tokens_and_masks():
    model = make("swinv2_tiny_window8_256", SMALL, True)
    att, _ = capture(model, torch.randn(1, 3, 200, 140))
    for layer in range(att.num_layers):
        s = att.stage_of(layer)
        nw, A = att.probs[layer].shape[0], s.window[0] * s.window[1]
        assert att.inputs[layer].shape[:2] == (nw, A)
        m = att.masks[layer]
        assert (m is None) == (not any(s.shift_of(layer)))
        if m is not None:
            assert m.shape == (nw, A, A) and set(m.unique().tolist()) <= {0.0, -100.0}
    assert att.nbytes() >= sum(x.numel() * 4 for x in att.inputs)
    bare = WindowedAttention(att.stages, att.probs, att.head_out, att.last_norms)
    torch.testing.assert_close(bare.rows(0), att.rows(0))
    with pytest.raises(CaptureError, match="temperature 1 only"):
        bare.rows(0, temperature=2.0)
