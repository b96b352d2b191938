"""The peers a user would pick instead of Headscope, built on the same weights.

* timm ``AttentionExtract``: fused attention switched off per module (as its docs require), hooks
  on ``attn_drop`` (``method="hook"``). Its default ``method="fx"`` cannot trace the exact
  (non-antialiased) position-table resampling Headscope installs, and on timm's stock resampler
  the maps differ by up to ~0.4 at 224 px, so the hook method on the exact table is the one that
  produces the *same output*; both run the same unfused attention.
* Hugging Face ``Dinov2Model`` with eager attention and ``output_attentions=True``; the weights are
  our timm state dict mapped back to HF names (qkv split into q/k/v, ``ls1.gamma`` ->
  ``layer_scale1.lambda1``, ...).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from .common import BenchFailure

ARCH = "vit_small_patch14_dinov2"


def timm_state_dict(models_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(Path(models_dir) / "dinov2-s14-focus" / "model.safetensors"))


# -- timm AttentionExtract ------------------------------------------------------------------------


def build_timm_extract(sd: dict[str, torch.Tensor], grid: tuple[int, int] = (37, 37)):
    """A fresh timm model with our weights, unfused attention, wrapped in ``AttentionExtract``."""
    import timm
    from timm.utils import AttentionExtract

    from headscope.zoo.pos_embed import install_exact_pos_embed

    model = timm.create_model(ARCH, pretrained=False, num_classes=0, img_size=grid[0] * 14, dynamic_img_size=True)
    model.load_state_dict(sd)
    model.eval().requires_grad_(False)
    install_exact_pos_embed(model, grid)
    n = 0
    for m in model.modules():
        if hasattr(m, "fused_attn"):
            m.fused_attn = False  # AttentionExtract needs the explicit softmax
            n += 1
    if n == 0:
        raise BenchFailure("timm model has no attention modules with fused_attn")
    return AttentionExtract(model, method="hook")


def timm_maps(extract, x: torch.Tensor) -> torch.Tensor:
    """All maps as ``[B, L, H, N, N]`` (what a user stacks from the returned dict)."""
    out = extract(x)
    return torch.stack(list(out.values()), dim=1)


# -- Hugging Face Dinov2Model ---------------------------------------------------------------------


def hf_config():
    from transformers import Dinov2Config

    return Dinov2Config(
        hidden_size=384,
        num_hidden_layers=12,
        num_attention_heads=6,
        intermediate_size=1536,
        patch_size=14,
        image_size=518,
        layerscale_value=1.0,
        layer_norm_eps=1e-6,
        hidden_act="gelu",
        qkv_bias=True,
        attn_implementation="eager",
    )


def timm_to_hf(sd: dict[str, torch.Tensor], hf_keys: set[str], depth: int = 12) -> dict[str, torch.Tensor]:
    """Map a timm ``vit_small_patch14_dinov2`` state dict to ``Dinov2Model`` names.

    Handles both HF layouts: transformers 5 (``attention.q_proj``/``o_proj``) and 4
    (``attention.attention.query``/``attention.output.dense``).
    """
    dim = sd["cls_token"].shape[-1]
    out = {
        "embeddings.cls_token": sd["cls_token"],
        "embeddings.mask_token": torch.zeros(1, dim),
        "embeddings.position_embeddings": sd["pos_embed"],
        "embeddings.patch_embeddings.projection.weight": sd["patch_embed.proj.weight"],
        "embeddings.patch_embeddings.projection.bias": sd["patch_embed.proj.bias"],
        "layernorm.weight": sd["norm.weight"],
        "layernorm.bias": sd["norm.bias"],
    }
    v5 = "encoder.layer.0.attention.q_proj.weight" in hf_keys
    for i in range(depth):
        s, d = f"blocks.{i}.", f"encoder.layer.{i}."
        if v5:
            qkv_names = [d + "attention.q_proj", d + "attention.k_proj", d + "attention.v_proj"]
            proj = d + "attention.o_proj"
        else:
            qkv_names = [d + f"attention.attention.{p}" for p in ("query", "key", "value")]
            proj = d + "attention.output.dense"
        for name, w, b in zip(qkv_names, sd[s + "attn.qkv.weight"].chunk(3, 0), sd[s + "attn.qkv.bias"].chunk(3, 0)):
            out[name + ".weight"], out[name + ".bias"] = w.contiguous(), b.contiguous()
        out[proj + ".weight"] = sd[s + "attn.proj.weight"]
        out[proj + ".bias"] = sd[s + "attn.proj.bias"]
        for a in ("norm1", "norm2", "mlp.fc1", "mlp.fc2"):
            out[d + a + ".weight"] = sd[s + a + ".weight"]
            out[d + a + ".bias"] = sd[s + a + ".bias"]
        out[d + "layer_scale1.lambda1"] = sd[s + "ls1.gamma"]
        out[d + "layer_scale2.lambda1"] = sd[s + "ls2.gamma"]
    return out


def build_hf(sd: dict[str, torch.Tensor]):
    from transformers import Dinov2Model

    cfg = hf_config()
    try:
        model = Dinov2Model(cfg, attn_implementation="eager")
    except TypeError:
        model = Dinov2Model(cfg)
    model.config._attn_implementation = "eager"
    hf_sd = timm_to_hf(sd, set(model.state_dict()))
    missing, unexpected = model.load_state_dict(hf_sd, strict=False)
    if missing or unexpected:
        raise BenchFailure(f"HF weight mapping incomplete: missing {missing[:4]}, unexpected {unexpected[:4]}")
    return model.eval().requires_grad_(False)


def hf_maps(model, x: torch.Tensor) -> torch.Tensor:
    out = model(pixel_values=x, output_attentions=True)
    if not out.attentions or len(out.attentions) != model.config.num_hidden_layers:
        raise BenchFailure("HF returned no attentions (eager attention not active?)")
    return torch.stack(out.attentions, dim=1)  # B, L, H, N, N


def versions() -> dict[str, Any]:
    out: dict[str, Any] = {}
    try:
        import timm

        out["timm"] = timm.__version__
    except ImportError:
        out["timm"] = None
    try:
        import transformers

        out["transformers"] = transformers.__version__
    except ImportError:
        out["transformers"] = None
    return out
