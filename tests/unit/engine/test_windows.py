"""Swin v1/v2 windowed capture equals an independent windowing of each block's own weights.

The reference below partitions, rolls, looks up the relative position bias and builds the
region mask itself (nothing of it is taken from timm's Swin code); it only reads each block's
weights (qkv, bias table or continuous-position-bias MLP, logit scale) and each block's real
input, recorded with plain pre-hooks on the blocks.
"""

from __future__ import annotations

import math

import pytest
import timm
import torch
import torch.nn.functional as F

from app.engine.capture import CaptureError, UnsupportedModelError, capture_for
from app.engine.layout import WindowedLayout
from app.engine.windows import WindowCapture, WindowedAttention, is_windowed

SMALL = dict(depths=(2, 2, 2, 2), embed_dim=16, num_heads=(1, 2, 2, 4))

# name, create kwargs, dynamic size, input (H, W)
CASES = [
    ("swin_tiny_patch4_window7_224", SMALL, False, (224, 224)),  # native: static masks, last stage unshifted
    ("swin_tiny_patch4_window7_224", dict(SMALL, depths=(2, 2, 2)), True, (120, 164)),  # padding on every stage
    ("swinv2_tiny_window8_256", SMALL, False, (256, 256)),
    ("swinv2_tiny_window8_256", dict(SMALL, depths=(2, 2, 2)), True, (200, 140)),  # padding, grids below a window
]


def make(name: str, kwargs: dict, dynamic: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    m = timm.create_model(name, pretrained=False, num_classes=0, dynamic_img_size=dynamic, **kwargs)
    # Random inits leave biases at 0, bias tables near 0 and logit scales equal: make each matter.
    with torch.no_grad():
        for n, p in m.named_parameters():
            if n.endswith("relative_position_bias_table"):
                p.normal_(0, 1.0)
            elif n.endswith("logit_scale"):
                p.add_(torch.randn_like(p))
                p.view(-1)[0] = 5.0  # above log(100): the clamp must apply
            elif p.ndim == 1 and "bias" in n:
                p.add_(torch.randn_like(p) * 0.1)
    return m.eval()


def swin_blocks(model):
    return [blk for stage in model.layers for blk in stage.blocks]


def bias_v1(attn, wh: int, ww: int) -> torch.Tensor:
    """``[H, A, A]`` learned relative position bias, looked up from the table by hand."""
    ys, xs = torch.meshgrid(torch.arange(wh), torch.arange(ww), indexing="ij")
    ys, xs = ys.flatten(), xs.flatten()
    dy = ys[:, None] - ys[None, :] + wh - 1  # A, A offsets, shifted to start at 0
    dx = xs[:, None] - xs[None, :] + ww - 1
    return attn.relative_position_bias_table[dy * (2 * ww - 1) + dx].permute(2, 0, 1)


def bias_v2(attn, wh: int, ww: int) -> torch.Tensor:
    """``[H, A, A]`` continuous position bias: the block's MLP of log-spaced offsets, 16 * sigmoid."""
    ph, pw = attn.pretrained_window_size
    nh, nw = (ph - 1, pw - 1) if ph > 0 else (wh - 1, ww - 1)
    ys, xs = torch.meshgrid(torch.arange(wh), torch.arange(ww), indexing="ij")
    ys, xs = ys.flatten().float(), xs.flatten().float()
    dy = (ys[:, None] - ys[None, :]) / max(nh, 1) * 8
    dx = (xs[:, None] - xs[None, :]) / max(nw, 1) * 8
    coords = torch.stack([dy, dx], -1)  # A, A, 2
    coords = torch.sign(coords) * torch.log2(coords.abs() + 1.0) / math.log2(8)
    return 16 * torch.sigmoid(attn.cpb_mlp(coords).permute(2, 0, 1))


def reference_maps(model, x, version: str) -> list[torch.Tensor]:
    """Per block, ``[B, H, N, N]`` dense maps over the stage grid, from an independent windowing."""
    blocks = swin_blocks(model)
    inputs = []
    handles = [b.register_forward_pre_hook(lambda m, a: inputs.append(a[0])) for b in blocks]
    with torch.no_grad():
        model.forward_features(x)
    for h in handles:
        h.remove()
    maps = []
    with torch.no_grad():
        for blk, xin in zip(blocks, inputs):
            a = blk.attn
            B, gh, gw, C = xin.shape
            wh, ww = blk.window_size
            sh, sw = blk.shift_size
            nh = a.num_heads
            feats = blk.norm1(xin) if version == "v1" else xin  # v2 normalises after attention
            if version == "v1":
                qkv = a.qkv(feats)
            else:
                qkv = F.linear(feats, a.qkv.weight, torch.cat([a.q_bias, torch.zeros_like(a.q_bias), a.v_bias]))
            q, k = qkv.reshape(B, gh, gw, 3, nh, -1).unbind(3)[:2]  # B, gh, gw, H, d
            zero = a.qkv.bias if version == "v1" else torch.cat([a.q_bias, torch.zeros_like(a.q_bias), a.v_bias])
            if zero is None:
                zero = torch.zeros(3 * nh * q.shape[-1])
            q0, k0 = zero.reshape(3, nh, -1)[:2]
            Hp, Wp = -(-gh // wh) * wh, -(-gw // ww) * ww
            bias = bias_v1(a, wh, ww) if version == "v1" else bias_v2(a, wh, ww)

            # Regions of the rolled, padded grid that the roll brought together (shifted blocks).
            def region(i: int, size: int, w: int, s: int) -> int:
                if not s:
                    return 0
                return 0 if i < size - w else (1 if i < size - s else 2)

            # Cell N stands for padding: a zero token, whose q/k are the projection of 0.
            qf = torch.cat([q.reshape(B, gh * gw, nh, -1), q0.expand(B, 1, nh, -1)], 1)  # B, N + 1, H, d
            kf = torch.cat([k.reshape(B, gh * gw, nh, -1), k0.expand(B, 1, nh, -1)], 1)
            dense = torch.zeros(B, nh, gh * gw, gh * gw)
            for wi in range(Hp // wh):
                for wj in range(Wp // ww):
                    cells, regions = [], []
                    for di in range(wh):
                        for dj in range(ww):
                            i, j = wi * wh + di, wj * ww + dj
                            regions.append(region(i, Hp, wh, sh) * 3 + region(j, Wp, ww, sw))
                            # Rolled by -shift: rolled cell (i, j) is image cell (i + sh, j + sw) mod grid.
                            cells.append(((i + sh) % gh) * gw + (j + sw) % gw if i < gh and j < gw else -1)
                    cell = torch.tensor(cells)
                    take = torch.where(cell >= 0, cell, gh * gw)
                    Q, K = qf[:, take].transpose(1, 2), kf[:, take].transpose(1, 2)  # B, H, A, d
                    if version == "v1":
                        s = (Q * a.scale) @ K.transpose(-2, -1)
                    else:
                        scale = torch.clamp(a.logit_scale, max=math.log(100.0)).exp()  # H, 1, 1
                        s = (F.normalize(Q, dim=-1) @ F.normalize(K, dim=-1).transpose(-2, -1)) * scale
                    s = s + bias
                    reg = torch.tensor(regions)
                    s = s + (reg[:, None] != reg[None, :]) * -100.0  # cells the roll brought together
                    p = s.softmax(-1)
                    real = (cell >= 0).nonzero().flatten()  # padding cells leave the grid's rows and columns
                    dense[:, :, cell[real, None], cell[None, real]] = p[:, :, real][:, :, :, real]
            maps.append(dense)
    return maps


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
    row = att.rows(1, rows=[last])[0, 0].reshape(gh, gw)
    # Rolled by -3, its window holds image rows/cols 52-55 and 0-2 (wrapped round); the mask keeps
    # it to the 4 x 4 cells of its own region, the wrapped 3 x 3 to theirs.
    assert row[-4:, -4:].sum() == pytest.approx(1.0, abs=1e-5)
    top_left = att.rows(1, rows=[0])[0, 0].reshape(gh, gw)
    assert top_left[:3, :3].sum() == pytest.approx(1.0, abs=1e-5)
    assert top_left[-4:, -4:].sum() < 1e-30  # same window, other region: exp(-100) at most
    # An unshifted block keeps the window at the origin.
    assert att.rows(0, rows=[0])[0, 0].reshape(gh, gw)[:7, :7].sum() == pytest.approx(1.0, abs=1e-5)


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
