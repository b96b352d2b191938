"""``Scope.relevance`` and ``Scope.faithfulness`` equal the hand-written differentiable forward
of tests/helpers/relevance_reference.py for a picture prepared as the server prepares it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import headscope
from helpers.relevance_reference import (
    curves,
    differentiate,
    forward,
    load_vit,
    probability_of,
    relevance_maps,
    top_logit,
    trapezoid,
)


@pytest.fixture(scope="module")
def scope():
    return headscope.load(load_vit()[0].model)  # a timm module in memory


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
    # None names no method (to the faithfulness test it means all): it was "one method per map".
    with pytest.raises(ValueError, match=r"name one method \(got None\); this target takes chefer, "):
        scope.relevance(picture, method=None)


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


def test_a_list_of_pictures_of_several_sizes_equals_each_picture_alone(scope):
    """Relevance in one batch per input size, the perturbed forwards stacked across pictures
    (issue #40): each picture's answer is its own, to float rounding (rel 1e-4 on the curves,
    the tolerance of the engine's batch-versus-alone tests)."""
    rng = np.random.default_rng(12)
    pics = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in [(64, 64), (48, 80), (64, 64), (32, 48)]]
    for method in ("chefer", "attnlrp", "chefer2021"):
        many = scope.relevance(pics, method=method, target="top")
        for p, got in zip(pics, many):
            alone = scope.relevance(p, method=method, target="top")
            assert got["image_id"] == alone["image_id"] and got["grid"] == alone["grid"]
            torch.testing.assert_close(got["relevance"], alone["relevance"], atol=1e-6, rtol=1e-4)
    fractions = [0.0, 0.3, 0.6]
    many = scope.faithfulness(pics, methods="chefer,random", target="top", fractions=fractions)
    assert len({tuple(r["grid"]) for r in many}) == 3
    for p, got in zip(pics, many):
        alone = scope.faithfulness(p, methods="chefer,random", target="top", fractions=fractions)
        for m in ("chefer", "random"):
            for d in ("positive", "negative"):
                np.testing.assert_allclose(got["methods"][m][d], alone["methods"][m][d], rtol=1e-4, atol=1e-6)


def test_chefer2021_takes_its_start_layer_checked_and_echoed(scope, picture):
    """``start_layer`` (chefer2021's first layer): the engine's map for that start, said in the
    answer and its text; outside the model's layers, or with another method, StartLayerError
    (``bad_start_layer``, the REST API's code). Before, Scope took no start layer at all."""
    from headscope.engine.relevance import StartLayerError, relevance

    x = _x(scope, picture)
    L = scope.lm.num_layers
    zero = scope.relevance(picture, method="chefer2021", target="top", start_layer=0)
    want = relevance(scope.lm, x[None], "top", ["chefer2021"], chefer2021_start=0)[0].maps["chefer2021"]
    torch.testing.assert_close(zero["relevance"], want, atol=1e-7, rtol=1e-5)
    assert zero["start_layer"] == 0 and "rolled out from layer 0 (start_layer=0" in zero["method_text"]
    default = scope.relevance(picture, method="chefer2021", target="top")
    assert default["start_layer"] == 1 and "from layer 1 (start_layer=1, the authors'" in default["method_text"]
    assert not torch.equal(default["relevance"], zero["relevance"])
    assert scope.relevance(picture, method="chefer", target="top")["start_layer"] is None
    for bad in (L, 100, -1, -100, 1.5, "1"):
        with pytest.raises(StartLayerError, match="start_layer") as e:
            scope.relevance(picture, method="chefer2021", start_layer=bad)
        assert e.value.code == "bad_start_layer"
    with pytest.raises(StartLayerError, match="only chefer2021 takes it"):
        scope.relevance(picture, method="chefer", start_layer=0)
    test = scope.faithfulness(picture, methods="chefer2021,random", target="top", fractions=[0, 0.5], start_layer=0)
    assert test["start_layer"] == 0 and "from layer 0" in test["method_text"]["chefer2021"]
    again = scope.faithfulness(picture, methods="chefer2021,random", target="top", fractions=[0, 0.5])
    assert again["start_layer"] == 1 and "from layer 1" in again["method_text"]["chefer2021"]
    assert scope.faithfulness(picture, methods="chefer,random", fractions=[0, 0.5])["start_layer"] is None
    with pytest.raises(StartLayerError, match="only chefer2021 takes it"):
        scope.faithfulness(picture, methods="chefer,random", start_layer=1)
    with pytest.raises(StartLayerError, match=f"0..{L - 1}"):
        scope.faithfulness(picture, methods="chefer2021", start_layer=L)


def test_bad_protocols_and_fractions_raise_the_apis_named_errors(scope, picture):
    """One behaviour with the REST API: exact protocol names (None or "" the default); any other
    spelling or type is ProtocolError (bad_protocol); fractions that are not numbers are
    FractionsError (bad_fractions). Before: "Paper" and " paper " were taken, protocol=1 was an
    AttributeError and fractions=["a"] float()'s ValueError."""
    from headscope.engine.faithfulness import FractionsError, ProtocolError

    for protocol in ("Paper", " paper ", "LIVE", "papr", 1, ["paper"]):
        with pytest.raises(ProtocolError) as e:
            scope.faithfulness(picture, methods="random", target="top", fractions=[0, 0.5], protocol=protocol)
        assert e.value.code == "bad_protocol"
    for protocol in (None, ""):
        got = scope.faithfulness(picture, methods="random", target="top", fractions=[0, 0.5], protocol=protocol)
        assert got["protocol"] == "live"
    for fractions in (["a"], [0.1, None], 0.5):
        with pytest.raises(FractionsError) as e:
            scope.faithfulness(picture, methods="random", target="top", fractions=fractions)
        assert e.value.code == "bad_fractions"


def test_the_random_maps_seed_as_the_api_takes_it(scope, picture):
    """``seed=`` in the Python API (the REST API had it; a seeded answer could not be reproduced
    from Python): the map is the seed's own draw, and the test's random curve moves with it."""
    x = _x(scope, picture)
    grid = scope.lm.layout(tuple(x.shape[-2:])).grid
    g = torch.Generator().manual_seed(7)  # the draw written out: uniform, normalised in float64
    m = torch.rand(grid[0] * grid[1], generator=g, dtype=torch.float64)
    want = (m / m.sum()).float().reshape(grid)
    got = scope.relevance(picture, method="random", seed=7)
    assert got["seed"] == 7 and torch.equal(torch.as_tensor(got["relevance"]), want)
    assert not torch.equal(torch.as_tensor(scope.relevance(picture, method="random")["relevance"]), want)
    fractions = [0.0, 0.5]
    seven = scope.faithfulness(picture, methods="chefer,random", target="top", fractions=fractions, seed=7)
    zero = scope.faithfulness(picture, methods="chefer,random", target="top", fractions=fractions)
    assert seven["seed"] == 7 and zero["seed"] == 0
    assert seven["methods"]["chefer"] == zero["methods"]["chefer"]
    run = lambda t: forward(scope.model, t)[2]  # noqa: E731
    curve = curves(run, x, want, top_logit, fractions, grid, scope.lm.patch_size, score=probability_of(top_logit))
    np.testing.assert_allclose(seven["methods"]["random"]["positive"], curve["positive"], rtol=1e-4, atol=1e-5)
    for bad, error in ((-1, ValueError), (2**31, ValueError), (1.5, TypeError), ("7", TypeError)):
        with pytest.raises(error, match="seed"):
            scope.relevance(picture, method="random", seed=bad)


def test_blank_and_non_text_method_names(scope, picture):
    """A blank method is the default, as a blank REST parameter is (it was 'method '': unknown'
    here where REST answered chefer); a number is a MethodError, not 'int is not iterable'."""
    from headscope.engine.relevance import MethodError

    assert scope.relevance(picture, method="", target="top")["method"] == "chefer"
    assert list(scope.faithfulness(picture, methods=" ", target="top", fractions=[0.0, 0.5])["methods"]) == list(
        scope.faithfulness(picture, target="top", fractions=[0.0, 0.5])["methods"]
    )
    # a generator is read once (the type check must not use it up before the names are read)
    got = scope.faithfulness(picture, methods=(m for m in ("chefer", "random")), target="top", fractions=[0.0, 0.5])
    assert list(got["methods"]) == ["chefer", "random"]
    for call in (lambda: scope.relevance(picture, method=123), lambda: scope.faithfulness(picture, methods=123)):
        with pytest.raises(MethodError, match="names as text"):
            call()
    with pytest.raises(ValueError) as e:
        scope.faithfulness(picture, methods="random", ablate="junk", fractions=[0.0, 0.5])
    assert e.value.code == "bad_ablate"  # the API's 422 code (it was bad_selection here)
