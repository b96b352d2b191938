"""From captured attention to the tensor a request asked for: slices, head fusion, rollout."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from .block_capture import CaptureBatch
from .capture_base import CapturedAttention
from .device import to_host, to_host_later
from .selection import Selection, SelectionError


def fuse_heads(attn: torch.Tensor, how: str) -> torch.Tensor:
    """Fuse the head axis (dim 0) of ``[H, ...]`` by ``mean``, ``max`` or ``min``."""
    if how == "mean":
        return attn.mean(dim=0)
    if how == "max":
        return attn.amax(dim=0)
    if how == "min":
        return attn.amin(dim=0)
    raise SelectionError(f"head fusion {how!r}: use mean, max or min")


def rollout(att: CapturedAttention, sel: Selection) -> torch.Tensor:
    """Attention rollout (Abnar & Zuidema, 2020), one map per selected layer.

    For layers ``l = start .. max(layers)``: ``A_l`` = the selected heads, each row
    ``softmax(scores / sel.temperature)``, fused by ``sel.head_fusion``; optionally the smallest
    ``discard_ratio`` fraction of each row set to 0; then ``Â_l = rownorm(0.5 * A_l + 0.5 * I)``
    and ``R_l = Â_l @ R_{l-1}`` with ``R_{start-1} = I``.
    The answer for layer ``l`` is ``R_l`` restricted to the query rows.

    Returns:
        ``[layers, 1, queries, N]`` float32, on the host.
    """
    n = att.num_layers
    if not -n <= sel.rollout_start < n:  # negative counts from the end, once: -1000 does not wrap
        raise SelectionError(f"rollout_start {sel.rollout_start} is out of range for {n} layers (valid: {-n}..{n - 1})")
    start = sel.rollout_start % n
    if min(sel.layers) < start:
        raise SelectionError(f"rollout: layers before rollout_start={start} have no rollout; select layers >= {start}")
    N = att.tokens_at(start)  # windowed models: the selection keeps the rollout in one stage
    eye = torch.eye(N, device=att.device)
    R = eye
    wanted = set(sel.layers)
    out: dict[int, torch.Tensor] = {}
    for layer in range(start, max(sel.layers) + 1):
        A = fuse_heads(att.rows(layer, sel.heads, temperature=sel.temperature), sel.head_fusion)  # N, N
        if sel.discard_ratio > 0:
            k = int(N * sel.discard_ratio)
            if k > 0:
                low = A.topk(k, dim=-1, largest=False).indices
                A = A.scatter(-1, low, 0.0)
        A = 0.5 * A + 0.5 * eye
        A = A / A.sum(dim=-1, keepdim=True)
        R = A @ R
        if layer in wanted:
            out[layer] = R if sel.queries is None else R[sel.queries]
    return to_host(torch.stack([out[layer] for layer in sel.layers]).unsqueeze(1))


def attention_tensor(att: CapturedAttention, sel: Selection) -> torch.Tensor:
    """The requested attention as ``[layers, heads, queries, tokens]`` float32, on the host.

    With ``aggregate`` = ``mean`` or ``max`` the heads axis has length 1 (the fused selected
    heads); with ``rollout`` see :func:`rollout`. The rows are computed where the capture is
    kept and leave that device in one copy, after head fusion.
    """
    if sel.aggregate == "rollout":
        return rollout(att, sel)
    first = sel.layers[0]  # windowed models: every selected layer is of one stage (one grid)
    n = att.tokens_at(first)
    heads = len(sel.heads) if sel.heads is not None else att.heads_at(first)
    queries = len(sel.queries) if sel.queries is not None else n
    out = torch.empty(len(sel.layers), heads, queries, n, dtype=torch.float32, device=att.device)  # L, H, Q, N
    batch = getattr(att, "batch", None)
    if batch is not None:  # a forward's slice: its layers' rows in a few products (CaptureBatch)
        batch.layer_rows(sel.layers, [att.index], sel.heads, sel.queries, out.unsqueeze(1), sel.temperature)  # type: ignore[attr-defined]
    else:
        for i, layer in enumerate(sel.layers):
            att.rows(layer, sel.heads, sel.queries, out=out[i], temperature=sel.temperature)
    if sel.aggregate == "mean":
        out = out.mean(dim=1, keepdim=True)
    elif sel.aggregate == "max":
        out = out.amax(dim=1, keepdim=True)
    elif sel.aggregate != "none":
        raise SelectionError(f"aggregate {sel.aggregate!r}: use none, mean, max or rollout")
    return to_host(out)


def _batch_tensors(
    batch: CaptureBatch,
    atts: Sequence[CapturedAttention],
    sel: Selection,
    host: bool,
    waits: list[Callable[[], None]] | None = None,
) -> list[torch.Tensor]:
    """:func:`attention_tensor` of batch-mates (captures of one forward) under one selection
    (not a rollout), computed together: one product per layer for all of them, one copy to the
    host (``host``; else they stay where they were computed, for a thread that copies them
    later; ``waits``: the copy is started and its wait appended there, see
    :func:`batch_mates_tensors`). On a GPU the rows of one image are a few small kernels per
    layer, so a batch computed image by image is bound by kernel launches, not by the device.
    """
    images = [a.index for a in atts]  # type: ignore[attr-defined]  # ImageAttention
    first = atts[0]
    n = first.tokens_at(sel.layers[0])
    heads = len(sel.heads) if sel.heads is not None else first.heads_at(sel.layers[0])
    queries = len(sel.queries) if sel.queries is not None else n
    out = torch.empty(
        len(sel.layers), len(atts), heads, queries, n, dtype=torch.float32, device=first.device
    )  # L, B, H, Q, N
    batch.layer_rows(sel.layers, images, sel.heads, sel.queries, out, sel.temperature)
    if sel.aggregate == "mean":
        out = out.mean(dim=2, keepdim=True)
    elif sel.aggregate == "max":
        out = out.amax(dim=2, keepdim=True)
    out = out.transpose(0, 1).contiguous()  # B, L, H, Q, N
    if host and waits is not None:
        out, wait = to_host_later(out)
        waits.append(wait)
    elif host:
        out = to_host(out)
    return list(out.unbind(0))


def answer_shape(sel: Selection, att: CapturedAttention) -> tuple[int, int, int, int]:
    """``[layers, heads, queries, tokens]`` of the maps ``sel`` asks of ``att`` (a windowed model's
    selected layers are of one stage: its grid and heads)."""
    first = sel.layers[0]
    num_tokens = att.tokens_at(first)
    selected = len(sel.heads) if sel.heads is not None else att.heads_at(first)
    heads = 1 if sel.aggregate in ("mean", "max", "rollout") else selected
    queries = num_tokens if sel.queries is None else len(sel.queries)
    return len(sel.layers), heads, queries, num_tokens


def batch_mates_tensors(
    atts: Sequence[CapturedAttention],
    sels: Sequence[Selection | None],
    host: bool = True,
    max_floats: int | None = None,
    waits: list[Callable[[], None]] | None = None,
) -> list[torch.Tensor | None]:
    """Each capture's maps under its own selection (None: it asks none), computed at once for
    the batch-mates that ask one selection (:func:`_batch_tensors`). None where a capture has
    no batch-mate asking the same, is no batch's slice (moved, windowed), asks a rollout, or its
    maps are over ``max_floats``: its answer computes them alone, as :func:`attention_tensor`.

    Args:
        host: the maps in host memory (else where the captures are).
        waits: with ``host``, the copies to the host are only started (on a GPU they land once
            the forward and the products are done) and a wait for each is appended here: call
            them all before reading a map. The caller does its other work meanwhile.
    """
    out: list[torch.Tensor | None] = [None] * len(atts)
    done: set[int] = set()
    for i, (att, sel) in enumerate(zip(atts, sels)):
        batch = getattr(att, "batch", None)
        if i in done or sel is None or batch is None or sel.aggregate not in ("none", "mean", "max"):
            continue
        if max_floats is not None and math.prod(answer_shape(sel, att)) > max_floats:
            continue
        idx = [
            k
            for k in range(i, len(atts))
            if k not in done and sels[k] == sel and getattr(atts[k], "batch", None) is batch
        ]
        done.update(idx)
        if len(idx) > 1:
            for k, t in zip(idx, _batch_tensors(batch, [atts[k] for k in idx], sel, host, waits)):
                out[k] = t
    return out


def drop_and_renormalise(attn: torch.Tensor, tokens: list[int]) -> torch.Tensor:
    """Zero the given key tokens in ``[..., N]`` rows and renormalise each row to sum 1.

    Used to look past attention sinks: prefix tokens and high-norm artifact tokens soak up much
    of the mass, which flattens the colour scale of everything else.
    """
    out = attn.clone()
    out[..., tokens] = 0
    return out / out.sum(-1, keepdim=True).clamp_min(1e-12)
