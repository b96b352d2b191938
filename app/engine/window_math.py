"""The attention of a few Swin windows, recomputed from their tokens with the block's own weights.

The windowed capture (:mod:`app.engine.windows`) keeps each window's softmax as the block
computed it, and the tokens that entered the attention module. From those tokens and the
module's weights this module recomputes q, k, v and the block's real pre-softmax scores, in the
order of operations of timm's unfused branch (float32):

* v1 (``swin_*``): ``(q * scale) @ k^T + B + M``, ``B`` the learned relative position bias
  (a table indexed by the offset between two places of the window);
* v2 (``swinv2_*``): ``normalize(q) @ normalize(k)^T * exp(min(logit_scale, log 100)) + 16 *
  sigmoid(B) + M``, ``B`` a small MLP (``cpb_mlp``) of log-spaced offsets;

``M`` is the shift mask the block passed (-100 between cells that the cyclic roll brought
together from opposite edges, 0 elsewhere), or nothing in unshifted blocks.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

# timm clamps Swin v2's learned logit scale at log(1 / 0.01) before exp.
LOGIT_SCALE_MAX = math.log(1.0 / 0.01)


@torch.no_grad()
def window_qkv(attn: Any, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v of windows, each ``[w, H, A, d]`` float32, straight from the projection.

    Args:
        attn: a timm Swin v1/v2 ``WindowAttention``.
        x: ``[w, A, C]`` the windows' tokens, as the module got them.
    """
    w_qkv = attn.qkv.weight.detach().float()
    bias: torch.Tensor | None
    if getattr(attn, "q_bias", None) is not None:  # v2: q and v biases, k has none
        k_bias = attn.k_bias if getattr(attn, "k_bias", None) is not None else torch.zeros_like(attn.q_bias)
        bias = torch.cat((attn.q_bias, k_bias, attn.v_bias)).detach().float()
        if getattr(attn, "qkv_bias_separate", False) and attn.qkv.bias is not None:
            bias = bias + attn.qkv.bias.detach().float()
    else:
        bias = attn.qkv.bias.detach().float() if attn.qkv.bias is not None else None
    W, A, _ = x.shape  # windows, places, channels
    qkv = F.linear(x.float(), w_qkv, bias).reshape(W, A, 3, attn.num_heads, -1).permute(2, 0, 3, 1, 4)
    q, k, v = qkv.unbind(0)  # each W, H, A, d
    return q, k, v


@torch.no_grad()
def window_bias(attn: Any, version: str) -> torch.Tensor:
    """``[H, A, A]`` float32: the relative position bias added to every window's scores."""
    wh, ww = attn.window_size
    A = wh * ww
    index = attn.relative_position_index.view(-1)
    if version == "v1":
        table = attn.relative_position_bias_table
    else:
        table = attn.cpb_mlp(attn.relative_coords_table).view(-1, attn.num_heads)
    bias = table[index].view(A, A, -1).permute(2, 0, 1).float()  # H, A, A
    return 16 * torch.sigmoid(bias) if version == "v2" else bias


@torch.no_grad()
def window_scale(attn: Any, version: str) -> torch.Tensor:
    """``[H]`` float32: the factor on q.k per head (v2: on the cosine of q and k)."""
    if version == "v1":
        return torch.full((attn.num_heads,), float(attn.scale))
    return torch.clamp(attn.logit_scale.detach().float(), max=LOGIT_SCALE_MAX).exp().reshape(-1)


def window_logits(attn: Any, x: torch.Tensor, mask: torch.Tensor | None, version: str) -> torch.Tensor:
    """``[w, H, A, A]`` float32: the block's pre-softmax scores of some windows.

    Args:
        attn: the block's ``WindowAttention``.
        x: ``[w, A, C]`` the windows' tokens.
        mask: ``[w, A, A]`` the windows' shift masks, or None.
        version: ``v1`` or ``v2``.
    """
    q, k, _ = window_qkv(attn, x)
    with torch.no_grad():
        if version == "v1":
            logits = (q * attn.scale) @ k.transpose(-2, -1)  # w, H, A, A
        else:
            scale = window_scale(attn, version).to(q.device)
            logits = (F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-2, -1)) * scale[:, None, None]
        logits = logits + window_bias(attn, version).to(q.device)
        if mask is not None:
            logits = logits + mask.float()[:, None]
    return logits
