"""Head ablation equals an independent re-implementation of each block with the head zeroed,
for every supported family; the ``ablate`` grammar."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.layers import apply_rot_embed_cat

from headscope.engine.ablation import AblationError, ablate_text, head_masks, heads_masked, parse_ablate
from headscope.engine.forward import forward_capture
from headscope.zoo.ids import ModelSpec
from headscope.zoo.loaders import _finish
from helpers.models import FAMILIES, TINY, make

# Every family of the capture tests, plus a ViT that normalises the heads' outputs before W_O
# (timm's scale_attn_norm): its mask must sit before that norm.
ABLATION_FAMILIES = [
    *[(f[0], f[1], f[2]) for f in FAMILIES],
    ("vit_small_patch16_224", dict(TINY, img_size=64, scale_attn_norm=True), (64, 80)),
]
IDS = [f[0] for f in FAMILIES] + ["vit_scale_attn_norm"]


# -- the independent reference ---------------------------------------------------------------
def ref_attention(attn: nn.Module, h: torch.Tensor, rope=None, zero: list[int] = ()):
    """One attention module from its own weights, with heads ``zero`` removed: (output, maps)."""
    B, N, _ = h.shape
    H = attn.num_heads
    qb = getattr(attn, "q_bias", None)
    if qb is not None:
        kb = attn.k_bias if getattr(attn, "k_bias", None) is not None else torch.zeros_like(qb)
        bias = torch.cat([qb, kb, attn.v_bias])
    else:
        bias = attn.qkv.bias
    qkv = h @ attn.qkv.weight.T + (bias if bias is not None else 0)  # B, N, 3 * H * d
    q, k, v = qkv.reshape(B, N, 3, H, -1).permute(2, 0, 3, 1, 4)  # each B, H, N, d
    if hasattr(attn, "q_norm"):
        q, k = attn.q_norm(q), attn.k_norm(k)
    if type(attn).__name__ == "EvaAttention" and rope is not None:
        npt = attn.num_prefix_tokens
        q = torch.cat([q[:, :, :npt], apply_rot_embed_cat(q[:, :, npt:], rope)], dim=2)
        k = torch.cat([k[:, :, :npt], apply_rot_embed_cat(k[:, :, npt:], rope)], dim=2)
    logits = (q * attn.scale) @ k.transpose(-2, -1)  # B, H, N, N
    if getattr(attn, "relative_position_bias_table", None) is not None:
        logits = logits + attn._get_rel_pos_bias()
    maps = logits.softmax(-1)
    o = maps @ v  # B, H, N, d: one output per head
    keep = torch.ones(H)
    keep[list(zero)] = 0.0
    o = o * keep[None, :, None, None]  # the removed heads' outputs are zero
    o = o.transpose(1, 2).reshape(B, N, -1)  # concatenated, head-major
    norm = getattr(attn, "norm", None)
    if norm is not None and not isinstance(norm, nn.Identity):
        o = F.layer_norm(o, norm.normalized_shape, norm.weight, norm.bias, norm.eps)
    return o @ attn.proj.weight.T + attn.proj.bias, maps


def scale(branch: torch.Tensor, blk: nn.Module, i: int) -> torch.Tensor:
    """LayerScale (timm ``ls1``/``ls2``) or BEiT/EVA's ``gamma_1``/``gamma_2``."""
    ls = getattr(blk, f"ls{i}", None)
    if ls is not None:
        return branch if isinstance(ls, nn.Identity) else branch * ls.gamma
    gamma = getattr(blk, f"gamma_{i}", None)
    return branch if gamma is None else branch * gamma


def ref_forward(model: nn.Module, x: torch.Tensor, ablate: dict[int, list[int]]):
    """forward_features with heads removed, block by block from the blocks' own weights.

    The token embedding and each block's extra arguments (EVA's rotary table) are taken from an
    unablated forward through plain pre-hooks: removing heads cannot change them.
    """
    calls = []
    handles = [
        b.register_forward_pre_hook(lambda m, a, kw: calls.append((a, kw)), with_kwargs=True) for b in model.blocks
    ]
    with torch.no_grad():
        model.forward_features(x)
    for h in handles:
        h.remove()
    t = calls[0][0][0]
    maps = []
    with torch.no_grad():
        for i, (blk, (args, kwargs)) in enumerate(zip(model.blocks, calls)):
            rope = kwargs.get("rope", args[1] if len(args) > 1 else None)
            a, m = ref_attention(blk.attn, blk.norm1(t), rope, ablate.get(i, []))
            t = t + scale(a, blk, 1)
            t = t + scale(blk.mlp(blk.norm2(t)), blk, 2)
            maps.append(m)
        return model.norm(t), maps


# -- the tests -------------------------------------------------------------------------------
def loaded(name: str, kwargs: dict):
    model = make(name, kwargs)
    return _finish(ModelSpec(f"random:{name}", "random", name), model, True)


@pytest.mark.parametrize("name,kwargs,hw", ABLATION_FAMILIES, ids=IDS)
def test_ablation_equals_an_independent_block_with_the_head_zeroed(name, kwargs, hw):
    lm = loaded(name, kwargs)
    model, H, L = lm.model, lm.num_heads, lm.num_layers
    torch.manual_seed(1)
    x = torch.randn(2, 3, *hw)
    ablate = ((0, 0), (0, H - 1)) + (((L - 1, 1),) if L > 1 else ())
    by_layer: dict[int, list[int]] = {}
    for layer, head in ablate:
        by_layer.setdefault(layer, []).append(head)
    want, want_maps = ref_forward(model, x, by_layer)
    plain, plain_maps = ref_forward(model, x, {})

    with torch.no_grad(), heads_masked(model, head_masks(ablate, H)):
        got = model.forward_features(x)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert (got - plain).abs().max() > 1e-3, "removing heads must change the features"

    # The served path: the captured maps are those of the ablated model (later layers change).
    caps = forward_capture(lm, x, ablate=ablate)
    for layer in range(L):
        for b in range(2):
            torch.testing.assert_close(caps[b].rows(layer), want_maps[layer][b], atol=1e-5, rtol=1e-4)
    if L > 1:
        assert (want_maps[1] - plain_maps[1]).abs().max() > 1e-5
    # and the maps of the ablated layer itself are untouched
    torch.testing.assert_close(caps[0].rows(0), plain_maps[0][0], atol=1e-5, rtol=1e-4)
    # hooks are gone: the next forward is the plain model
    with torch.no_grad():
        again = model.forward_features(x)
    torch.testing.assert_close(again, plain, atol=1e-4, rtol=1e-4)
    assert all(not mod._forward_pre_hooks for mod in model.modules())


def test_masked_heads_pass_through_bit_for_bit_and_removed_ones_are_exact_zeros():
    lm = loaded("vit_small_patch16_224", dict(TINY, img_size=64))
    x = torch.randn(1, 3, 64, 64)
    seen = {}

    def record(m, a):
        seen["in"] = a[0].clone()

    with torch.no_grad():
        h = lm.model.blocks[0].attn.proj.register_forward_pre_hook(record)
        lm.model.forward_features(x)
        plain = seen["in"]
        h.remove()
        with heads_masked(lm.model, head_masks([(0, 2)], 4)):
            h = lm.model.blocks[0].attn.proj.register_forward_pre_hook(record)
            lm.model.forward_features(x)
            h.remove()
    d = plain.shape[-1] // 4
    masked = seen["in"]
    assert torch.equal(masked[..., : 2 * d], plain[..., : 2 * d])
    assert torch.equal(masked[..., 3 * d :], plain[..., 3 * d :])
    assert torch.count_nonzero(masked[..., 2 * d : 3 * d]) == 0


def test_per_image_masks_in_one_batch_equal_separate_forwards():
    lm = loaded("vit_small_patch14_dinov2", dict(TINY, img_size=56))
    torch.manual_seed(2)
    x = torch.randn(1, 3, 56, 56)
    sets = [(), ((0, 1),), ((1, 0), (1, 3))]
    from headscope.engine.ablation import batch_masks

    with torch.no_grad():
        with heads_masked(lm.model, batch_masks(sets, 4)):
            batched = lm.model.forward_features(x.expand(3, -1, -1, -1))
        for i, s in enumerate(sets):
            with heads_masked(lm.model, head_masks(s, 4)):
                one = lm.model.forward_features(x)
            torch.testing.assert_close(batched[i : i + 1], one, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "spec,want",
    [
        ("", ()),
        ("none", ()),
        ("0:1", ((0, 1),)),
        (" 11:5 , 0:0 ", ((0, 0), (11, 5))),
        ("-1:-1", ((11, 5),)),
        ("3:0,3:1,3:2,3:3,3:4,3:5", tuple((3, h) for h in range(6))),
    ],
)
def test_parse_ablate(spec, want):
    assert parse_ablate(spec, 12, 6) == want
    assert parse_ablate(ablate_text(want), 12, 6) == want


@pytest.mark.parametrize(
    "spec,match",
    [
        ("1", "layer:head pairs"),
        ("1:", "layer:head pairs"),
        ("a:b", "layer:head pairs"),
        ("1:2:3", "layer:head pairs"),
        ("1;2", "layer:head pairs"),
        ("0:1,", "layer:head pairs"),
        ("12:0", "layer 12 .* out of range for 12 layers"),
        ("-13:0", "layer -13 .* out of range"),
        ("0:6", "head 6 .* out of range for 6 heads"),
        ("0:1,0:1", "listed twice"),
        ("11:5,-1:5", "listed twice"),
        ("0:" + "9" * 7, "head 9999999 .* out of range for 6 heads"),  # a long number is a number
        ("0:1," * 2000, "too long"),
    ],
)
def test_bad_ablate_is_refused_with_a_reason(spec, match):
    with pytest.raises(AblationError, match=match):
        parse_ablate(spec, 12, 6)
