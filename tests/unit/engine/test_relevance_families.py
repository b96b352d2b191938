"""Relevance maps and perturbation curves equal a hand-written differentiable forward of each
family (tests/helpers/relevance_reference.py), for a batch of two pictures, for each output kind a
family is served with (class logits, pooled embedding)."""

from __future__ import annotations

import pytest
import torch

from headscope.engine.faithfulness import faithfulness
from headscope.engine.relevance import METHODS, relevance
from helpers.relevance_reference import (
    FAMILIES,
    class_logit,
    curves,
    differentiate,
    embedding_ratio,
    forward,
    load_family,
    probability_of,
    relevance_maps,
    top_logit,
    trapezoid,
)

ATOL = 2e-6  # maps sum to 1 over 16 to 64 patches: values of 0.01 to 0.1
RTOL = 2e-4


@pytest.fixture(scope="module", params=FAMILIES, ids=[f[0] for f in FAMILIES])
def family(request):
    name, arch, kwargs, classes, hw = request.param
    lm = load_family(arch, kwargs, classes)
    torch.manual_seed(2)
    x = torch.randn(2, 3, *hw)
    return name, lm, x


def targets(lm):
    """(spelling, the reference's own target function) pairs for the model's output kind."""
    if lm.output_kind == "classes":
        return [("top", top_logit), ("class:3", class_logit(3))]
    return [("embedding", embedding_ratio)]


def reversed_chefer(maps, grads, z, gz, b, prefix):
    """Chefer's rule with the layers in the wrong order (R = R + R @ cam_l): a plausible bug."""
    w = (z[b] * gz[b]).sum(-1).abs()
    R = torch.eye(w.shape[0])
    for A, g in zip(maps, grads):
        R = R + R @ (g[b] * A[b]).clamp(min=0).mean(0)
    v = (w @ R)[prefix:]
    return v / v.sum()


def test_the_reference_is_the_model(family):
    """The hand-written forward reproduces timm's own output: the reference models the family."""
    _, lm, x = family
    maps, z, out = forward(lm.model, x)
    with torch.no_grad():
        feats = lm.model.forward_features(x)
        want = lm.model.forward_head(feats)
    torch.testing.assert_close(z, feats, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(out, want, atol=5e-5, rtol=1e-4)
    assert len(maps) == lm.num_layers and maps[0].shape[1] == lm.num_heads


def test_relevance_equals_the_reference(family):
    name, lm, x = family
    layout = lm.layout(tuple(x.shape[-2:]))
    prefix, cls = layout.num_prefix, layout.cls_index
    for spelling, target_fn in targets(lm):
        maps, grads, z, gz, out, y = differentiate(lambda t: forward(lm.model, t), x, target_fn)
        got = relevance(lm, x, spelling, METHODS, seed=7)
        assert len(got) == 2
        for b, rel in enumerate(got):
            want = relevance_maps(maps, grads, z, gz, b, prefix, cls)
            assert str(rel.target) == spelling and rel.grid == layout.grid and rel.seed == 7
            assert rel.rows == ("cls" if cls is not None else "mean")
            assert rel.y == pytest.approx(float(y[b]), rel=1e-4, abs=1e-5)
            if lm.output_kind == "classes":
                idx = 3 if spelling == "class:3" else int(out[b].argmax())
                assert rel.class_index == idx
            for method, ref in want.items():
                m = rel.maps[method]
                assert m.shape == layout.grid, method
                torch.testing.assert_close(m.flatten(), ref.float(), atol=ATOL, rtol=RTOL, msg=f"{name} {method}")
            assert rel.uniform == []
            # the methods differ by far more than the tolerance: a mixed-up method would fail
            assert (want["chefer"] - want["grad_attention"]).abs().max() > 50 * ATOL
            assert (want["attention"] - want["rollout"]).abs().max() > 50 * ATOL
            if lm.output_kind == "classes":  # logits of tens: the products of cams weigh too
                wrong = reversed_chefer(maps, grads, z, gz, b, prefix)
                assert (wrong - want["chefer"]).abs().max() > 50 * ATOL


def test_perturbation_curves_equal_the_reference(family):
    name, lm, x = family
    fractions = [0.0, 0.2, 0.45, 0.7]
    # classes: the runner-up class, not top: with logits of tens of units the top class keeps
    # probability 1 under any perturbation
    spelling, target_fn = targets(lm)[-1]
    if lm.output_kind == "classes":
        with torch.no_grad():
            second = int(forward(lm.model, x[:1])[2][0].argsort()[-2])
        spelling, target_fn = f"class:{second}", class_logit(second)
    rel = relevance(lm, x[:1], spelling, ["chefer", "attention"])[0]
    res = faithfulness(lm, x[0], rel.maps, spelling, fractions, batch_size=3)
    grid, patch = rel.grid, lm.patch_size

    def run(t):
        return forward(lm.model, t)[2]

    # a class's curve is of its softmax probability (positive whatever the logit's sign)
    score = probability_of(int(spelling[6:])) if spelling.startswith("class:") else None
    for method in ("chefer", "attention"):
        want = curves(run, x[0], rel.maps[method], target_fn, fractions, grid, patch, score=score)
        got = res.methods[method]
        assert got.positive[0] == got.negative[0] == 1.0
        assert got.positive == pytest.approx(want["positive"], rel=1e-4, abs=1e-5), (name, method)
        assert got.negative == pytest.approx(want["negative"], rel=1e-4, abs=1e-5), (name, method)
        assert got.auc_positive == pytest.approx(trapezoid(fractions, want["positive"]), rel=1e-4, abs=1e-5)
        assert got.auc_negative == pytest.approx(trapezoid(fractions, want["negative"]), rel=1e-4, abs=1e-5)
    # the perturbations move the output: a test that zeroed nothing would fail here
    assert any(abs(v - 1) > 1e-3 for v in res.methods["chefer"].positive)
