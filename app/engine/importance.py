"""How much each head matters for the model's output: the exact ablation sweep, Michel et al.'s
gradient estimate, and the pruning curve.

**Exact sweep** (``method=ablation``): the output change when one head alone is removed, for
every layer and head. Removing a head of block ``l`` leaves blocks ``0..l-1`` and block ``l``'s
attention untouched, so one unablated forward (:func:`baseline`) keeps the residual stream
entering every block and every block's concatenated head outputs; :func:`sweep_block` then
recomputes only from block ``l``'s output projection on, for the ``H`` heads of the block as
one batch of ``H``: mask, project, block ``l``'s residual and MLP, blocks ``l+1..`` (fused
attention, no maps), the final norm and the model's output. Backbone work: ``sum_l (L - l)``
blocks at batch ``H`` against ``L * L`` for ``L * H`` whole forwards (78/144 = 0.54 for
L = 12); the output head runs once per removed head either way. The model's own
``forward_features`` runs each time, with the blocks before ``l`` skipped and block ``l``'s
attention replaced by the kept head outputs, so the tail (final norm, pooling, head) is the
model's own code for every family.

**Gradient** (``method=gradient``, Michel et al. 2019, "Are Sixteen Heads Really Better than
One?"): multiply every head's output by a gate ``m_h`` and take ``|d loss / d m_h|`` at
``m = 1``, for every head from one forward and one backward pass. The loss has to be a task
loss whose gradient at the unablated model is not zero by construction (a divergence from the
model's own output is minimal there); see :data:`LOSSES`.

**Pruning curve**: heads removed cumulatively, least important first, and the output change
after each step (Michel et al.'s figure 2, for one image).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from .ablation import Ablation, apply_mask, batch_masks, heads_masked, mask_point
from .capture_base import CaptureError
from .device import autocast
from .model import LoadedModel
from .output import change, head_output, kl_divergence, timm_model

METHODS = ("ablation", "gradient")

# What the gradient method differentiates, per output kind (Michel et al. use the task loss).
LOSSES = {
    "saliency": "binary cross-entropy of the saliency map against its own unablated prediction "
    "thresholded at 0.5 (each pixel's 'looked at or not'), mean over pixels",
    "classes": "cross-entropy with the unablated model's top class (-log p(top class))",
    "embedding": "the pooled embedding's norm (a final LayerNorm holds it nearly fixed: on an embedding model this "
    "ranking is close to noise; method=ablation measures the embedding's change)",
}


@dataclass
class Baseline:
    """What removing one head of block ``l`` cannot change, from one unablated forward.

    ``block_inputs[l]``: ``[1, N, D]`` residual stream entering block ``l``; ``mixed[l]``:
    ``[1, N, H * d_v]`` block ``l``'s concatenated head outputs (the input of its mask point).
    """

    pixels: torch.Tensor  # 1, 3, H, W
    input_hw: tuple[int, int]
    output: torch.Tensor  # 1, ...: the unablated output (float32)
    block_inputs: list[torch.Tensor]
    mixed: list[torch.Tensor]


def _blocks(lm: LoadedModel) -> list[nn.Module]:
    return list(timm_model(lm).blocks)


def baseline(lm: LoadedModel, pixels: torch.Tensor, amp_dtype: torch.dtype | None = None) -> Baseline:
    """One unablated forward of one image, keeping each block's input and head outputs.

    Args:
        lm: the model.
        pixels: ``[1, 3, H, W]`` on the model's device.
        amp_dtype: autocast dtype, or None for fp32.
    """
    if pixels.shape[0] != 1:
        raise ValueError("the sweep runs one image at a time")
    blocks = _blocks(lm)
    inputs: list[list[torch.Tensor]] = [[] for _ in blocks]
    mixed: list[list[torch.Tensor]] = [[] for _ in blocks]
    hw = (int(pixels.shape[-2]), int(pixels.shape[-1]))
    with torch.inference_mode(), autocast(pixels.device.type, amp_dtype), ExitStack() as stack:
        for i, (blk, (attn, _)) in enumerate(zip(blocks, lm.capture.layers)):
            h1 = blk.register_forward_pre_hook(lambda m, a, sink=inputs[i]: sink.append(a[0]))
            h2 = mask_point(attn).register_forward_pre_hook(lambda m, a, sink=mixed[i]: sink.append(a[0]))
            stack.callback(h1.remove)
            stack.callback(h2.remove)
        feats = timm_model(lm).forward_features(pixels)
        out = head_output(lm, feats, hw)
    if any(len(x) != 1 for x in (*inputs, *mixed)):
        raise CaptureError("the sweep's baseline hooks did not fire once per block")
    return Baseline(pixels, hw, out, [x[0] for x in inputs], [x[0] for x in mixed])


def _attention_tail(attn: Any, mixed: torch.Tensor):
    """A stand-in for ``attn.forward`` that starts from given head outputs (at the mask point)
    and runs the rest of the module: [norm, gate,] output projection, dropout."""
    point = mask_point(attn)

    def forward(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        y = mixed  # B, N, H * d_v
        if point is not attn.proj:  # the family normalises the heads' outputs first
            y = attn.norm(y)
            gate = getattr(attn, "gate", None)
            if gate is not None:
                y = y * gate(x).sigmoid()
        return attn.proj_drop(attn.proj(y))

    return forward


@contextmanager
def _resume_at(lm: LoadedModel, layer: int, block_input: torch.Tensor, mixed: torch.Tensor) -> Iterator[None]:
    """Make ``forward_features`` skip the blocks before ``layer`` and start block ``layer`` from
    ``block_input`` with its attention's head outputs replaced by ``mixed`` (instance-level
    ``forward`` overrides, removed on exit)."""
    blocks = _blocks(lm)
    attn = lm.capture.layers[layer][0]
    blk = blocks[layer]
    own = blk.forward
    with ExitStack() as stack:
        for b in blocks[:layer]:
            b.forward = lambda x, *a, **k: x  # skipped: block ``layer`` gets its input from block_input
            stack.callback(delattr, b, "forward")
        blk.forward = lambda x, *a, **k: own(block_input, *a, **k)
        stack.callback(delattr, blk, "forward")
        attn.forward = _attention_tail(attn, mixed)
        stack.callback(delattr, attn, "forward")
        yield


def sweep_features(lm: LoadedModel, base: Baseline, layer: int, amp_dtype: torch.dtype | None = None) -> torch.Tensor:
    """The final features with each head of block ``layer`` removed alone: ``[H, N, D]``.

    Recomputes from block ``layer``'s output projection on; the blocks before it are skipped.
    """
    H = lm.num_heads
    dev = base.pixels.device
    keep = 1.0 - torch.eye(H, device=dev)  # row h removes head h
    with torch.inference_mode(), autocast(dev.type, amp_dtype):
        x = base.block_inputs[layer].expand(H, -1, -1)  # H, N, D
        mixed = apply_mask(base.mixed[layer].expand(H, -1, -1), keep)  # H, N, H * d_v
        with _resume_at(lm, layer, x, mixed):
            return timm_model(lm).forward_features(base.pixels)  # H, N, D


def sweep_block(
    lm: LoadedModel, base: Baseline, layer: int, amp_dtype: torch.dtype | None = None
) -> dict[str, torch.Tensor]:
    """The output change when each head of block ``layer`` alone is removed.

    Returns:
        ``{"change": [H]}`` (the kind's metric, see :mod:`app.engine.output`), plus ``"kl"``
        ``[H]`` for classifiers; on the host, float32.
    """
    dev = base.pixels.device
    with torch.inference_mode(), autocast(dev.type, amp_dtype):
        out = head_output(lm, sweep_features(lm, base, layer, amp_dtype), base.input_hw)
        res = {"change": change(lm.output_kind, base.output, out).float().cpu()}
        if lm.output_kind == "classes":
            res["kl"] = kl_divergence(base.output, out).float().cpu()
    return res


def surrogate_loss(kind: str, out: torch.Tensor) -> torch.Tensor:
    """The loss the gradient method differentiates (see :data:`LOSSES`)."""
    if kind == "saliency":
        target = (out.detach() > 0.5).to(out.dtype)
        return F.binary_cross_entropy(out.clamp(1e-6, 1 - 1e-6), target)
    if kind == "classes":
        top = out.detach().argmax(-1, keepdim=True)
        return -out.gather(-1, top).sum()
    return out.norm(dim=-1).sum()


def gradient_importance(
    lm: LoadedModel, pixels: torch.Tensor, amp_dtype: torch.dtype | None = None
) -> tuple[torch.Tensor, float]:
    """Michel et al.'s head importance ``|d loss / d m_h|`` at ``m = 1``: ``[L, H]`` and the loss.

    Args:
        pixels: ``[1, 3, H, W]`` on the model's device.
    """
    L, H = lm.num_layers, lm.num_heads
    hw = (int(pixels.shape[-2]), int(pixels.shape[-1]))
    # the caller may be in inference mode (a notebook's, a serving thread's): the gates, the
    # graph and a normal copy of the pixels (an inference tensor cannot be saved for backward)
    with torch.inference_mode(False), torch.enable_grad(), autocast(pixels.device.type, amp_dtype):
        gates = torch.ones(L, H, device=pixels.device, requires_grad=True)
        x = pixels.clone() if pixels.is_inference() else pixels
        with heads_masked(lm.model, {layer: gates[layer] for layer in range(L)}):
            out = head_output(lm, timm_model(lm).forward_features(x), hw)
        loss = surrogate_loss(lm.output_kind, out)
        (grad,) = torch.autograd.grad(loss, gates)
    return grad.abs().float().cpu(), float(loss.detach())


def masked_outputs(
    lm: LoadedModel, pixels: torch.Tensor, ablations: list[Ablation], amp_dtype: torch.dtype | None = None
) -> torch.Tensor:
    """The model's output for one image under several ablation sets, as one batch.

    Args:
        pixels: ``[1, 3, H, W]`` on the model's device.
        ablations: one ``(layer, head)`` set per output (``()`` for the unablated model).

    Returns:
        ``[len(ablations), ...]`` float32, on the model's device.
    """
    hw = (int(pixels.shape[-2]), int(pixels.shape[-1]))
    x = pixels.expand(len(ablations), -1, -1, -1)
    masks = batch_masks(ablations, lm.num_heads, pixels.device)
    with torch.inference_mode(), autocast(pixels.device.type, amp_dtype), heads_masked(lm.model, masks):
        return head_output(lm, timm_model(lm).forward_features(x), hw)


def pruning_steps(total: int, points: int) -> list[int]:
    """How many heads are removed at each point of the curve: 0 .. total, at most ``points`` values."""
    if points >= total + 1:
        return list(range(total + 1))
    return sorted({round(i * total / (points - 1)) for i in range(points)})


def pruning_order(importance: torch.Tensor) -> list[tuple[int, int]]:
    """``(layer, head)`` pairs from least to most important (ties by layer, then head)."""
    L, H = importance.shape
    flat = importance.flatten().tolist()
    order = sorted(range(L * H), key=lambda i: (flat[i], i))
    return [(i // H, i % H) for i in order]


def spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    """Spearman's rank correlation of two equally shaped tensors (average ranks for ties)."""

    def ranks(x: torch.Tensor) -> torch.Tensor:
        x = x.flatten().double()
        order = x.argsort()
        r = torch.empty_like(x)
        r[order] = torch.arange(len(x), dtype=torch.double)
        for v in x.unique():  # ties share their mean rank
            tie = x == v
            if tie.sum() > 1:
                r[tie] = r[tie].mean()
        return r

    ra, rb = ranks(a), ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    den = (ra.norm() * rb.norm()).item()
    return float((ra @ rb).item() / den) if den > 0 else 0.0
