"""One head's whole computation for one query cell of a windowed model (Swin v1/v2).

A Swin query attends to the cells of its own window only, so the keys of the explanation are the
``W x W`` places of that window (of the rolled grid in shifted blocks), in the order the block
lays them out (row-major in the window)::

    q = Q_h[t], K_h, V_h                       # the window's tokens times the block's qkv weights
    scores_j = scale * q . k_j + b_j + m_j     # v2: q, k L2-normalised, scale = exp(clamped logit scale)
    a = softmax(scores)                        # over the window: the served row's nonzero entries
    o_h = sum_j a_j v_j
    y = W_O concat_h(o_h) + b

``b`` is the relative position bias (v2: ``16 * sigmoid`` of the continuous position bias MLP),
``m`` the shift mask (-100 between regions the cyclic roll brought together; absent in unshifted
blocks). A window that hangs over the grid's edge holds padding places: zero tokens with no cell
of the grid (``key_tokens`` -1), whose keys and values are the projections' biases. They are
keys like any other, so they stay in ``k``, ``v``, ``scores`` and ``attention``; the served row
leaves them out, and sums to less than 1 by their weight.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn as nn
import torch.nn.functional as F

from .capture_base import CaptureError
from .explain import HeadComputation, host, project_heads
from .layout import Stage
from .selection import SelectionError
from .window_math import window_bias, window_qkv, window_scale
from .windows import WindowedAttention


@dataclass
class WindowHeadComputation(HeadComputation):
    """A windowed head's computation: :class:`HeadComputation` over the query's window.

    ``k``, ``v``: ``[A, d]``; ``dot``, ``scores``, ``attention``, ``bias``, ``mask``: ``[A]`` for
    the ``A = W*W`` places of the window; ``key_tokens[j]``: the stage-grid cell (row-major) at
    place ``j``, -1 for padding; ``window``: the window's index (row-major over the rolled,
    padded grid); ``place``: the query's place in it; ``stage``: the layer's stage.
    """

    mask: torch.Tensor | None
    key_tokens: list[int]
    window: int
    place: int
    cosine: bool
    stage: Stage

    OPTIONAL: ClassVar[tuple[str, ...]] = ("bias", "mask")

    def tensors(self) -> dict[str, torch.Tensor]:
        out = super().tensors()
        if self.mask is not None:
            out["mask"] = self.mask
        return out

    def meta(self) -> dict[str, Any]:
        """The keys are the query's window: its W*W places, row-major in the window of the rolled,
        padded grid; each place's cell of the stage grid (row-major), or -1 for padding."""
        stage, gw = self.stage, self.stage.grid[1]
        return {
            **super().meta(),
            "stage": stage.index,
            "key_tokens": self.key_tokens,
            "key_cells": [[t // gw, t % gw] if t >= 0 else None for t in self.key_tokens],
            "window": {
                "index": self.window,
                "size": list(stage.window),
                "shift": list(stage.shift_of(self.layer)),
                "query_place": self.place,
                "padding": sum(t < 0 for t in self.key_tokens),
            },
        }

    def steps(self) -> dict[str, bool]:
        """Swin: a relative bias in both versions (v2's from an MLP), cosine attention in v2, and
        the shift mask in shifted blocks."""
        return {"relative_bias": True, "windowed": True, "cosine": self.cosine, "shift_mask": self.mask is not None}


def explain_window_head(
    att: WindowedAttention, attn: nn.Module, layer: int, head: int, query: int
) -> WindowHeadComputation:
    """One head's computation for one query cell of a windowed layer.

    Args:
        att: the image's windowed capture (with the windows' tokens).
        attn: the block's ``WindowAttention`` (its weights).
        layer: block index, counted across stages, non-negative.
        head: head index in the layer's stage, non-negative.
        query: query cell, row-major over the stage's grid, non-negative.
    """
    if not 0 <= layer < att.num_layers:
        raise SelectionError(f"layer {layer}: out of range")
    H, N = att.heads_at(layer), att.tokens_at(layer)
    if not (0 <= head < H and 0 <= query < N):
        raise SelectionError(f"layer {layer}, head {head}, cell {query}: out of range")
    if not att.inputs:
        raise CaptureError("this windowed capture kept no window tokens")
    version = att.version
    ix = att.index(layer)
    w, place = int(ix.window[query]), int(ix.pos[query])
    x = att.inputs[layer][w : w + 1]  # 1, A, C: the window's tokens
    q_all, k_all, v_all = window_qkv(attn, x)  # 1, H, A, d
    q, k, v = q_all[0, head, place], k_all[0, head], v_all[0, head]  # d; A, d; A, d
    if version == "v2":  # cosine attention: the dot product is of unit vectors
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    scale = float(window_scale(attn, version)[head])
    # The served rows at T != 1 use WindowedAttention.window_logits, the same operations.
    scores = att.window_logits(layer, torch.tensor([w], device=att.device), [head])[0, 0, place]  # A
    attention = torch.softmax(scores, dim=-1)  # A
    head_output = attention @ v  # d
    dot = k @ q  # A
    bias = window_bias(attn, version)[head, place]  # A
    mask = att.masks[layer]
    mask_row = mask[w, place].float() if mask is not None else None  # A

    proj_in = att.head_out[layer][w, place].float()  # H*d: what the model fed W_O for this cell
    contributions, b, attn_output = project_heads(attn, proj_in, H)
    return WindowHeadComputation(
        layer=layer,
        head=head,
        query=query,
        scale=scale,
        q=host(q),
        k=host(k),
        v=host(v),
        dot=host(dot),
        bias=host(bias),
        scores=host(scores),
        attention=host(attention),
        head_output=host(head_output),
        proj_input=host(proj_in),
        head_contributions=host(contributions),
        proj_bias=host(b),
        attn_output=host(attn_output),
        mask=host(mask_row) if mask_row is not None else None,
        key_tokens=[int(c) for c in ix.cells[w].tolist()],
        window=w,
        place=place,
        cosine=version == "v2",
        stage=att.stage_of(layer),
    )
