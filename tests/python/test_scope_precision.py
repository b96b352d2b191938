"""Every result of the Python API says the precision it was computed in (issue #37), bf16 and
fp32 alike, and a call keeps its numbers whatever the caller's context: a notebook's inference
mode, another default dtype, a Scope of another precision sharing the model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import headscope

MODEL = "random:test_vit"


@pytest.fixture(scope="module")
def scopes(tmp_path_factory):
    fp32 = headscope.load(MODEL, device="cpu", models_dir=tmp_path_factory.mktemp("models"))
    return fp32, headscope.load(fp32.lm, precision="bf16")


def _picture(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (32, 32, 3), dtype=np.uint8)


@pytest.mark.parametrize("which", [0, 1], ids=["fp32", "bf16"])
def test_every_result_says_its_precision(scopes, which):
    scope = scopes[which]
    want = ("fp32", "bf16")[which]
    assert scope.precision == want
    x = _picture()
    att = scope.attention(x)
    assert att.precision == want and att.meta["precision"] == want
    assert set(att.stats()["precision"]) == {want}
    assert att.explain()["precision"] == want
    assert scope.output(x)["precision"] == want
    assert scope.output(x, ablate="0:0")["precision"] == want
    assert scope.relevance(x)["precision"] == want
    assert scope.faithfulness(x, methods="attention,random", fractions=[0, 0.5])["precision"] == want
    assert scope.importance(x, method="gradient")["precision"] == want
    assert scope.importance(x, method="ablation")["precision"] == want
    assert scope.pruning(x, method="gradient", points=3)["precision"] == want


def test_auto_is_resolved_to_what_is_computed(scopes):
    assert headscope.load(scopes[0].lm, precision="auto").precision == "fp32"  # the CPU: fp32


def test_gradient_importance_and_pruning_run_inside_inference_mode(scopes):
    scope = scopes[0]
    x = _picture(1)
    want = scope.importance(x, method="gradient")["importance"]
    with torch.inference_mode():
        got = scope.importance(x, method="gradient")["importance"]
        assert scope.pruning(x, method="gradient", points=3)["change"] is not None
    assert torch.equal(got, want)


def test_another_default_dtype_changes_nothing(scopes):
    scope = scopes[0]
    x = _picture(2)
    want = scope.attention(x, query="all")
    want_stats = want.stats()
    saved = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        got = headscope.load(scope.lm).attention(x, query="all")  # a fresh Scope: no cached answer
        got_stats = got.stats()
    finally:
        torch.set_default_dtype(saved)
    assert got.maps.dtype == torch.float32 and torch.equal(got.maps, want.maps)
    assert got_stats["entropy"].tolist() == want_stats["entropy"].tolist()


@pytest.fixture
def float64_default():
    saved = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(saved)


def test_a_model_loaded_under_a_float64_default_is_float32(scopes, tmp_path, float64_default):
    """Under ``torch.set_default_dtype(torch.float64)`` timm builds float64 modules: Headscope's
    loaders build float32 ones (the weights' own dtype), so answers that say fp32 are fp32, and
    the same numbers as a model loaded before."""
    scope = headscope.load(MODEL, device="cpu", models_dir=tmp_path)
    assert {p.dtype for p in scope.model.parameters()} == {torch.float32}
    assert torch.get_default_dtype() == torch.float64  # the caller's default given back
    x = _picture(4)
    for method in ("chefer", "chefer2021", "attnlrp"):
        got, want = scope.relevance(x, method=method), scopes[0].relevance(x, method=method)
        assert torch.equal(torch.as_tensor(got["relevance"]), torch.as_tensor(want["relevance"])), method
