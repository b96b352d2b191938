"""Relevance: targets and methods (parsing, errors, defaults per output kind), batches, the seeded
random map, rollout and attention as Headscope serves them, ablation, and the capture's grad mode."""

from __future__ import annotations

import copy
import dataclasses
import threading

import pytest
import torch

from headscope.engine.analysis import attention_tensor
from headscope.engine.block_capture import AttentionCapture, CaptureError
from headscope.engine.forward import forward_capture, forward_maps
from headscope.engine.relevance import (
    DEFAULT_TARGETS,
    METHODS,
    MethodError,
    RelevanceUnsupportedError,
    Target,
    TargetError,
    parse_methods,
    parse_target,
    random_map,
    relevance,
)
from headscope.engine.selection import Selection
from headscope.web.errors import to_api_error
from headscope.zoo import loaders
from headscope.zoo.ids import ModelSpec
from helpers.relevance_reference import FAMILIES, load_family
from helpers.server import ROOT

FAMILY = {f[0]: f for f in FAMILIES}


def family(name: str):
    _, arch, kwargs, classes, hw = FAMILY[name]
    return load_family(arch, kwargs, classes), hw


@pytest.fixture(scope="module")
def classifier():
    return family("vit")


@pytest.fixture(scope="module")
def embedder():
    return family("siglip")


@pytest.fixture(scope="module")
def saliency():
    return loaders.load_embedded(ROOT / "models")


@pytest.fixture(scope="module")
def swin():
    spec = ModelSpec.parse("random:swin_tiny_patch4_window7_224")
    return loaders.load_random(spec, depths=(1, 1), num_heads=(2, 4), embed_dim=32)


def copied(lm):
    """The same loaded model with a copy of its weights (and its own capture)."""
    model = copy.deepcopy(lm.model)
    return dataclasses.replace(lm, model=model, capture=AttentionCapture(model), lock=threading.Lock())


def pixels(hw, n=1, seed=0):
    torch.manual_seed(seed)
    return torch.randn(n, 3, *hw)


# -- targets -------------------------------------------------------------------------------
def test_default_targets_by_output_kind(classifier, embedder, saliency):
    assert parse_target(None, classifier[0]) == Target("top")
    assert parse_target("", embedder[0]) == Target("embedding")
    assert parse_target("default", saliency) == Target("output")
    assert DEFAULT_TARGETS == {"saliency": "output", "classes": "top", "embedding": "embedding"}


def test_targets_parse_to_their_canonical_spelling(classifier, saliency):
    lm, _ = classifier
    assert str(parse_target(" Class:7 ", lm)) == "class:7" and parse_target("class:7", lm).index == 7
    assert str(parse_target("TOP", lm)) == "top"
    t = parse_target("box: 60,40,150,120", saliency, (224, 224))
    assert t == Target("box", box=(60, 40, 150, 120)) and str(t) == "box:60,40,150,120"
    assert hash(t) == hash(Target("box", box=(60, 40, 150, 120)))  # a cache key


@pytest.mark.parametrize(
    "spec,where,says",
    [
        ("top", "saliency", "output, box:X0,Y0,X1,Y1"),
        ("class:3", "saliency", "output, box:X0,Y0,X1,Y1"),
        ("embedding", "saliency", "output, box:X0,Y0,X1,Y1"),
        ("output", "classifier", "top, class:N"),
        ("box:0,0,4,4", "classifier", "top, class:N"),
        ("output", "embedder", "embedding"),
        ("top", "embedder", "embedding"),
        ("logits", "classifier", "unknown"),
        ("class:10", "classifier", "out of range for 10 classes"),
        ("class:-1", "classifier", "class:N with N in 0..9"),
        ("class:x", "classifier", "class:N"),
        ("top:2", "classifier", "takes no argument"),
        ("box:60,40,150", "saliency", "box:X0,Y0,X1,Y1"),
        ("box:60,40,60,120", "saliency", "empty"),
        ("box:60,120,150,40", "saliency", "empty"),
        ("box:-1,0,4,4", "saliency", "non-negative"),
        ("box:0,0,225,10", "saliency", "outside the 224 x 224 output map"),
        ("box:0,0,10,300", "saliency", "outside"),
        ("box:0,0,1,1" + "0" * 5000, "saliency", "too long"),
        (
            "box:0,0, " + " " * 1_000_000 + "8,8",
            "saliency",
            "too long",
        ),  # spaces are not free (the field has no max_length)
        ("top" + " " * 10_000, "classifier", "too long"),
    ],
)
def test_bad_targets_are_422_bad_target_naming_what_the_model_takes(spec, where, says, classifier, embedder, saliency):
    lm = {"saliency": saliency, "classifier": classifier[0], "embedder": embedder[0]}[where]
    with pytest.raises(TargetError) as e:
        parse_target(spec, lm, (224, 224))
    assert says in str(e.value)
    api = to_api_error(e.value)
    assert (api.status, api.code) == (422, "bad_target")


def test_a_box_outside_the_map_is_refused_once_the_size_is_known(saliency):
    t = parse_target("box:0,0,300,10", saliency)  # syntax only
    with pytest.raises(TargetError, match="outside"):
        relevance(saliency, torch.zeros(1, 3, 224, 224), t, ["random"])


# -- methods -------------------------------------------------------------------------------
def test_methods_parse_and_unknown_ones_are_422_bad_method():
    assert parse_methods(None) == METHODS
    assert parse_methods("chefer, Attention,chefer") == ("chefer", "attention")
    assert parse_methods(["random"]) == ("random",)
    for bad in ("lrp", "chefer,", "", "chefer;attention"):
        with pytest.raises(MethodError) as e:
            parse_methods(bad)
        api = to_api_error(e.value)
        assert (api.status, api.code) == (422, "bad_method")
        assert "chefer, grad_attention, rollout, attention, random" in str(e.value)


def test_windowed_models_are_422_relevance_unsupported(swin):
    from headscope.engine.batching import BatchRunner
    from headscope.engine.faithfulness import PerturbationTest, faithfulness

    x = torch.zeros(1, 3, 224, 224)
    calls = [lambda: relevance(swin, x), lambda: parse_target("embedding", swin)]
    for m in METHODS:  # every method, the LRP ones included, and the perturbation test's entry points
        calls.append(lambda m=m: relevance(swin, x, None, [m]))
        calls.append(lambda m=m: faithfulness(swin, x[0], {m: torch.ones(49)}))
        calls.append(lambda m=m: PerturbationTest(swin, x[0], {m: torch.ones(49)}))
    got = BatchRunner(swin).faithfulness_many([x[0], x[0]], [{"chefer": torch.ones(49)}] * 2, [None, None])
    assert all(isinstance(g, RelevanceUnsupportedError) for g in got)
    for call in calls:
        with pytest.raises(RelevanceUnsupportedError) as e:
            call()
        api = to_api_error(e.value)
        assert (api.status, api.code) == (422, "relevance_unsupported")
        assert "Swin" in str(e.value) and "windows" in str(e.value)


# -- maps ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["vit", "siglip", "dinov2_reg"])
def test_a_batch_equals_each_picture_alone(name):
    lm, hw = family(name)
    x = pixels(hw, 3, seed=1)
    batch = relevance(lm, x, None, METHODS, seed=5)
    for b in range(3):
        alone = relevance(lm, x[b : b + 1], None, METHODS, seed=5)[0]
        assert batch[b].y == pytest.approx(alone.y, rel=1e-5, abs=1e-6)
        assert batch[b].class_index == alone.class_index
        for m in METHODS:
            torch.testing.assert_close(batch[b].maps[m], alone.maps[m], atol=1e-6, rtol=1e-4)
    assert (batch[0].maps["chefer"] - batch[1].maps["chefer"]).abs().max() > 1e-3


def test_a_target_per_picture_equals_each_picture_alone_with_its_target():
    """A survey's predicted region is a box per picture: one batch, each picture its own target."""
    lm, hw = family("vit")
    x = pixels(hw, 3, seed=4)
    targets = ["class:1", "top", "class:7"]
    batch = relevance(lm, x, targets, METHODS, seed=5)
    for b, t in enumerate(targets):
        alone = relevance(lm, x[b : b + 1], t, METHODS, seed=5)[0]
        assert batch[b].target == alone.target and batch[b].class_index == alone.class_index
        assert batch[b].y == pytest.approx(alone.y, rel=1e-5, abs=1e-6)
        for m in METHODS:
            torch.testing.assert_close(batch[b].maps[m], alone.maps[m], atol=1e-6, rtol=1e-4)
    with pytest.raises(ValueError, match="one per picture"):
        relevance(lm, x, targets[:2], ["chefer"])


def test_maps_sum_to_one_over_the_patch_grid_without_prefix_tokens():
    lm, hw = family("dinov2_reg")  # cls + 4 registers
    rel = relevance(lm, pixels(hw), None)[0]
    assert rel.grid == (4, 4) and set(rel.maps) == set(METHODS)
    for name, m in rel.maps.items():
        assert m.shape == (4, 4) and m.dtype == torch.float32
        if name == "attnlrp":  # signed: divided by |sum|, so it sums to 1 or -1
            assert (m < 0).any() and float(m.sum().abs()) == pytest.approx(1.0, abs=1e-6)
            continue
        assert (m >= 0).all()
        assert float(m.sum()) == pytest.approx(1.0, abs=1e-6)


def test_the_random_map_is_seeded_and_the_seed_is_in_the_answer(classifier):
    lm, hw = classifier
    a = relevance(lm, pixels(hw, 2), None, ["random"], seed=11)
    b = relevance(lm, pixels(hw, 1, seed=9), None, ["random"], seed=11)[0]
    c = relevance(lm, pixels(hw), None, ["random"], seed=12)[0]
    assert a[0].seed == 11 and a[0].info()["seed"] == 11
    assert torch.equal(a[0].maps["random"], b.maps["random"])  # the same on any picture
    assert torch.equal(a[0].maps["random"], random_map(16, 11).reshape(4, 4))
    assert not torch.equal(a[0].maps["random"], c.maps["random"])


def test_rollout_and_attention_are_what_headscope_serves(classifier, embedder):
    for lm, hw in (classifier, embedder):
        x = pixels(hw, seed=3)
        rel = relevance(lm, x, None, ["rollout", "attention"])[0]
        att = forward_capture(lm, x, materialise=True)[0]
        L, H = lm.num_layers, lm.num_heads
        layout = lm.layout(hw)
        p, cls = layout.num_prefix, layout.cls_index
        rows = [cls] if cls is not None else None
        served = attention_tensor(att, Selection([L - 1], list(range(H)), rows, aggregate="rollout"))[0, 0]
        last = attention_tensor(att, Selection([L - 1], list(range(H)), rows, aggregate="mean"))[0, 0]
        for got, rows_ in ((rel.maps["rollout"], served), (rel.maps["attention"], last)):
            want = rows_.mean(0)[p:]
            torch.testing.assert_close(got.flatten(), want / want.sum(), atol=1e-6, rtol=1e-5)
        assert rel.rows == ("cls" if cls is not None else "mean")
    assert relevance(embedder[0], pixels(embedder[1]), None, ["attention"])[0].rows == "mean"  # SigLIP


def test_without_a_gradient_method_no_graph_is_built_and_the_maps_are_the_same(classifier):
    lm, hw = classifier
    x = pixels(hw, 2)
    alone = relevance(lm, x, "class:2", ["attention", "rollout", "random"])
    together = relevance(lm, x, "class:2", METHODS)
    for a, b in zip(alone, together):
        assert a.y == pytest.approx(b.y, rel=1e-5) and a.class_index == b.class_index == 2
        for m in ("attention", "rollout", "random"):
            torch.testing.assert_close(a.maps[m], b.maps[m], atol=1e-7, rtol=1e-5)
    fwd = forward_maps(lm, x, grad=False)
    assert not fwd.output.requires_grad and all(not m.requires_grad for m in fwd.maps)


def test_top_is_the_unperturbed_top_class(classifier):
    lm, hw = classifier
    x = pixels(hw, 2, seed=4)
    rels = relevance(lm, x, "top", ["chefer"])
    with torch.no_grad():
        logits = lm.model.forward_head(lm.model.forward_features(x))
    for b, rel in enumerate(rels):
        assert rel.class_index == int(logits[b].argmax())
        assert rel.y == pytest.approx(float(logits[b].max()), rel=1e-5)
        assert rel.info()["class_index"] == rel.class_index


def test_ablate_equals_the_model_with_that_head_zeroed(classifier):
    """Removing head 1 of layer 0 is zeroing its columns of W_O: an independent way to the same model."""
    lm, hw = classifier
    x = pixels(hw, seed=6)
    got = relevance(lm, x, "class:4", ["chefer", "grad_attention"], ablate=((0, 1),))[0]
    plain = relevance(lm, x, "class:4", ["chefer"])[0]
    zeroed = copied(lm)
    d = zeroed.model.blocks[0].attn.head_dim
    with torch.no_grad():
        zeroed.model.blocks[0].attn.proj.weight[:, d : 2 * d] = 0
    want = relevance(zeroed, x, "class:4", ["chefer", "grad_attention"])[0]
    assert got.y == pytest.approx(want.y, rel=1e-5)
    for m in ("chefer", "grad_attention"):
        torch.testing.assert_close(got.maps[m], want.maps[m], atol=1e-6, rtol=1e-4)
    assert (got.maps["chefer"] - plain.maps["chefer"]).abs().max() > 1e-4


def test_a_target_with_no_gradient_gives_the_uniform_map_and_says_so(classifier):
    lm, hw = classifier
    m = copied(lm)
    with torch.no_grad():
        m.model.head.weight[5] = 0  # the logit of class 5 is its bias alone
    rel = relevance(m, pixels(hw), "class:5", ["chefer", "grad_attention", "attention"])[0]
    assert rel.uniform == ["chefer", "grad_attention"]
    assert torch.allclose(rel.maps["chefer"], torch.full((4, 4), 1 / 16))


def test_low_precision_forwards_give_nearby_maps(classifier):
    lm, hw = classifier
    x = pixels(hw, seed=8)
    exact = relevance(lm, x, "class:1", ["chefer"])[0]
    low = relevance(lm, x, "class:1", ["chefer"], amp_dtype=torch.bfloat16)[0]
    assert float(low.maps["chefer"].sum()) == pytest.approx(1.0, abs=1e-5)
    assert (low.maps["chefer"] - exact.maps["chefer"]).abs().max() < 0.05


# -- the capture's grad mode ---------------------------------------------------------------
@pytest.mark.parametrize("name", ["vit", "eva02", "beit"])
def test_grad_capture_keeps_maps_in_the_graph_and_leaves_nothing_behind(name):
    lm, hw = family(name)
    x = pixels(hw, 2)
    with torch.no_grad():
        before = lm.model.forward_features(x)
    fused = [a.fused_attn for a, _ in lm.capture.layers]
    fwd = forward_maps(lm, x)
    assert all(m.requires_grad and m.shape == (2, lm.num_heads, 17, 17) for m in fwd.maps)
    assert fwd.features.requires_grad and fwd.output.requires_grad
    torch.testing.assert_close(fwd.features.detach(), before, atol=1e-5, rtol=1e-5)
    # the per-image captures are detached views: a cache never keeps the graph alive
    assert all(not p.requires_grad for att in fwd.captures for p in att.probs if p is not None)
    torch.testing.assert_close(fwd.captures[1].rows(0), fwd.maps[0][1].detach(), atol=0, rtol=0)
    (g,) = torch.autograd.grad(fwd.output.sum(), [fwd.maps[0]])
    assert g.abs().sum() > 0
    assert [a.fused_attn for a, _ in lm.capture.layers] == fused
    for mod in lm.model.modules():
        assert not mod._forward_hooks and not mod._forward_pre_hooks
    with torch.no_grad():
        torch.testing.assert_close(lm.model.forward_features(x), before, atol=0, rtol=0)


def test_graph_maps_needs_a_materialised_capture(classifier):
    lm, hw = classifier
    with torch.no_grad(), lm.capture.capturing():
        lm.model.forward_features(pixels(hw))
    with pytest.raises(CaptureError, match="materialise"):
        lm.capture.graph_maps()
    lm.capture.results()


def test_relevance_runs_from_inside_inference_mode(classifier):
    """A serving thread may hold inference tensors (or run under inference_mode): the gradient
    forward steps out of it and gives the same maps."""
    lm, hw = classifier
    x = pixels(hw, seed=2)
    want = relevance(lm, x, "class:3", ["chefer"])[0]
    with torch.inference_mode():
        xi = x.clone()  # an inference tensor
        got = relevance(lm, xi, "class:3", ["chefer"])[0]
    torch.testing.assert_close(got.maps["chefer"], want.maps["chefer"], atol=0, rtol=0)
