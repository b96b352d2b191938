"""One forward pass with the capture hooks installed: the only place the model is called for maps."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .ablation import Ablation, head_masks, heads_masked
from .block_capture import AttentionCapture, ImageAttention
from .capture_base import CapturedAttention, CaptureError
from .device import autocast
from .model import LoadedModel
from .output import head_output


def forward_capture(
    lm: LoadedModel,
    pixels: torch.Tensor,
    *,
    materialise: bool = False,
    amp_dtype: torch.dtype | None = None,
    to: torch.device | str | None = None,
    ablate: Ablation = (),
) -> Sequence[CapturedAttention]:
    """Run ``lm``'s backbone on a batch with its attention captured; one result per image.

    Args:
        lm: the loaded model (its capture hooks and module).
        pixels: ``[B, 3, H, W]`` normalised images, already on the model's device.
        materialise: keep full softmax maps from the unfused branch (callers that need every
            row; see :meth:`AttentionCapture.capturing`).
        amp_dtype: autocast dtype, or None for plain fp32.
        to: move the captures there (None keeps them where the forward ran).
        ablate: ``(layer, head)`` pairs whose outputs are zeroed in this forward (see
            :mod:`app.engine.ablation`); the maps of later layers are those of the ablated model.
    """
    masks = head_masks(ablate, lm.num_heads, pixels.device)
    with torch.inference_mode(), autocast(pixels.device.type, amp_dtype):
        # The masks first: the capture's hook on attn.proj then sees the masked head outputs.
        with heads_masked(lm.model, masks), lm.capture.capturing(materialise=materialise):
            lm.model.forward_features(pixels)  # type: ignore[operator]  # timm's, not nn.Module's
        return lm.capture.results(to=to)


@dataclass
class MapsForward:
    """A forward that kept every softmax map, the final features and the model's output.

    With ``grad=True`` (:func:`forward_maps`) ``maps``, ``features`` and ``output`` stay in the
    autograd graph. ``features``: ``[B, N, D]``, what ``forward_features`` returned (the final
    normed tokens the output head reads); ``maps``: per layer ``[B, H, N, N]``, the softmax maps
    as the forward used them; ``output``: saliency ``[B, H, W]``, classifier logits ``[B, C]`` or
    the embedding ``[B, D]``, float32; ``captures``: the same forward's per-image captures
    (detached, for rows and rollout); ``input_hw``: the input's ``(H, W)`` in pixels.
    """

    features: torch.Tensor
    maps: list[torch.Tensor]
    output: torch.Tensor
    captures: list[ImageAttention]
    input_hw: tuple[int, int]


def forward_maps(
    lm: LoadedModel,
    pixels: torch.Tensor,
    *,
    grad: bool = True,
    amp_dtype: torch.dtype | None = None,
    ablate: Ablation = (),
    captures: bool = True,
) -> MapsForward:
    """Run ``lm`` (backbone and output head) on a batch, keeping every softmax map.

    With ``grad`` the input is a fresh leaf that requires grad (the weights do not), so every
    map, the features and the output depend on it, and ``torch.autograd.grad(y, maps +
    [features])`` differentiates any scalar ``y`` of the output with respect to them; nothing
    below the maps is differentiated. Without it the forward runs in inference mode (the maps
    of :func:`forward_capture` with ``materialise=True``, plus the output).

    Args:
        lm: a model with global attention blocks (not windowed).
        pixels: ``[B, 3, H, W]`` normalised images on the model's device (inference tensors too).
        grad: keep the maps, features and output in the autograd graph.
        amp_dtype: autocast dtype, or None for plain fp32.
        ablate: ``(layer, head)`` pairs removed in this forward, as for :func:`forward_capture`.
        captures: split the per-image captures too (``MapsForward.captures``); False leaves the
            list empty, for callers that read only the maps (no view per image and tensor).
    """
    cap = lm.capture
    if not isinstance(cap, AttentionCapture):
        raise CaptureError("forward_maps needs global attention blocks (windowed models have none)")
    hw = (int(pixels.shape[-2]), int(pixels.shape[-1]))
    masks = head_masks(ablate, lm.num_heads, pixels.device)
    mode = torch.inference_mode(False) if grad else torch.inference_mode()
    with mode, torch.set_grad_enabled(grad), autocast(pixels.device.type, amp_dtype):
        # a normal tensor even if pixels is an inference tensor, and the graph's one leaf
        x = pixels.clone().requires_grad_(True) if grad else pixels
        with heads_masked(lm.model, masks), cap.capturing(materialise=True, grad=grad):
            feats = lm.model.forward_features(x)  # type: ignore[operator]  # timm's, not nn.Module's
        maps = cap.graph_maps()
        if captures:
            per_image = cap.results()
        else:
            per_image = []
            cap.discard()
        out = head_output(lm, feats, hw, logits=True)
    return MapsForward(feats, maps, out, per_image, hw)
