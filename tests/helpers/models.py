"""Tiny random-weight timm models of every supported global-attention family (unit tests)."""

from __future__ import annotations

import timm
import torch

TINY = dict(depth=2, embed_dim=64, num_heads=4)

# name, create kwargs, input (H, W), expected prefix kinds, expected capture kind
FAMILIES = [
    ("test_vit", dict(), (64, 96), ["cls"], "qk"),
    ("vit_small_patch16_224", dict(TINY, img_size=64), (64, 96), ["cls"], "qk"),
    # QK-norm: q and k are the norms' outputs, not views of qkv's (their own hooks).
    ("vit_small_patch16_224", dict(TINY, img_size=64, qk_norm=True), (64, 64), ["cls"], "qk"),
    ("deit_tiny_distilled_patch16_224", dict(depth=2, img_size=64), (64, 64), ["cls", "dist"], "qk"),
    ("vit_small_patch14_dinov2", dict(TINY, img_size=56), (56, 84), ["cls"], "qk"),
    ("vit_small_patch14_reg4_dinov2", dict(TINY, img_size=56), (56, 56), ["cls", "reg", "reg", "reg", "reg"], "qk"),
    ("flexivit_small", dict(TINY, img_size=64), (64, 80), ["cls"], "qk"),
    ("vit_base_patch16_siglip_224", dict(TINY, img_size=64), (64, 64), [], "qk"),
    ("eva02_tiny_patch14_224", dict(depth=2, img_size=56), (56, 56), ["cls"], "sdpa"),
    ("beit_base_patch16_224", dict(TINY, img_size=64), (64, 64), ["cls"], "sdpa"),
]


def make(name: str, kwargs: dict, dynamic: bool = True) -> torch.nn.Module:
    torch.manual_seed(0)
    try:
        m = timm.create_model(name, pretrained=False, num_classes=0, dynamic_img_size=dynamic, **kwargs)
    except TypeError:
        m = timm.create_model(name, pretrained=False, num_classes=0, **kwargs)
    # Random LayerScale/bias inits can be degenerate (zeros); make every parameter matter.
    with torch.no_grad():
        for n, p in m.named_parameters():
            if p.ndim == 1 and ("bias" in n or "gamma" in n or "lambda" in n):
                p.add_(torch.randn_like(p) * 0.1)
            elif "relative_position_bias_table" in n:  # BEiT's starts at zero: no bias at all
                p.add_(torch.randn_like(p))
    return m.eval()


def write_classifier(path) -> str:
    """A ``test_vit`` classifier of random weights (its 1000-class head made to matter) saved at
    ``path`` (safetensors); returns the id a server offers it under as ``local:test_vit@path``."""
    from safetensors.torch import save_file

    torch.manual_seed(3)
    model = timm.create_model("test_vit", pretrained=False)
    with torch.no_grad():
        model.head.weight.mul_(50)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return f"local:test_vit@{path}"
