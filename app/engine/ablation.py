"""Head ablation: switch attention heads off for a forward pass.

Removing head ``h`` of block ``l`` means: in block ``l`` only, that head's output
``o_h = softmax(q_h k_h^T / sqrt(d)) v_h`` is set to zero before the heads are concatenated
and projected by ``W_O``; everything after it is recomputed (the block's residual, its MLP,
later blocks, the final norm and the model's own output). Block ``l``'s attention maps are
unchanged; later blocks' maps change.

The mask is a forward pre-hook on the module that first reads the concatenated head outputs:
``attn.norm`` where the family normalises them before the projection (timm's ``scale_norm``,
EVA's ``scale_attn_inner``), else ``attn.proj``. It multiplies head slices by 0 (or by any
multiplier: the gradient method differentiates through it), so the zeros are exact and the
unmasked heads pass through bit for bit.

Grammar of ``ablate``: comma-separated ``L:H`` pairs (``0:1,11:5``); negative indices count
from the end as in ``layers``; an empty string or ``none`` removes nothing.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from typing import Any, cast

import torch
import torch.nn as nn

from .block_capture import attention_layers
from .selection import MAX_SPEC, SelectionError, number_text

Ablation = tuple[tuple[int, int], ...]  # sorted (layer, head) pairs: a cache key

# ASCII digits only, as every selection grammar (``\d`` would take ``١:٢``, ``１:２`` and ``𝟏:𝟐``,
# which int() reads as 1 and 2); fullmatch, since ``$`` also matches before a final newline.
# Any number of digits: a huge index is out of range, said as such, not "cannot read" (the number
# is compared, never used; MAX_SPEC bounds the text).
_PAIR = re.compile(r"(-?[0-9]+):(-?[0-9]+)")


class AblationError(SelectionError):
    """A malformed, out-of-range or repeated ``ablate`` entry (answered as 422)."""

    code = "bad_ablate"


class AblationUnsupportedError(SelectionError):
    """Head ablation (``ablate``, importance, pruning) asked of a windowed model (answered as 422)."""

    code = "ablation_unsupported"


WINDOWED = (
    "windowed models (Swin) have no head ablation yet: heads differ per stage and the sweep's "
    "reuse of each block's input does not carry over patch merging; GET …/output without ablate "
    "and every attention map are served"
)


def refuse_windowed_ablation(windowed: bool, what: str) -> None:
    """Raise :class:`AblationUnsupportedError` for a windowed model.

    Args:
        windowed: whether the model is windowed (``LoadedModel.windowed``).
        what: what was asked (``ablate``, ``importance``...), for the message.
    """
    if windowed:
        raise AblationUnsupportedError(f"{what}: {WINDOWED}")


def parse_ablate(spec: str | None, num_layers: int, num_heads: int, *, windowed: bool = False) -> Ablation:
    """Resolve ``ablate`` against a model; returns sorted, non-negative ``(layer, head)`` pairs.

    Args:
        spec: e.g. ``"0:1,11:5"``; empty or ``none`` for no ablation.
        num_layers: blocks of the model.
        num_heads: heads per block.
        windowed: the model is windowed (Swin): any head is refused.

    Raises:
        AblationError: bad syntax, an index out of range, or a head listed twice.
        AblationUnsupportedError: heads asked of a windowed model.
    """
    spec = (spec or "").strip().lower()
    if len(spec) > MAX_SPEC:
        raise AblationError(f"ablate: specification too long (at most {MAX_SPEC:,} characters)")
    if spec in ("", "none"):
        return ()
    refuse_windowed_ablation(windowed, "ablate")
    seen: dict[tuple[int, int], str] = {}
    for part in spec.split(","):
        raw = part.strip(" ")  # spaces only: a newline or tab is not read as one
        spaced = re.search(r"[0-9]\s+-?[0-9]", raw)  # "0:1 0:2": two pairs without a comma ("0 : 1" is one)
        m = None if spaced else _PAIR.fullmatch(raw.replace(" ", ""))
        if not m:
            hint = "separate pairs with commas" if spaced else "write layer:head pairs"
            raise AblationError(f"ablate: cannot read {raw[:40]!r}; {hint} like 0:1,11:5")
        layer, head = int(m.group(1)), int(m.group(2))
        raw = raw[:40]
        if not -num_layers <= layer < num_layers:
            raise AblationError(
                f"ablate: layer {number_text(layer)} in {raw!r} is out of range for {num_layers} layers "
                f"(valid: {-num_layers}..{num_layers - 1})"
            )
        if not -num_heads <= head < num_heads:
            raise AblationError(
                f"ablate: head {number_text(head)} in {raw!r} is out of range for {num_heads} heads "
                f"(valid: {-num_heads}..{num_heads - 1})"
            )
        key = (layer % num_layers, head % num_heads)
        if key in seen:
            raise AblationError(f"ablate: head {key[0]}:{key[1]} is listed twice ({seen[key]!r} and {raw!r})")
        seen[key] = raw
    return tuple(sorted(seen))


def ablate_text(ablate: Iterable[tuple[int, int]]) -> str:
    """The canonical spelling of an ablation set (``parse_ablate`` reads it back)."""
    return ",".join(f"{layer}:{head}" for layer, head in ablate)


def mask_point(attn: Any) -> nn.Module:
    """The module whose input is the concatenated head outputs ``[B, N, H * d_v]``."""
    norm = getattr(attn, "norm", None)
    if isinstance(norm, nn.Module) and not isinstance(norm, nn.Identity):
        return norm
    return cast(nn.Module, attn.proj)


def head_masks(
    ablate: Iterable[tuple[int, int]], num_heads: int, device: torch.device | str | None = None
) -> dict[int, torch.Tensor]:
    """``{layer: [H] multipliers}`` with 0 for every removed head (layers without one are left out)."""
    masks: dict[int, torch.Tensor] = {}
    for layer, head in ablate:
        m = masks.setdefault(layer, torch.ones(num_heads, device=device))
        m[head] = 0.0
    return masks


def batch_masks(
    ablations: list[Ablation], num_heads: int, device: torch.device | str | None = None
) -> dict[int, torch.Tensor]:
    """Per-image masks for a batch where image ``b`` removes ``ablations[b]``: ``{layer: [B, H]}``."""
    layers = sorted({layer for a in ablations for layer, _ in a})
    masks = {layer: torch.ones(len(ablations), num_heads, device=device) for layer in layers}
    for b, a in enumerate(ablations):
        for layer, head in a:
            masks[layer][b, head] = 0.0
    return masks


def apply_mask(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Multiply each head's slice of concatenated head outputs by its mask value.

    Args:
        x: ``[B, N, H * d_v]``, the heads' outputs concatenated head-major.
        mask: ``[H]`` or ``[B, H]``.
    """
    H = mask.shape[-1]
    m = mask.to(x.dtype).reshape(-1, 1, H, 1)  # 1 or B, 1, H, 1
    return (x.unflatten(-1, (H, -1)) * m).flatten(-2)  # B, N, H * d_v


def _mask_hook(mask: torch.Tensor):
    def hook(module, args):
        return (apply_mask(args[0], mask), *args[1:])

    return hook


@contextmanager
def heads_masked(model: nn.Module, masks: Mapping[int, torch.Tensor]) -> Iterator[None]:
    """Multiply head outputs by ``masks`` for the duration of the block.

    Args:
        model: a timm model of a supported family.
        masks: ``{layer: multipliers}``, each ``[H]`` (every image alike) or ``[B, H]`` (per
            image). 0 removes a head; any other value scales it (the gradient method uses
            ones that require grad).

    Enter this before :meth:`AttentionCapture.capturing`: hooks run in the order they were
    registered, so the capture then sees the masked head outputs.
    """
    if not masks:
        yield
        return
    layers = attention_layers(model)
    with ExitStack() as stack:
        for layer, mask in masks.items():
            attn = layers[layer][0]
            handle = mask_point(attn).register_forward_pre_hook(_mask_hook(mask))
            stack.callback(handle.remove)
        yield
