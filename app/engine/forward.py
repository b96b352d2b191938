"""One forward pass with the capture hooks installed: the only place the model is called for maps."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .ablation import Ablation, head_masks, heads_masked
from .device import autocast
from .hooks import Attention
from .model import LoadedModel


def forward_capture(
    lm: LoadedModel,
    pixels: torch.Tensor,
    *,
    materialise: bool = False,
    amp_dtype: torch.dtype | None = None,
    to: torch.device | str | None = None,
    ablate: Ablation = (),
) -> Sequence[Attention]:
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
