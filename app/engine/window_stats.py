"""Per-head statistics of windowed attention (Swin), computed on the windows themselves.

What carries over from :mod:`app.engine.stats` and how:

* entropy: of each query's softmax over the keys of its window (the ``W*W`` keys the softmax ran
  over, padding included), divided by ``log(W*W)``; mean over the query cells of the grid;
* mean attention distance: in input pixels between cell centres of the stage's grid, named in the
  image's own grid (in shifted blocks the keys of a wrapped window sit across the image, but the
  mask gives them ``exp(-100)``); padding keys have no place in the image and are left out, the
  row renormalised over the others, as prefix tokens are for a ViT;
* head similarity ``1 - JS / log 2`` of the window rows, mean over query cells;
* rank of the concatenated head outputs per cell.

What does not carry over is ``None``, with the reason in ``unavailable``: there are no prefix
tokens and no CLS token; the high-norm "artifact" tokens are found on the last stage's grid, so
mass on them means nothing for the other stages' grids; rollout multiplies maps of one grid.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from .stats import DEFAULT_MASS, HeadStats, Windows, artifact_tokens, js_similarity, normalized_entropy
from .stats import ranks as ranks_of
from .windows import WindowedAttention

UNAVAILABLE = {
    "prefix_mass": "Swin has no prefix tokens: every token is a cell of its stage's grid.",
    "entropy_cls": "Swin has no CLS token.",
    "cls_cosine": "Swin has no CLS token.",
    "mass_patches": "Swin has no CLS token (the DINO mass masks threshold the CLS row).",
    "artifact_mass": "High-norm tokens are found on the last stage's grid; the other stages have other grids.",
    "rollout": "Rollout multiplies maps of one grid; Swin's stages have different grids, so it runs "
    "only within one stage (API: layers and rollout_start of one stage).",
}


def cell_centres(grid: tuple[int, int], cell: tuple[int, int], device: torch.device) -> torch.Tensor:
    """``[N, 2]`` (y, x) centres of a grid's cells in input pixels, row-major."""
    ys = (torch.arange(grid[0], dtype=torch.float32, device=device) + 0.5) * cell[0]
    xs = (torch.arange(grid[1], dtype=torch.float32, device=device) + 0.5) * cell[1]
    return torch.stack(torch.meshgrid(ys, xs, indexing="ij"), -1).reshape(-1, 2)


def window_distance(att: WindowedAttention, layer: int, rows: torch.Tensor) -> torch.Tensor:
    """Mean attention distance in input pixels per head, ``[H]``, from window rows ``[H, N, A]``."""
    s = att.stage_of(layer)
    ix = att.index(layer)
    c = cell_centres(s.grid, s.cell_size, rows.device)  # N, 2
    keys = ix.cells[ix.window]  # N, A: the key cells of each query's window, -1 for padding
    real = keys >= 0
    d = (c[:, None, :] - c[keys.clamp_min(0)]).norm(dim=-1) * real  # N, A
    a = rows * real  # H, N, A
    return ((a * d).sum(-1) / a.sum(-1).clamp_min(1e-12)).mean(-1)


def window_stats(
    att: WindowedAttention,
    mass: float | None = DEFAULT_MASS,
    *,
    similarity: bool = True,
    ranks: bool = True,
    check: Callable[[], None] | None = None,
) -> HeadStats:
    """All per-head statistics of one image under a Swin model.

    Each layer has its stage's heads (``windows.heads_per_layer``); the ``[L, H]`` tensors are
    ``[L, max H]``, NaN past a layer's heads. Fields that have no meaning for windows are None
    and named in ``windows.unavailable`` with the reason.

    Args:
        mass: kept as the answer's mass fraction (windows have no CLS row to threshold).
        similarity: compute the head-pair similarity.
        ranks: compute the ranks of the head outputs.
        check: called before each layer; it raises to stop (the client of a request went away).
    """
    L, H = att.num_layers, att.num_heads
    heads = [att.heads_at(layer) for layer in range(L)]
    entropy = torch.full((L, H), math.nan)
    distance = torch.full((L, H), math.nan)
    sim = torch.full((L, H, H), math.nan) if similarity else None
    rank_num = torch.zeros(L, dtype=torch.int64) if ranks else None
    rank_eff = torch.zeros(L, dtype=torch.float64) if ranks else None
    rank_max = []
    for layer, h in enumerate(heads):
        if check is not None:
            check()
        rows = att.window_rows(layer)  # H, N, A
        entropy[layer, :h] = normalized_entropy(rows).mean(-1).cpu()
        distance[layer, :h] = window_distance(att, layer, rows).cpu()
        if sim is not None:
            sim[layer, :h, :h] = js_similarity(rows.cpu())
        rank_max.append(min(att.tokens_at(layer), att.head_out[layer].shape[-1]))
        if rank_num is not None and rank_eff is not None:
            rank_num[layer], rank_eff[layer] = ranks_of(att.head_out_cells(layer).cpu().float())
    artifacts, thr = artifact_tokens(att.last_norms, 0)
    return HeadStats(  # no prefix, no CLS, no artifact mass: None (Windows.unavailable says why)
        entropy=entropy,
        distance_px=distance,
        artifacts=artifacts,
        artifact_threshold=thr,
        mass=mass,
        last_norms=att.last_norms,
        rank_max=max(rank_max),
        similarity=sim,
        rank_numerical=rank_num,
        rank_effective=rank_eff,
        windows=Windows(heads, rank_max, att.stages[-1].index, dict(UNAVAILABLE)),
    )
