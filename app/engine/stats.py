"""Per-head statistics: what each head does, in numbers.

Every function takes attention rows ``A`` (each row a probability distribution over N tokens)
and says its formula; :func:`compute_stats` puts them together for one captured image, all
layers and heads at once, where the capture is kept (the forward's device), as one
:class:`HeadStats`: :meth:`HeadStats.as_dict` is the JSON of ``GET /api/v1/attention/{id}/stats``
and the survey (:mod:`app.survey`) writes the same tensors into Parquet rows. Windowed models
(:mod:`app.engine.window_stats`) give the same :class:`HeadStats`, with the fields that mean
nothing for windows left None.

Speed (the stats of a 224 px image are meant to cost well under a third of a forward):

* the maps of a chunk of layers (all 12 of a 224 px image; fewer for large pictures, bounded by
  :data:`CHUNK_BYTES`) are computed in one batched product from q and k, as
  :meth:`ImageAttention.rows` does per layer, and never leave the device; only ``[L, H]``
  results do;
* the entropy of a softmax row needs no logarithm per entry: with shifted logits
  ``z' = z - max z``, ``H = -log p_max - sum_j p_j z'_j`` (``log p_j = z'_j - log sum e^z'`` and
  ``p_max = 1 / sum e^z'``); only layers captured as maps (EVA, BEiT, ``query=all``) use
  ``-sum p log p``;
* head similarity uses ``JS(P, Q) = H(M) - (H(P) + H(Q)) / 2``: one entropy per head pair,
  the pairs ``(i, i + d)`` of every layer in one step per offset ``d``;
* the singular values of the head outputs come from the eigenvalues of their float64 Gram
  matrix (``s_i = sqrt(eig(X X^T))``, the smaller side), the layers shared between threads
  (:mod:`app.engine.gram`);
* a batch captured together with its maps kept (the survey) goes through
  :func:`compute_stats_batch`: one layer of every image at a time, on the forward's own
  ``[B, H, N, N]`` tensor.

Measured on 2 CPU cores (README, "Survey", "Speed"): 0.17x a forward without ranks and
similarity, 0.30x without ranks, 0.60x with everything; the ranks' twelve eigenvalue problems
(latency-bound in LAPACK, ~1.5 ms each at 257 x 257) are most of the difference.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch

from .block_capture import ImageAttention
from .device import where_float64
from .gram import gram_eigvalsh
from .layout import TokenLayout

EPS = 1e-12
# Bytes of float32 maps one chunk of layers may hold (maps, their logits and the head-pair
# sums): all 12 layers of a 224 px image with ViT-S (6 heads); 3 layers of a 769-token one.
CHUNK_BYTES = 128 * 2**20
# Largest single tensor: under glibc's mmap threshold as the server sets it (serving/malloc.py),
# so freed buffers are reused instead of faulted in afresh every time.
TENSOR_BYTES = 32 * 2**20
# Grids whose patch distances are cached (1024 patches: 4 MiB; 32x32 patches, 448-518 px).
CACHED_PATCHES = 1024


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


def patch_distances(layout: TokenLayout) -> torch.Tensor:
    """``[P, P]`` Euclidean distances between patch centres, in input pixels.

    Read-only: grids up to :data:`CACHED_PATCHES` patches are cached (``cdist`` costs about a
    millisecond at 224 px, as much as a statistic); larger ones (megabytes each) are not.
    """
    if layout.num_patches <= CACHED_PATCHES:
        return _cached_distances(tuple(layout.grid), tuple(layout.patch_size))
    c = patch_centres(layout)
    return torch.cdist(c, c)


@lru_cache(maxsize=8)
def _cached_distances(grid: tuple[int, int], patch_size: tuple[int, int]) -> torch.Tensor:
    c = patch_centres(TokenLayout([], grid, patch_size))
    return torch.cdist(c, c)


def mean_attention_distance(attn: torch.Tensor, layout: TokenLayout, dist: torch.Tensor | None = None) -> torch.Tensor:
    """Mean attention distance in pixels (Dosovitskiy et al., 2021, fig. 7).

    For each patch query ``q``: ``d_q = sum_k A[q,k] * ||c_q - c_k|| / sum_k A[q,k]`` over patch
    keys ``k`` (prefix tokens have no position, so the row is renormalised over patches); the
    answer is the mean of ``d_q`` over patch queries.

    Args:
        attn: ``[..., N, N]`` full attention maps.
        layout: token layout (prefix count, grid, patch size).
        dist: :func:`patch_distances` of ``layout`` on ``attn``'s device, if already at hand.

    Returns:
        ``[...]`` distances in input pixels; a diagonal map gives 0.
    """
    npf = layout.num_prefix
    if dist is None:
        dist = patch_distances(layout).to(attn.device)
    a = attn[..., npf:, npf:]  # patch queries x patch keys
    mass = a.sum(-1).clamp_min(EPS)
    return ((a * dist).sum(-1) / mass).mean(-1)


def js_similarity(attn: torch.Tensor, entropies: torch.Tensor | None = None) -> torch.Tensor:
    """Head similarity ``1 - JS(A_i, A_j) / log 2``, averaged over query rows.

    ``JS(P, Q) = KL(P || M)/2 + KL(Q || M)/2 = H(M) - (H(P) + H(Q))/2`` with ``M = (P + Q)/2``
    per row. 1 for identical heads, 0 for heads that attend to disjoint tokens. Any leading
    axes (e.g. layers) are kept.

    Args:
        attn: ``[..., H, R, N]`` rows of each head.
        entropies: ``[..., H, R]`` entropies of those rows in nats, if already computed.

    Returns:
        ``[..., H, H]`` symmetric, ones on the diagonal.
    """
    H = attn.shape[-3]
    if entropies is None:
        entropies = _plogp_sum(attn).neg_()
    out = torch.ones(*attn.shape[:-3], H, H, device=attn.device, dtype=attn.dtype)
    # Pairs (i, i + d) for one offset d at a time: views of the maps added, no gathered copies;
    # every pair of every layer in H - 1 vectorised steps.
    for d in range(1, H):
        s = attn[..., : H - d, :, :] + attn[..., d:, :, :]  # ..., H-d, R, N:  s = P + Q, rows sum to 2
        # H(M) = -sum m log m with m = s/2: = -(sum s log s)/2 + log 2.
        hm = _plogp_sum(s).mul_(-0.5).add_(math.log(2))  # ..., H-d, R
        js = hm - 0.5 * (entropies[..., : H - d, :] + entropies[..., d:, :])
        sim = 1 - (js.clamp_min(0) / math.log(2)).mean(-1)  # ..., H-d
        i = torch.arange(H - d, device=attn.device)
        out[..., i, i + d] = sim
        out[..., i + d, i] = sim
    return out


def _plogp_sum(p: torch.Tensor) -> torch.Tensor:
    """``sum_j p_j log p_j`` over the last axis, with ``0 log 0 = 0``.

    ``log 0 = -inf`` and ``0 * -inf = NaN``, which ``nansum`` leaves out: three passes over the
    maps (no clamp; ``torch.special.entr``/``xlogy`` have no vectorised CPU kernel and are
    2-7x slower here).
    """
    return torch.log(p).mul_(p).nansum(-1)


def cosine_similarity(rows: torch.Tensor) -> torch.Tensor:
    """``[..., H, H]`` cosine similarity of each head's row (e.g. the CLS rows ``[..., H, N]``)."""
    v = rows / rows.norm(dim=-1, keepdim=True).clamp_min(EPS)
    return v @ v.mT


def singular_values(x: torch.Tensor) -> torch.Tensor:
    """Singular values of ``[..., M, D]`` matrices in float64, ascending, from the Gram matrix.

    ``s_i = sqrt(eig(X X^T))`` (or ``X^T X``, whichever is smaller): one symmetric eigenvalue
    problem of the smaller side, several times cheaper than an SVD of ``X``. Float32 entries
    multiply exactly in float64, so the Gram matrix is exact to float64 rounding; its
    eigenvalues are accurate to ``max(M, D) * eps64 * s_max^2``, so every singular value above
    ``1.5e-8 * s_max`` (far below the numerical-rank threshold of :func:`ranks`, ``max(M, D) *
    eps32 * s_max``) comes out as an SVD would give it. Eigenvalues under that noise floor are
    set to 0: they are zero singular values that rounding made tiny positive or negative.
    """
    m, d = x.shape[-2:]
    lam = gram_eigvalsh(x)  # ..., min(M, D), ascending, float64
    floor = max(m, d) * torch.finfo(torch.float64).eps * lam[..., -1:].clamp_min(0)
    return torch.where(lam > floor, lam, 0).sqrt()


def ranks(head_out: torch.Tensor) -> tuple[Any, Any]:
    """Numerical and effective rank of the concatenated head outputs ``[..., N, H*d_v]``.

    Numerical rank: singular values above ``max(N, D) * eps32 * s_max`` (as
    ``torch.linalg.matrix_rank`` counts for float32 data). Effective rank (Roy & Vetterli,
    2007): ``exp(-sum_i p_i log p_i)`` with ``p_i = s_i / sum s``. Duplicated heads lower both.

    Returns:
        ``(numerical, effective)``: Python ``int`` and ``float`` for one matrix, ``[...]`` int64
        and float64 tensors for a batch.
    """
    s = singular_values(head_out)
    tol = max(head_out.shape[-2:]) * torch.finfo(torch.float32).eps * s[..., -1:]
    p = s / s.sum(-1, keepdim=True).clamp_min(EPS)
    eff = torch.exp(-(p * p.clamp_min(EPS).log()).sum(-1))
    num = (s > tol).sum(-1)
    if head_out.dim() == 2:
        return int(num), float(eff)
    return num, eff


def mass_threshold_count(rows: torch.Tensor, fraction: float) -> torch.Tensor:
    """Size of the smallest set of tokens holding ``fraction`` of each row's mass (DINO masks).

    Args:
        rows: ``[..., P]`` non-negative weights (e.g. a CLS row over patches, renormalised).
        fraction: in (0, 1].
    """
    s, _ = rows.sort(-1, descending=True)
    c = s.cumsum(-1) / s.sum(-1, keepdim=True).clamp_min(EPS)
    # A row with no mass at all (a rollout before its start layer, over the patches) needs all.
    return ((c < fraction - 1e-7).sum(-1) + 1).clamp_max(rows.shape[-1])


def mass_threshold_mask(row: torch.Tensor, fraction: float) -> torch.Tensor:
    """Boolean mask of the smallest set of entries of ``row`` holding ``fraction`` of its mass.

    Of equal weights the lower index goes in first (a stable sort), as in the page's massMask.
    """
    k = int(mass_threshold_count(row, fraction))
    mask = torch.zeros_like(row, dtype=torch.bool)
    mask[row.argsort(descending=True, stable=True)[:k]] = True
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


DEFAULT_MASS = 0.6  # the CLS mass fraction of mass_patches unless asked otherwise (GET …/stats, the survey)


@dataclass
class Windows:
    """What the statistics of a windowed model (Swin) say beyond a global model's."""

    heads_per_layer: list[int]  # each layer has its stage's heads
    rank_max_per_layer: list[int]  # min(cells, width) of each layer's stage
    artifact_stage: int  # the last stage: its grid is where artifact tokens are found
    unavailable: dict[str, str]  # the statistics that mean nothing for windows (None), with the reason
    entropy_over: str = "window"  # each row's entropy is over the W*W keys of its window


@dataclass
class HeadStats:
    """Statistics of one image, on the host; ``[L, H]`` float32 unless said.

    ``entropy_cls``, ``cls_cosine`` and ``mass_patches`` are None for models without a CLS
    token (and ``mass_patches`` when no mass fraction was asked for); ``similarity`` and the
    ranks are None when not asked for. A windowed model's layers have their stages' heads
    (``windows.heads_per_layer``): its ``[L, H]`` tensors are ``[L, max H]`` with NaN past a
    layer's heads, and what has no meaning for windows is None (``windows.unavailable`` says why).
    """

    entropy: torch.Tensor  # mean over query rows of the normalised row entropy
    distance_px: torch.Tensor  # mean attention distance over patch queries, input pixels
    artifacts: list[int]  # high-norm tokens of the last layer's output
    artifact_threshold: float
    mass: float | None
    last_norms: torch.Tensor  # [N_last] token norms of the last layer's output
    rank_max: int  # the largest rank a layer's head outputs can have: min(tokens, width)
    prefix_mass: torch.Tensor | None = None  # mean over query rows of the mass on prefix tokens
    artifact_mass: torch.Tensor | None = None  # mean over query rows of the mass on artifact tokens
    entropy_cls: torch.Tensor | None = None  # normalised entropy of the CLS row
    cls_cosine: torch.Tensor | None = None  # [L, H, H] cosine similarity of the heads' CLS rows
    mass_patches: torch.Tensor | None = None  # [L, H] int64: patches holding `mass` of the CLS row
    similarity: torch.Tensor | None = None  # [L, H, H] 1 - JS / log 2, mean over query rows
    rank_numerical: torch.Tensor | None = None  # [L] int64
    rank_effective: torch.Tensor | None = None  # [L] float64
    windows: Windows | None = None  # windowed models only

    @property
    def heads_per_layer(self) -> list[int]:
        if self.windows is not None:
            return self.windows.heads_per_layer
        L, H = self.entropy.shape
        return [H] * L

    def as_dict(self, input_size: Sequence[int]) -> dict[str, Any]:
        """The JSON of ``GET /api/v1/attention/{id}/stats`` (``[L][H]`` lists, ragged for windows)."""
        heads = self.heads_per_layer
        L = len(heads)

        def per_head(t: torch.Tensor | None) -> list | None:
            return None if t is None else [t[layer, :h].tolist() for layer, h in enumerate(heads)]

        def pairs(t: torch.Tensor | None) -> list | None:
            return None if t is None else [t[layer, :h, :h].tolist() for layer, h in enumerate(heads)]

        def listed(t: torch.Tensor | None) -> list | None:
            return None if t is None else t.tolist()

        win = self.windows
        out: dict[str, Any] = {"layers": L, "heads": int(self.entropy.shape[1])}
        if win is not None:
            out["heads_per_layer"] = list(heads)
        out |= {
            "entropy": per_head(self.entropy),
            "entropy_cls": per_head(self.entropy_cls),
            "distance_px": per_head(self.distance_px),
            "prefix_mass": per_head(self.prefix_mass),
            "artifact_mass": per_head(self.artifact_mass),
            "similarity": pairs(self.similarity),
            "cls_cosine": pairs(self.cls_cosine),
            "mass_patches": per_head(self.mass_patches),
            "mass_fraction": self.mass,
            "rank": {
                "numerical": listed(self.rank_numerical),
                "effective": listed(self.rank_effective),
                "max": self.rank_max,
                **({"max_per_layer": list(win.rank_max_per_layer)} if win is not None else {}),
            },
            "artifacts": {
                "tokens": self.artifacts,
                "threshold": self.artifact_threshold,
                "layer": L - 1,
                **({"stage": win.artifact_stage} if win is not None else {}),
                "norms": self.last_norms[self.artifacts].tolist(),
            },
            "token_norms_last": self.last_norms.tolist(),
            "input_size": list(input_size),
        }
        if win is not None:
            out |= {"entropy_over": win.entropy_over, "unavailable": dict(win.unavailable)}
        return out


def _chunk_maps(att: ImageAttention, lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Maps ``[C, H, N, N]`` of layers ``lo..hi-1`` and, for ``qk`` layers, their logits shifted
    by the row maximum (None where the capture kept maps)."""
    if any(att.probs[i] is not None for i in range(lo, hi)):
        return torch.stack([att.rows(i) for i in range(lo, hi)]), None
    # Same operations as ImageAttention.rows(), batched over the chunk's layers: scale q, q k^T,
    # softmax. Shifting by the row maximum first leaves the softmax bit for bit unchanged (it
    # subtracts the maximum itself).
    scale = torch.tensor(att.scale[lo:hi], dtype=torch.float32, device=att.device).view(-1, 1, 1, 1)
    q = torch.stack(att.q[lo:hi]).float() * scale  # type: ignore[arg-type]  # C, H, N, d
    # k stacked transposed: a contiguous right operand is ~3x faster in MKL's batched GEMM here.
    kt = torch.stack([k.mT for k in att.k[lo:hi]]).float()  # type: ignore[union-attr]  # C, H, d, N
    z = q @ kt  # C, H, N, N
    z.sub_(z.amax(-1, keepdim=True))
    return torch.softmax(z, -1), z


def _row_entropy(p: torch.Tensor, z: torch.Tensor | None) -> torch.Tensor:
    """Entropies in nats of the rows of ``p`` ``[..., N]`` (see the module docstring)."""
    if z is None:
        return _plogp_sum(p).neg_()
    # -log p_max - sum_j p_j z'_j: both terms >= 0, no cancellation.
    return (p * z).sum(-1).neg_().sub_(p.amax(-1).log())


def _maps_stats(
    p: torch.Tensor,
    z: torch.Tensor | None,
    layout: TokenLayout,
    dist: torch.Tensor,
    artifacts: torch.Tensor | list[torch.Tensor],
    mass: float | None,
    similarity: bool,
) -> dict[str, torch.Tensor]:
    """The per-head statistics of a stack of maps, as ``[C, H]`` (``[C, H, H]``) tensors.

    Args:
        p: ``[C, H, N, N]`` maps: C layers of one image, or one layer of C images.
        z: their logits shifted by the row maximum, or None (then the entropy takes logs).
        layout: the token layout of every map.
        dist: :func:`patch_distances` of ``layout`` on ``p``'s device.
        artifacts: artifact token indices, one tensor for all C, or a list of C (one per image).
        mass: the fraction of the CLS row's mass for ``mass_patches`` (None: no ``mass_patches``).
        similarity: also compute the head-pair similarity.
    """
    N = p.shape[-1]
    npf, cls = layout.num_prefix, layout.cls_index
    log_n = math.log(N) if N > 1 else 1.0
    ent = _row_entropy(p, z)  # C, H, N  (nats)
    out = {
        "entropy": ent.mean(-1) / log_n if N > 1 else torch.zeros_like(ent[..., 0]),
        "distance_px": mean_attention_distance(p, layout, dist),
        "prefix_mass": p[..., :npf].sum(-1).mean(-1) if npf else p.new_zeros(p.shape[:2]),
    }

    def art_mass(q: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:  # [..., H, N, N] -> [..., H]
        return q.index_select(-1, idx).sum(-1).mean(-1) if len(idx) else q.new_zeros(q.shape[:-2])

    if isinstance(artifacts, list):  # one image per map: each its own artifact tokens
        out["artifact_mass"] = torch.stack([art_mass(p[i], a) for i, a in enumerate(artifacts)])
    else:
        out["artifact_mass"] = art_mass(p, artifacts)
    if cls is not None:
        row = p[:, :, cls]  # C, H, N
        out["entropy_cls"] = ent[:, :, cls] / log_n if N > 1 else torch.zeros_like(ent[:, :, cls])
        out["cls_cosine"] = cosine_similarity(row)
        if mass is not None:
            out["mass_patches"] = mass_threshold_count(row[..., npf:], mass)
    if similarity:
        out["similarity"] = js_similarity(p, ent)
    return out


def _head_stats(
    parts: dict[str, torch.Tensor],
    att: ImageAttention,
    artifacts: tuple[list[int], float],
    mass: float | None,
    with_ranks: bool,
) -> HeadStats:
    """One image's :class:`HeadStats` from its ``[L, H...]`` statistics (on the host)."""
    rank_num = rank_eff = None
    if with_ranks:
        x = where_float64(torch.stack(att.head_out))  # L, N, H*d_v
        rank_num, rank_eff = (t.cpu() for t in ranks(x.float()))
    return HeadStats(
        entropy=parts["entropy"],
        distance_px=parts["distance_px"],
        prefix_mass=parts["prefix_mass"],
        artifact_mass=parts["artifact_mass"],
        entropy_cls=parts.get("entropy_cls"),
        cls_cosine=parts.get("cls_cosine"),
        mass_patches=parts.get("mass_patches"),
        similarity=parts.get("similarity"),
        rank_numerical=rank_num,
        rank_effective=rank_eff,
        artifacts=artifacts[0],
        artifact_threshold=artifacts[1],
        mass=mass,
        last_norms=att.last_norms,
        rank_max=min(att.num_tokens, att.head_out[0].shape[-1]),
    )


def compute_stats(
    att: ImageAttention,
    layout: TokenLayout,
    mass: float | None = DEFAULT_MASS,
    *,
    similarity: bool = True,
    with_ranks: bool = True,
    chunk_bytes: int = CHUNK_BYTES,
    check: Callable[[], None] | None = None,
) -> HeadStats:
    """All per-head statistics of one image, every layer and head at once.

    Args:
        att: the capture (qk or maps, on any device).
        layout: its token layout.
        mass: the fraction of the CLS row's mass for ``mass_patches`` (None: leave them out).
        similarity: compute the head-pair similarity (the costliest part after the ranks).
        with_ranks: compute the ranks of the head outputs.
        chunk_bytes: bound on the float32 maps held at once (layers are taken in chunks).
        check: called before each chunk of layers; it raises to stop (the client went away).
    """
    L, H, N = att.num_layers, att.num_heads, att.num_tokens
    dev = att.device
    artifacts = artifact_tokens(att.last_norms, layout.num_prefix)
    art_idx = torch.tensor(artifacts[0], dtype=torch.long, device=dev)
    dist = patch_distances(layout).to(dev)
    per_layer = (2 * H + (H - 1 if similarity else 0)) * N * N * 4  # maps + logits + one offset's pair sums
    step = max(1, min(L, chunk_bytes // per_layer, TENSOR_BYTES // (H * N * N * 4)))

    parts: dict[str, list[torch.Tensor]] = {}
    for lo in range(0, L, step):  # one chunk (all layers) up to CHUNK_BYTES of maps
        if check is not None:
            check()
        hi = min(L, lo + step)
        p, z = _chunk_maps(att, lo, hi)  # C, H, N, N
        for name, t in _maps_stats(p, z, layout, dist, art_idx, mass, similarity).items():
            parts.setdefault(name, []).append(t)
        del p, z
    out = {k: torch.cat(v).cpu() for k, v in parts.items()}
    return _head_stats(out, att, artifacts, mass, with_ranks)


def compute_stats_batch(
    atts: Sequence[ImageAttention],
    layout: TokenLayout,
    mass: float | None = DEFAULT_MASS,
    *,
    similarity: bool = True,
    with_ranks: bool = True,
) -> list[HeadStats]:
    """:func:`compute_stats` of every image of a batch captured together (the survey's batches).

    Where the forward kept the maps (``materialise=True``), each layer's ``[B, H, N, N]`` maps
    are taken as the forward left them, all images at once: no copy of the maps and one call
    per operation and layer for the batch instead of one per image (at 224 px, batch 8: about
    a fifth less time than image by image). Otherwise (q and k only, or maps that are not
    views of one batch tensor) every image goes through :func:`compute_stats`. The values are
    the same either way.

    Args:
        atts: the batch's captures, in batch order, all of ``layout``.
    """
    maps = [[a.probs[i] for a in atts] for i in range(atts[0].num_layers)] if atts else []
    batched = [_batch_of(ps) for ps in maps]
    if len(atts) < 2 or any(b is None for b in batched):
        return [compute_stats(a, layout, mass, similarity=similarity, with_ranks=with_ranks) for a in atts]
    dev = atts[0].device
    artifacts = [artifact_tokens(a.last_norms, layout.num_prefix) for a in atts]
    art_idx = [torch.tensor(a[0], dtype=torch.long, device=dev) for a in artifacts]
    dist = patch_distances(layout).to(dev)
    parts: dict[str, list[torch.Tensor]] = {}
    for p in batched:  # one layer of every image: B, H, N, N
        assert p is not None
        for name, t in _maps_stats(p.float(), None, layout, dist, art_idx, mass, similarity).items():
            parts.setdefault(name, []).append(t)
    stacked = {k: torch.stack(v, 1).cpu() for k, v in parts.items()}  # B, L, ...
    return [
        _head_stats({k: v[b] for k, v in stacked.items()}, att, artifacts[b], mass, with_ranks)
        for b, att in enumerate(atts)
    ]


def _batch_of(maps: list[torch.Tensor | None]) -> torch.Tensor | None:
    """``[B, H, N, N]`` over the memory of ``maps`` if they lie one after the other in one buffer
    (the forward's batch tensor, which a capture hands out image by image), else None."""
    first = maps[0]
    if first is None or not first.is_contiguous():
        return None
    size, ptr, off = first.numel(), first.untyped_storage().data_ptr(), first.storage_offset()
    for b, m in enumerate(maps):
        if (
            m is None
            or m.shape != first.shape
            or m.dtype != first.dtype
            or not m.is_contiguous()
            or m.untyped_storage().data_ptr() != ptr
            or m.storage_offset() != off + b * size
        ):
            return None
    return first.as_strided((len(maps), *first.shape), (size, *first.stride()), off)
