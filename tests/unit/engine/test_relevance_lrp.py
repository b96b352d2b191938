"""The CVPR 2021 rule (``chefer2021``) equals an independent LRP built as the authors build it
(tests/helpers/lrp_reference.py: their layers' ``relprop`` rules, their attention's halving, their
``transformer_attribution`` rollout), on a seeded random timm ViT with qkv scaled so attention is
not flat; and the LRP forward changes nothing outside its call."""

from __future__ import annotations

import pytest
import torch

from headscope.engine.relevance import METHODS, relevance
from helpers.lrp_reference import VisionTransformer, transformer_attribution
from helpers.relevance_reference import FAMILIES, load_family

FAMILY = {f[0]: f for f in FAMILIES}
RTOL, ATOL = 1e-4, 1e-6


@pytest.fixture(scope="module")
def vit():
    _, arch, kwargs, classes, hw = FAMILY["vit"]
    lm = load_family(arch, kwargs, classes)  # vit_small, 3 blocks, qkv x3, 10 classes
    torch.manual_seed(7)
    return lm, torch.randn(2, 3, *hw)


def _normalised(v: torch.Tensor) -> torch.Tensor:
    return v / v.sum()


@pytest.mark.parametrize("start_layer", [0, 1])
def test_chefer2021_equals_the_authors_rule(vit, start_layer):
    lm, x = vit
    ref = VisionTransformer(lm.model).eval()
    with torch.no_grad():
        logits = lm.model.forward_head(lm.model.forward_features(x))
    got = relevance(lm, x, "top", ["chefer2021", "chefer"], chefer2021_start=start_layer)
    for b in range(2):
        want = _normalised(transformer_attribution(ref, x[b : b + 1], start_layer=start_layer))
        torch.testing.assert_close(got[b].maps["chefer2021"].reshape(-1), want.float(), rtol=RTOL, atol=ATOL)
        # not the GAE rule served as chefer: the methods differ by far more than the tolerance
        assert (got[b].maps["chefer2021"] - got[b].maps["chefer"]).abs().max() > 100 * ATOL
    # a class that is not the top one (the authors' index=)
    c = int(logits[0].argsort()[-3])
    one = relevance(lm, x[:1], f"class:{c}", ["chefer2021"], chefer2021_start=start_layer)[0]
    want = _normalised(transformer_attribution(ref, x[:1], index=c, start_layer=start_layer))
    torch.testing.assert_close(one.maps["chefer2021"].reshape(-1), want.float(), rtol=RTOL, atol=ATOL)


def test_the_default_start_layer_is_the_authors_evaluation_one(vit):
    lm, x = vit
    ref = VisionTransformer(lm.model).eval()
    got = relevance(lm, x[:1], "top", ["chefer2021"])[0].maps["chefer2021"].reshape(-1)
    one = _normalised(transformer_attribution(ref, x[:1], start_layer=1)).float()
    zero = _normalised(transformer_attribution(ref, x[:1], start_layer=0)).float()
    torch.testing.assert_close(got, one, rtol=RTOL, atol=ATOL)
    assert (one - zero).abs().max() > 100 * ATOL  # the start layer matters on this model


def test_the_rules_are_scoped_to_their_forward(vit):
    """After an LRP forward the model's own forward, its attention flags and its gradients are
    as before: nothing is patched beyond the call."""
    lm, x = vit
    flags = [b.attn.fused_attn for b in lm.model.blocks]
    with torch.no_grad():
        before = lm.model.forward_head(lm.model.forward_features(x))
    relevance(lm, x, "top", ["chefer2021", "attnlrp"])
    assert [b.attn.fused_attn for b in lm.model.blocks] == flags
    with torch.no_grad():
        after = lm.model.forward_head(lm.model.forward_features(x))
    assert torch.equal(before, after)
    xg = x.clone().requires_grad_(True)
    lm.model.forward_head(lm.model.forward_features(xg))[:, 0].sum().backward()
    assert xg.grad is not None and torch.isfinite(xg.grad).all()


@pytest.mark.parametrize("name", [f[0] for f in FAMILIES])
def test_every_family_gets_both_lrp_maps_batch_or_alone(name):
    _, arch, kwargs, classes, hw = FAMILY[name]
    lm = load_family(arch, kwargs, classes)
    torch.manual_seed(2)
    x = torch.randn(2, 3, *hw)
    both = relevance(lm, x, None, ["chefer2021", "attnlrp"])
    alone = relevance(lm, x[1:], None, ["chefer2021", "attnlrp"])[0]
    for m in ("chefer2021", "attnlrp"):
        assert torch.isfinite(both[0].maps[m]).all() and not both[0].uniform
        assert float(both[0].maps[m].sum()) == pytest.approx(1.0, abs=1e-5) or m == "attnlrp"
        torch.testing.assert_close(both[1].maps[m], alone.maps[m], rtol=1e-4, atol=1e-6)
    assert float(both[0].maps["attnlrp"].sum().abs()) == pytest.approx(1.0, abs=1e-5)
    assert {"chefer2021", "attnlrp"} <= set(METHODS)


def test_the_lrp_maps_run_from_inside_inference_mode_after_a_served_forward():
    """A serving thread runs in inference mode, and an earlier forward may have cached tensors
    made in it (the default model's position table): the LRP forward copies those it saves."""
    from pathlib import Path

    from headscope.engine.output import head_output
    from headscope.zoo.loaders import load_embedded

    lm = load_embedded(Path(__file__).resolve().parents[3] / "models")
    torch.manual_seed(0)
    x = torch.randn(1, 3, 56, 70)
    with torch.inference_mode():
        head_output(lm, lm.model.forward_features(x), (56, 70))
        rel = relevance(lm, x.clone(), "box:10,10,40,30", ["chefer2021", "attnlrp"])[0]
    for m in ("chefer2021", "attnlrp"):
        assert torch.isfinite(rel.maps[m]).all() and rel.maps[m].shape == (4, 5) and not rel.uniform
