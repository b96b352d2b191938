"""Weight files: read without ever unpickling code (timm's ``load_state_dict`` does the reading)."""

from __future__ import annotations

from pathlib import Path

import torch

from .errors import ModelLoadError

SUFFIXES = (".safetensors", ".pth", ".pt", ".bin")


def load_state_file(path: Path) -> dict[str, torch.Tensor]:
    """A flat state dict from ``.safetensors``, or ``.pth``/``.pt``/``.bin`` read with
    ``torch.load(weights_only=True)``; ``state_dict``/``model``/EMA wrappers are unpacked by timm.

    Raises:
        ModelLoadError: missing file, wrong suffix, corrupt file, a pickle that wants to run code,
            or anything but a mapping of names to tensors.
    """
    from timm.models import load_state_dict

    path = Path(path)
    if not path.is_file():
        raise ModelLoadError(f"weights file {path.name!r} not found")
    if path.suffix not in SUFFIXES:
        raise ModelLoadError(f"{path.name}: use .safetensors, or .pth/.pt (weights only)")
    try:
        sd = load_state_dict(str(path), use_ema=False, device="cpu", weights_only=True)
    except Exception as e:  # corrupt file or a pickle that wants to run code
        raise ModelLoadError(f"cannot read weights {path.name!r}: {type(e).__name__}: {e}") from None
    if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise ModelLoadError(f"{path.name!r} does not hold a flat state dict of tensors")
    return dict(sd)
