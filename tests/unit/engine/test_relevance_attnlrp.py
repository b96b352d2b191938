"""AttnLRP (``attnlrp``) equals LXT itself (the ``lxt`` library of Achtibat et al., ICML 2024) on
the same weights: a seeded random timm ViT mapped into torchvision's ``VisionTransformer`` (the
ViT LXT supports), relevance by LXT's efficient rules (its GELU and LayerNorm patches, its
``divide_gradient`` on the attention's q, k and v, the plain gradient for linear layers: the
epsilon rule), gradient x input at the pixels, summed per patch.

LXT patches classes for the whole process (``nn.GELU``, ``nn.LayerNorm``,
``nn.MultiheadAttention``): the test applies its patches only around LXT's own forward and
restores them, and computes Headscope's map before, with nothing patched.
"""

from __future__ import annotations

from functools import partial

import pytest
import torch
import torch.nn as nn

from headscope.engine.relevance import relevance
from helpers.relevance_reference import load_vit


def _lxt_efficient():
    """LXT's ``efficient`` rules and patches, its own modules unchanged. Its package ``__init__``
    imports its LLM patch maps, which need the transformers version LXT 2.1 was written against
    (BERT's ``modeling_attn_mask_utils`` is gone from transformers 5): the package is entered
    without running that ``__init__``, so any transformers (or none) will do."""
    import importlib.util
    import sys
    import types
    from pathlib import Path

    spec = importlib.util.find_spec("lxt")
    if spec is None or spec.origin is None:
        pytest.skip("lxt (the test extra) is not installed")
    if "lxt.efficient" not in sys.modules:
        pkg = types.ModuleType("lxt.efficient")
        pkg.__path__ = [str(Path(spec.origin).parent / "efficient")]
        sys.modules["lxt.efficient"] = pkg
    return importlib.import_module("lxt.efficient.patches"), importlib.import_module("lxt.efficient.rules")


lxt_patches, lxt_rules = _lxt_efficient()
divide_gradient = lxt_rules.divide_gradient
from torchvision.models import vision_transformer  # noqa: E402


def attnlrp_attention_forward(self, query, key, value, *args, **kwargs):
    """AttnLRP's attention rules with LXT's own primitive, as its transformers patches apply them
    (``wrap_attention_forward``: q and k divided by 4, v by 2) before torch's attention."""
    return self.original_forward(divide_gradient(query, 4), divide_gradient(key, 4), divide_gradient(value, 2),
                                 *args, **kwargs)  # fmt: skip


ATTNLRP = {
    nn.GELU: partial(lxt_patches.patch_method, lxt_patches.non_linear_forward, keep_original=True),
    nn.LayerNorm: partial(lxt_patches.patch_method, lxt_patches.layer_norm_forward),
    nn.MultiheadAttention: partial(lxt_patches.patch_method, attnlrp_attention_forward, keep_original=True),
}


def torchvision_vit(timm_vit: nn.Module, image: int, classes: int) -> nn.Module:
    """torchvision's ViT with a timm ``vit_*`` model's weights (LayerNorm eps 1e-6 in both)."""
    m = timm_vit
    D, H = m.embed_dim, m.blocks[0].attn.num_heads
    tv = vision_transformer.VisionTransformer(
        image_size=image, patch_size=m.patch_embed.patch_size[0], num_layers=len(m.blocks), num_heads=H,
        hidden_dim=D, mlp_dim=m.blocks[0].mlp.fc1.out_features, num_classes=classes,
    )  # fmt: skip
    sd = {
        "class_token": m.cls_token,
        "conv_proj.weight": m.patch_embed.proj.weight,
        "conv_proj.bias": m.patch_embed.proj.bias,
        "encoder.pos_embedding": m.pos_embed,
        "encoder.ln.weight": m.norm.weight,
        "encoder.ln.bias": m.norm.bias,
        "heads.head.weight": m.head.weight,
        "heads.head.bias": m.head.bias,
    }
    for i, b in enumerate(m.blocks):
        p = f"encoder.layers.encoder_layer_{i}."
        sd |= {
            p + "ln_1.weight": b.norm1.weight, p + "ln_1.bias": b.norm1.bias,
            p + "self_attention.in_proj_weight": b.attn.qkv.weight,
            p + "self_attention.in_proj_bias": b.attn.qkv.bias,
            p + "self_attention.out_proj.weight": b.attn.proj.weight,
            p + "self_attention.out_proj.bias": b.attn.proj.bias,
            p + "ln_2.weight": b.norm2.weight, p + "ln_2.bias": b.norm2.bias,
            p + "mlp.0.weight": b.mlp.fc1.weight, p + "mlp.0.bias": b.mlp.fc1.bias,
            p + "mlp.3.weight": b.mlp.fc2.weight, p + "mlp.3.bias": b.mlp.fc2.bias,
        }  # fmt: skip
    tv.load_state_dict({k: v.detach().clone() for k, v in sd.items()}, strict=True)
    return tv.eval().requires_grad_(False)


def lxt_relevance(tv: nn.Module, x: torch.Tensor, index: int | None) -> torch.Tensor:
    """LXT's heatmap of one picture: ``(x * x.grad).sum(channels)`` with its rules patched in for
    this forward only, ``[H, W]``."""
    saved = {cls: dict(vars(cls)) for cls in ATTNLRP}
    try:
        lxt_patches_applied = [patch(cls) for cls, patch in ATTNLRP.items()]
        assert all(lxt_patches_applied)
        xg = x.clone().requires_grad_(True)
        with torch.enable_grad():
            y = tv(xg)
            c = int(y[0].argmax()) if index is None else index
            y[0, c].backward()
        return (xg * xg.grad).sum(1)[0].detach()
    finally:
        for cls, attrs in saved.items():  # LXT's patches undone: the classes as they were
            for name in ("forward", "original_forward"):
                if name in attrs:
                    setattr(cls, name, attrs[name])
                elif name in vars(cls):
                    delattr(cls, name)


@pytest.fixture(scope="module")
def models():
    lm, hw = load_vit()  # vit_small, 3 blocks, 4 heads, qkv x3, 10 classes
    return lm, torchvision_vit(lm.model, hw[0], lm.model.num_classes), hw


def test_the_mapped_torchvision_vit_is_the_same_model(models):
    lm, tv, hw = models
    x = torch.randn(2, 3, *hw)
    with torch.no_grad():
        torch.testing.assert_close(tv(x), lm.model.forward_head(lm.model.forward_features(x)), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("target", ["top", "class:second"])
def test_attnlrp_equals_lxt(models, target):
    lm, tv, hw = models
    torch.manual_seed(11)
    x = torch.randn(2, 3, *hw)
    with torch.no_grad():
        logits = tv(x)
    for b in range(2):
        c = None if target == "top" else int(logits[b].argsort()[-2])
        spelling = "top" if c is None else f"class:{c}"
        got = relevance(lm, x[b : b + 1], spelling, ["attnlrp", "chefer"])[0]
        heat = lxt_relevance(tv, x[b : b + 1], c)  # H, W
        gh, gw = got.grid
        ph, pw = lm.patch_size
        per_patch = heat.reshape(gh, ph, gw, pw).sum((1, 3))
        want = per_patch / per_patch.sum().abs()
        torch.testing.assert_close(got.maps["attnlrp"], want, rtol=1e-4, atol=1e-5)
        assert (want < 0).any()  # signed: some patches speak against the class
        # the rules matter: plain gradient x input of the same model is another map
        xg = x[b : b + 1].clone().requires_grad_(True)
        with torch.enable_grad():
            y = tv(xg)
            y[0, int(y[0].argmax()) if c is None else c].backward()
        plain = (xg * xg.grad).sum(1)[0].reshape(gh, ph, gw, pw).sum((1, 3))
        assert (plain / plain.sum().abs() - want).abs().max() > 1e-2
        assert (got.maps["attnlrp"] - got.maps["chefer"]).abs().max() > 1e-2
    # LXT's patches are gone: the classes' own forward again
    assert "original_forward" not in vars(nn.GELU) and "original_forward" not in vars(nn.MultiheadAttention)
