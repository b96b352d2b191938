"""``Scope.relevance`` and ``Scope.faithfulness`` equal the hand-written differentiable forward
of tests/helpers/relevance_reference.py for a picture prepared as the server prepares it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import headscope
from helpers.relevance_reference import (
    FAMILIES,
    curves,
    differentiate,
    forward,
    load_family,
    probability_of,
    relevance_maps,
    top_logit,
    trapezoid,
)


@pytest.fixture(scope="module")
def scope():
    _, arch, kwargs, classes, _ = next(f for f in FAMILIES if f[0] == "vit")
    return headscope.load(load_family(arch, kwargs, classes).model)  # a timm module in memory


@pytest.fixture(scope="module")
def picture():
    return np.random.default_rng(11).integers(0, 256, (64, 64, 3), dtype=np.uint8)


def _x(scope, picture) -> torch.Tensor:
    from headscope.python.inputs import png_bytes

    return scope.pictures.prepare(png_bytes(picture)).pixels


def test_relevance_equals_the_reference(scope, picture):
    x = _x(scope, picture)
    layout = scope.lm.layout(tuple(x.shape[-2:]))
    maps, grads, z, gz, _, y = differentiate(lambda t: forward(scope.model, t), x[None], top_logit)
    want = relevance_maps(maps, grads, z, gz, 0, layout.num_prefix, layout.cls_index)
    for method in ("chefer", "grad_attention", "attention", "rollout"):
        got = scope.relevance(picture, method=method, target="top")
        assert got["method"] == method and tuple(got["grid"]) == layout.grid
        assert got["y"] == pytest.approx(float(y[0]), rel=1e-4, abs=1e-5)
        torch.testing.assert_close(got["relevance"].reshape(-1), want[method], atol=2e-6, rtol=2e-4)
    with pytest.raises(ValueError, match="one method per map"):
        scope.relevance(picture, method="chefer,rollout")


def test_faithfulness_equals_the_reference(scope, picture):
    x = _x(scope, picture)
    layout = scope.lm.layout(tuple(x.shape[-2:]))
    fractions = [0.0, 0.25, 0.5]
    got = scope.faithfulness(picture, methods="chefer", target="top", fractions=fractions)
    rel = scope.relevance(picture, method="chefer", target="top")["relevance"]
    run = lambda t: forward(scope.model, t)[2]  # noqa: E731
    want = curves(run, x, rel, top_logit, fractions, layout.grid, scope.lm.patch_size, score=probability_of(top_logit))
    chefer = got["methods"]["chefer"]
    for direction in ("positive", "negative"):
        np.testing.assert_allclose(chefer[direction], want[direction], rtol=1e-4, atol=1e-5)
        assert chefer[f"auc_{direction}"] == pytest.approx(trapezoid(fractions, want[direction]), rel=1e-4, abs=1e-5)


def test_faithfulness_says_its_verdict_in_the_result_and_its_repr(scope, picture):
    got = scope.faithfulness(picture, methods="chefer,random", target="top", fractions=[0.0, 0.5])
    v = got.verdicts["chefer"]
    c, r = got["methods"]["chefer"], got["methods"]["random"]
    assert v.verdict in ("both", "positive", "negative", "neither")
    assert v.margin_positive == pytest.approx(r["auc_positive"] - c["auc_positive"])
    assert got["verdicts"]["chefer"]["text"] == v.text and got.verdicts["random"].verdict == "baseline"
    shown = repr(got)
    assert shown.startswith("FaithfulnessResult(") and v.text in shown and "the baseline" in shown
    assert isinstance(got, dict) and got["target"] == "top"  # still the API's answer


def test_faithfulness_takes_the_papers_protocol(scope, picture):
    from headscope.engine.faithfulness import ProtocolError, faithfulness

    x = _x(scope, picture)
    rel = scope.relevance(picture, method="chefer", target="top")["relevance"]
    got = scope.faithfulness(picture, methods="chefer", target="top", protocol="paper")
    want = faithfulness(scope.lm, x, {"chefer": rel}, "top", protocol="paper")
    assert got["protocol"] == "paper" and got["score"] == "top1"
    assert got["methods"]["chefer"]["positive"] == want.methods["chefer"].positive
    assert got["methods"]["chefer"]["auc_negative"] == pytest.approx(want.methods["chefer"].auc_negative)
    with pytest.raises(ProtocolError):
        scope.faithfulness(picture, methods="chefer", protocol="theirs")
