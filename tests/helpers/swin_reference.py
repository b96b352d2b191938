"""An independent windowing of Swin v1/v2 blocks, for the exactness tests (unit and API).

It partitions, rolls, looks up the relative position bias and builds the region mask itself:
nothing of it is taken from timm's Swin code. It reads only each block's weights (qkv, bias
table or continuous-position-bias MLP, logit scale) and each block's real input, recorded with
plain pre-hooks on the blocks.
"""

from __future__ import annotations

import math

import timm
import torch
import torch.nn.functional as F

# The Swin models of the shared Swin server (tests/conftest.py, swin_server): random-weight v1
# and v2, and a local checkpoint of random weights (a classifier, head included) of this name.
SWIN_ARCH = "swin_tiny_patch4_window7_224"
SWIN_V1 = f"random:{SWIN_ARCH}"
SWIN_V2 = "random:swinv2_tiny_window8_256"
SWIN_CHECKPOINT = "swin-random.safetensors"
SWIN_LOCAL = f"local:{SWIN_ARCH}@{SWIN_CHECKPOINT}"  # the id the server lists it under


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


def block_inputs(model, x) -> list[torch.Tensor]:
    """Each block's real input ``[B, gh, gw, C]``, recorded with plain pre-hooks on the blocks."""
    inputs = []
    handles = [b.register_forward_pre_hook(lambda m, a: inputs.append(a[0])) for b in swin_blocks(model)]
    with torch.no_grad():
        model.forward_features(x)
    for h in handles:
        h.remove()
    return inputs


def block_windows(blk, xin: torch.Tensor, version: str) -> list[dict]:
    """Every window of one block, windowed by hand: ``cells`` (``[A]`` image-grid cell of each
    place, -1 for padding), ``scores`` (``[B, H, A, A]`` pre-softmax, bias and mask included),
    ``bias``, ``mask`` (``[H, A, A]``, ``[A, A]``), ``q``, ``k``, ``v`` (``[B, H, A, d]``; v2: q, k
    as projected, before the normalisation), ``scale`` (``[H]``)."""
    a = blk.attn
    B, gh, gw, C = xin.shape
    wh, ww = blk.window_size
    sh, sw = blk.shift_size
    nh = a.num_heads
    with torch.no_grad():
        feats = blk.norm1(xin) if version == "v1" else xin  # v2 normalises after attention
        if version == "v1":
            qkv = a.qkv(feats)
            zero = a.qkv.bias
        else:
            zero = torch.cat([a.q_bias, torch.zeros_like(a.q_bias), a.v_bias])
            qkv = F.linear(feats, a.qkv.weight, zero)
        q, k, v = qkv.reshape(B, gh, gw, 3, nh, -1).unbind(3)  # B, gh, gw, H, d
        if zero is None:
            zero = torch.zeros(3 * nh * q.shape[-1])
        q0, k0, v0 = zero.reshape(3, nh, -1)
        Hp, Wp = -(-gh // wh) * wh, -(-gw // ww) * ww
        bias = bias_v1(a, wh, ww) if version == "v1" else bias_v2(a, wh, ww)
        if version == "v1":
            scale = torch.full((nh,), a.scale)
        else:
            scale = torch.clamp(a.logit_scale, max=math.log(100.0)).exp().flatten()  # H

        # Regions of the rolled, padded grid that the roll brought together (shifted blocks).
        def region(i: int, size: int, w: int, s: int) -> int:
            if not s:
                return 0
            return 0 if i < size - w else (1 if i < size - s else 2)

        # Cell N stands for padding: a zero token, whose q/k/v are the projection of 0.
        def flat(t, t0):
            return torch.cat([t.reshape(B, gh * gw, nh, -1), t0.expand(B, 1, nh, -1)], 1)  # B, N + 1, H, d

        qf, kf, vf = flat(q, q0), flat(k, k0), flat(v, v0)
        out = []
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
                Q, K, V = (t[:, take].transpose(1, 2) for t in (qf, kf, vf))  # B, H, A, d
                if version == "v1":
                    s = (Q * a.scale) @ K.transpose(-2, -1)
                else:
                    s = (F.normalize(Q, dim=-1) @ F.normalize(K, dim=-1).transpose(-2, -1)) * scale[:, None, None]
                reg = torch.tensor(regions)
                mask = (reg[:, None] != reg[None, :]) * -100.0  # cells the roll brought together
                s = s + bias + mask
                out.append(dict(cells=cell, scores=s, bias=bias, mask=mask, q=Q, k=K, v=V, scale=scale))
    return out


def reference_maps(model, x, version: str, queries=None, temperature: float = 1.0) -> list[torch.Tensor]:
    """Per block, ``[B, H, N, N]`` dense maps over the stage grid, from an independent windowing.

    Args:
        queries: optional ``layer -> [cell, ...]``: keep only those query rows, ``[B, H, Q, N]``
            (big grids: stage 0 of Swin-T at 224 x 336 px has 4704 cells).
        temperature: ``softmax(scores / temperature)``, the mask's -100 included.
    """
    maps = []
    for layer, (blk, xin) in enumerate(zip(swin_blocks(model), block_inputs(model, x))):
        B, gh, gw, _ = xin.shape
        n = gh * gw
        wanted = torch.arange(n) if queries is None else torch.tensor(queries[layer])
        row_of = torch.full((n,), -1)
        row_of[wanted] = torch.arange(len(wanted))
        dense = torch.zeros(B, blk.attn.num_heads, len(wanted), n)  # the wanted rows of the stage's maps
        for win in block_windows(blk, xin, version):
            cell = win["cells"]
            p = (win["scores"].double() / temperature).softmax(-1).float()
            real = (cell >= 0).nonzero().flatten()  # padding cells leave the grid's rows and columns
            qs = real[row_of[cell[real]] >= 0]  # the window's places that hold wanted rows
            dense[:, :, row_of[cell[qs], None], cell[None, real]] = p[:, :, qs][:, :, :, real]
        maps.append(dense)
    return maps


def reference_explain(model, x, version: str, layer: int, head: int, cell: int, image: int = 0) -> dict:
    """One head's computation for one query cell of ``layer``, from the independent windowing.

    Returns ``key_tokens`` (the window's cells, -1 for padding), ``q`` (``[d]``), ``k``, ``v``
    (``[A, d]``; v2: q and k L2-normalised, as they enter the dot product), ``scale``, ``bias``,
    ``mask``, ``scores``, ``attention`` (``[A]``), ``head_output`` (``[d]``) and ``attn_output``
    (``[D]``: the block's proj applied to every head's output for the cell).
    """
    blk = swin_blocks(model)[layer]
    xin = block_inputs(model, x)[layer]
    for win in block_windows(blk, xin, version):
        places = (win["cells"] == cell).nonzero().flatten()
        if len(places):
            break
    else:
        raise AssertionError(f"cell {cell} is in no window of layer {layer}")
    p = int(places[0])
    Q, K, V = win["q"][image], win["k"][image], win["v"][image]  # H, A, d
    if version == "v2":
        Q, K = F.normalize(Q, dim=-1), F.normalize(K, dim=-1)
    scores = win["scores"][image, :, p]  # H, A
    attention = scores.softmax(-1)
    heads = torch.einsum("ha,had->hd", attention, V)  # H, d: every head's output for the cell
    with torch.no_grad():
        y = F.linear(heads.flatten(), blk.attn.proj.weight, blk.attn.proj.bias)
    return dict(
        key_tokens=win["cells"].tolist(),
        q=Q[head, p],
        k=K[head],
        v=V[head],
        scale=float(win["scale"][head]),
        bias=win["bias"][head, p],
        mask=win["mask"][p],
        scores=scores[head],
        attention=attention[head],
        head_output=heads[head],
        attn_output=y,
    )


def write_checkpoint(path, arch: str = "swin_tiny_patch4_window7_224", seed: int = 7) -> None:
    """A classifier checkpoint of random weights, as a user would save one (head included).

    The relative position bias tables are drawn at std 2 (timm's init: 0.02), so that the windows
    of a random model show structure on the page instead of near-uniform attention.
    """
    from safetensors.torch import save_file

    torch.manual_seed(seed)
    model = timm.create_model(arch, pretrained=False)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("relative_position_bias_table"):
                p.normal_(0, 2.0)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
