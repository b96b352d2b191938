"""Per-head statistics: what each head does, in numbers.

Every function takes attention rows ``A`` (each row a probability distribution over N tokens)
and says its formula; :func:`head_stats` puts them together for one captured image.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .capture import ImageAttention
from .layout import TokenLayout

EPS = 1e-12


def normalized_entropy(rows: torch.Tensor) -> torch.Tensor:
    """``H(a) / log N`` with ``H(a) = -sum_j a_j log a_j``, over the last axis.

    1 for a uniform row, 0 for a one-hot row.
    """
    n = rows.shape[-1]
    h = -(rows * rows.clamp_min(EPS).log()).sum(-1)
    return h / math.log(n) if n > 1 else torch.zeros_like(h)


def patch_centres(layout: TokenLayout) -> torch.Tensor:
    """``[P, 2]`` (y, x) centres of the patches in input pixels, row-major."""
    gh, gw = layout.grid
    ph, pw = layout.patch_size
    ys = (torch.arange(gh, dtype=torch.float32) + 0.5) * ph
    xs = (torch.arange(gw, dtype=torch.float32) + 0.5) * pw
    return torch.stack(torch.meshgrid(ys, xs, indexing="ij"), -1).reshape(-1, 2)


def mean_attention_distance(attn: torch.Tensor, layout: TokenLayout) -> torch.Tensor:
    """Mean attention distance in pixels (Dosovitskiy et al., 2021, fig. 7).

    For each patch query ``q``: ``d_q = sum_k A[q,k] * ||c_q - c_k|| / sum_k A[q,k]`` over patch
    keys ``k`` (prefix tokens have no position, so the row is renormalised over patches); the
    answer is the mean of ``d_q`` over patch queries.

    Args:
        attn: ``[..., N, N]`` full attention maps.
        layout: token layout (prefix count, grid, patch size).

    Returns:
        ``[...]`` distances in input pixels; a diagonal map gives 0.
    """
    npf = layout.num_prefix
    c = patch_centres(layout)
    dist = torch.cdist(c, c)  # P, P
    a = attn[..., npf:, npf:]  # patch queries x patch keys
    mass = a.sum(-1).clamp_min(EPS)
    return ((a * dist).sum(-1) / mass).mean(-1)


def js_similarity(attn: torch.Tensor) -> torch.Tensor:
    """Head similarity ``1 - JS(A_i, A_j) / log 2``, averaged over query rows.

    ``JS(P, Q) = KL(P || M)/2 + KL(Q || M)/2`` with ``M = (P + Q)/2`` per row. 1 for identical
    heads, 0 for heads that attend to disjoint tokens.

    Args:
        attn: ``[H, R, N]`` rows of each head.

    Returns:
        ``[H, H]`` symmetric, ones on the diagonal.
    """
    H = attn.shape[0]
    out = torch.ones(H, H)
    logp = attn.clamp_min(EPS).log()
    for i in range(H):
        for j in range(i + 1, H):
            m = 0.5 * (attn[i] + attn[j])
            logm = m.clamp_min(EPS).log()
            js = 0.5 * (attn[i] * (logp[i] - logm)).sum(-1) + 0.5 * (attn[j] * (logp[j] - logm)).sum(-1)
            out[i, j] = out[j, i] = 1 - (js.clamp_min(0) / math.log(2)).mean()
    return out


def cosine_similarity(rows: torch.Tensor) -> torch.Tensor:
    """``[H, H]`` cosine similarity of each head's row (e.g. the CLS row ``[H, N]``)."""
    v = rows / rows.norm(dim=-1, keepdim=True).clamp_min(EPS)
    return v @ v.T


def ranks(head_out: torch.Tensor) -> tuple[int, float]:
    """Numerical and effective rank of the concatenated head outputs ``[N, H*d_v]``.

    Numerical rank: singular values above ``max(N, D) * eps * s_max`` (``torch.linalg.matrix_rank``).
    Effective rank (Roy & Vetterli, 2007): ``exp(-sum_i p_i log p_i)`` with ``p_i = s_i / sum s``.
    Duplicated heads lower both.
    """
    s = torch.linalg.svdvals(head_out.double())
    tol = max(head_out.shape) * torch.finfo(torch.float32).eps * s.max()
    p = s / s.sum().clamp_min(EPS)
    eff = torch.exp(-(p * p.clamp_min(EPS).log()).sum())
    return int((s > tol).sum()), float(eff)


def mass_threshold_count(rows: torch.Tensor, fraction: float) -> torch.Tensor:
    """Size of the smallest set of tokens holding ``fraction`` of each row's mass (DINO masks).

    Args:
        rows: ``[..., P]`` non-negative weights (e.g. a CLS row over patches, renormalised).
        fraction: in (0, 1].
    """
    s, _ = rows.sort(-1, descending=True)
    c = s.cumsum(-1) / s.sum(-1, keepdim=True).clamp_min(EPS)
    return (c < fraction - 1e-7).sum(-1) + 1


def mass_threshold_mask(row: torch.Tensor, fraction: float) -> torch.Tensor:
    """Boolean mask of the smallest set of entries of ``row`` holding ``fraction`` of its mass."""
    k = int(mass_threshold_count(row, fraction))
    mask = torch.zeros_like(row, dtype=torch.bool)
    mask[row.argsort(descending=True)[:k]] = True
    return mask


def artifact_tokens(norms: torch.Tensor, num_prefix: int, z: float = 6.0) -> tuple[list[int], float]:
    """High-norm patch tokens (Darcet et al., 2024): robust z-score of the output norm above ``z``.

    ``score = (norm - median) / (1.4826 * MAD)`` over patch tokens of one layer's output.

    Returns:
        Token indices (prefix included in the numbering) and the norm threshold.
    """
    patch = norms[num_prefix:]
    med = patch.median()
    mad = (patch - med).abs().median().clamp_min(1e-6)
    thr = float(med + z * 1.4826 * mad)
    idx = (patch > thr).nonzero().flatten() + num_prefix
    return idx.tolist(), thr


def head_stats(att: ImageAttention, layout: TokenLayout, input_size, mass: float = 0.6) -> dict:
    """All per-head statistics of one image, as JSON-ready lists (``[L][H]`` unless said)."""
    L, H, N = att.num_layers, att.num_heads, att.num_tokens
    npf = layout.num_prefix
    cls = layout.cls_index
    last_norms = att.last_norms
    artifacts, thr = artifact_tokens(last_norms, npf)
    out: dict[str, Any] = {
        k: []
        for k in (
            "entropy",
            "entropy_cls",
            "distance_px",
            "prefix_mass",
            "artifact_mass",
            "similarity",
            "cls_cosine",
            "mass_patches",
        )
    }
    rank_num, rank_eff = [], []
    for layer in range(L):
        A = att.rows(layer).cpu()  # H, N, N
        out["entropy"].append(normalized_entropy(A).mean(-1).tolist())
        out["distance_px"].append(mean_attention_distance(A, layout).tolist())
        out["prefix_mass"].append(A[:, :, :npf].sum(-1).mean(-1).tolist() if npf else [0.0] * H)
        out["artifact_mass"].append(A[:, :, artifacts].sum(-1).mean(-1).tolist() if artifacts else [0.0] * H)
        out["similarity"].append(js_similarity(A).tolist())
        if cls is not None:
            row = A[:, cls]  # H, N
            out["entropy_cls"].append(normalized_entropy(row).tolist())
            out["cls_cosine"].append(cosine_similarity(row).tolist())
            out["mass_patches"].append(mass_threshold_count(row[:, npf:], mass).tolist())
        n, e = ranks(att.head_out[layer].cpu().float())
        rank_num.append(n)
        rank_eff.append(e)
    if cls is None:
        for k in ("entropy_cls", "cls_cosine", "mass_patches"):
            out[k] = None
    D = att.head_out[0].shape[-1]
    return {
        "layers": L,
        "heads": H,
        **out,
        "mass_fraction": mass,
        "rank": {"numerical": rank_num, "effective": rank_eff, "max": min(N, D)},
        "artifacts": {"tokens": artifacts, "threshold": thr, "layer": L - 1, "norms": last_norms[artifacts].tolist()},
        "token_norms_last": last_norms.tolist(),
        "input_size": list(input_size),
    }
