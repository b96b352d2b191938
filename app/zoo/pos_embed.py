"""Position tables resampled the way the original models do it (no antialiasing)."""

from __future__ import annotations

from types import MethodType

import torch
import torch.nn as nn


def install_exact_pos_embed(model: nn.Module, grid: tuple[int, int]) -> None:
    """Make a dynamic-size timm ViT resample its position table without antialiasing.

    The original DINOv2 graph interpolates with ``F.interpolate(..., mode="bicubic",
    align_corners=False, antialias=False)``; timm's ``dynamic_img_size`` path antialiases, which
    moves attention values by more than 1e-4. The resampling itself is timm's
    ``resample_abs_pos_embed``; tables are cached per grid, device and dtype.

    Args:
        model: a ``VisionTransformer`` built with ``dynamic_img_size=True``.
        grid: (rows, cols) of the stored table.
    """
    from timm.layers import resample_abs_pos_embed

    cache: dict[tuple, torch.Tensor] = {}
    npt = 0 if model.no_embed_class else model.num_prefix_tokens

    def table(pos_embed: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        key = (hw, pos_embed.device, pos_embed.dtype, pos_embed.data_ptr())
        if key not in cache:
            cache[key] = resample_abs_pos_embed(
                pos_embed, new_size=list(hw), old_size=list(grid), num_prefix_tokens=npt, antialias=False
            )
        return cache[key]

    def _pos_embed(self, x: torch.Tensor) -> torch.Tensor:
        B, H, W, C = x.shape  # batch, grid rows, grid cols, dim
        pos_embed = table(self.pos_embed, (H, W))
        x = x.view(B, -1, C)
        to_cat = []
        if self.cls_token is not None:
            to_cat.append(self.cls_token.expand(B, -1, -1))
        if self.reg_token is not None:
            to_cat.append(self.reg_token.expand(B, -1, -1))
        if self.no_embed_class:
            x = torch.cat(to_cat + [x + pos_embed], dim=1)
        else:
            x = torch.cat(to_cat + [x], dim=1) + pos_embed
        return self.pos_drop(x)

    model._pos_embed = MethodType(_pos_embed, model)  # type: ignore[assignment]  # patched method
