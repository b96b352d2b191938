"""open_clip models with random weights for the CLIP tests (no download), and the references the
tests compare against: open_clip's own modules, run as open_clip runs them."""

from __future__ import annotations

import torch

ARCH = "ViT-S-32"  # the smallest plain open_clip ViT: 12 layers of width 384, 7 x 7 patches at 224 px
MODEL_ID = f"open_clip:{ARCH}"


def reference_model(arch: str = ARCH, perturb: bool = True) -> torch.nn.Module:
    """open_clip's model built as ``open_clip:ARCH`` builds it (seed 0), in eval mode.

    Args:
        perturb: add seeded noise to every 1-d parameter (biases, norms, layer scale): open_clip
            starts attention biases at zero, which would hide a bias mapped to the wrong place.
    """
    import open_clip

    torch.manual_seed(0)
    model = open_clip.create_model(arch, pretrained=None).eval().requires_grad_(False)
    if perturb:
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for _, p in model.named_parameters():
                if p.ndim == 1 and p.numel() > 1:
                    p.add_(torch.randn(p.shape, generator=g) * 0.1)
    return model


def mha_maps(visual, x: torch.Tensor) -> list[torch.Tensor]:
    """Every layer's softmax maps ``[B, H, N, N]`` of open_clip's image tower, from PyTorch's own
    ``nn.MultiheadAttention`` (``need_weights=True, average_attn_weights=False``) on each block's
    real input (recorded by plain pre-hooks on open_clip's blocks)."""
    inputs: list[torch.Tensor] = []
    blocks = list(visual.transformer.resblocks)
    handles = [b.register_forward_pre_hook(lambda m, a: inputs.append(a[0])) for b in blocks]
    with torch.no_grad():
        visual(x)
        for h in handles:
            h.remove()
        out = []
        for blk, inp in zip(blocks, inputs):
            h = blk.ln_1(inp)
            _, w = blk.attn(h, h, h, need_weights=True, average_attn_weights=False)
            out.append(w)
    return out
