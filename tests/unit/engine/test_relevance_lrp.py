"""The CVPR 2021 rule (``chefer2021``) equals an independent LRP built as the authors build it
(tests/helpers/lrp_reference.py: their layers' ``relprop`` rules, their attention's halving, their
``transformer_attribution`` rollout), on a seeded random timm ViT with qkv scaled so attention is
not flat; and the LRP forward changes nothing outside its call."""

from __future__ import annotations

import pytest
import torch

from headscope.engine import relevance as rel
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


@pytest.mark.parametrize("start", [3, 100, -1, -100, 1.0, True, "1", None])
def test_a_start_layer_outside_the_model_is_refused_with_its_own_code(vit, start):
    """Before: 3 or 100 on this 3-layer model raised autograd's "`inputs` argument to `grad()`
    cannot be empty", and -1 / -100 silently sliced from the end."""
    from headscope.engine.relevance import StartLayerError
    from headscope.web.errors import to_api_error

    lm, x = vit
    with pytest.raises(StartLayerError, match="start_layer") as e:
        relevance(lm, x[:1], "top", ["chefer2021"], chefer2021_start=start)
    assert to_api_error(e.value).status == 422 and to_api_error(e.value).code == "bad_start_layer"
    if isinstance(start, int) and not isinstance(start, bool):
        assert "0..2" in str(e.value)  # names the layers it could be
    with pytest.raises(StartLayerError):  # the device half alone checks it too
        rel.relevance_tensors(lm, x[:1], rel.Target("top"), ("chefer2021",), chefer2021_start=start)
    # no other method reads it: their maps do not depend on it, so it is not checked for them
    assert relevance(lm, x[:1], "top", ["attention"], chefer2021_start=start)[0].start_layer is None


def test_the_start_layer_is_echoed_and_said_in_the_methods_text(vit):
    lm, x = vit
    last = relevance(lm, x[:1], "top", ["chefer2021", "random"], chefer2021_start=2)[0]
    default = relevance(lm, x[:1], "top", ["chefer2021"])[0]
    assert last.start_layer == 2 and default.start_layer == rel.CHEFER2021_START_LAYER == 1
    assert "rolled out from layer 2 (start_layer=2" in last.info()["methods"]["chefer2021"]
    assert "rolled out from layer 1 (start_layer=1, the authors' evaluation's" in rel.METHOD_TEXT["chefer2021"]
    assert default.info()["methods"]["chefer2021"] == rel.METHOD_TEXT["chefer2021"]
    assert last.info()["start_layer"] == 2 and last.info()["methods"]["random"] == rel.METHOD_TEXT["random"]
    assert not torch.equal(last.maps["chefer2021"], default.maps["chefer2021"])
    # the interfaces' resolution: None is the default, only chefer2021 takes one
    assert rel.resolve_start_layer(None, ["chefer2021", "random"], 3) == 1
    assert rel.resolve_start_layer(0, ("chefer2021",), 3) == 0
    assert rel.resolve_start_layer(None, ("chefer", "random"), 3) is None
    with pytest.raises(rel.StartLayerError, match="only chefer2021 takes it"):
        rel.resolve_start_layer(1, ("chefer", "random"), 3)
    with pytest.raises(rel.StartLayerError, match="0..2"):
        rel.resolve_start_layer(3, ("chefer2021",), 3)
    import numpy as np

    assert rel.check_start_layer(np.int64(2), 3) == 2 and type(rel.check_start_layer(np.int64(2), 3)) is int


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
def test_every_family_gets_both_lrp_maps_batch_or_alone(name, monkeypatch):
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
    # chefer2021 alone takes dy/dA_l from a gradient pass over its own rules' graph; beside a
    # gradient method it takes them from the forward that keeps the maps: the same numbers
    mixed = relevance(lm, x, None, ["chefer2021", "grad_attention", "attnlrp"])
    # attnlrp stops its backward at the patch embedding's output where it can; at the pixels
    # (gradient x input summed per patch) it is the same map
    assert rel.patch_conv(lm, hw) is not None
    monkeypatch.setattr(rel, "patch_conv", lambda lm, hw: None)
    at_pixels = relevance(lm, x, None, ["attnlrp"])
    for b in range(2):
        for m in ("chefer2021", "attnlrp"):
            torch.testing.assert_close(mixed[b].maps[m], both[b].maps[m], rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(at_pixels[b].maps["attnlrp"], both[b].maps["attnlrp"], rtol=1e-4, atol=1e-6)
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


def _dense_alpha_beta(m: torch.Tensor, x: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """Alpha-beta (alpha 1) through a linear map given as its dense matrix ``m`` [out, in]: the
    positive inputs through the positive entries and the negative through the negative."""
    px, nx = x.clamp(min=0), x.clamp(max=0)
    mp, mn = m.clamp(min=0), m.clamp(max=0)
    contrib = px[None, :] * mp + nx[None, :] * mn  # out, in
    z = contrib.sum(1)
    s = torch.where(z == 0, torch.zeros_like(z), r / (z + 1e-9))
    return (contrib * s[:, None]).sum(0)


@pytest.mark.parametrize("padding", [1, "same"])  # "same": the rules take autograd's path, not the adjoint
def test_the_convolution_rules_equal_dense_alpha_beta_and_the_gradient_pass_is_the_gradient(padding):
    """The decoder's layers (a transposed convolution, a ReLU, a convolution whose input has no
    negative part) under the rules: the relevance equals alpha-beta applied to each layer's dense
    matrix (a convolution's matrix entries are its weights, so its positive part is the positive
    weights' matrix), and the gradient pass equals plain autograd."""
    from headscope.engine.lrp import RelevanceMode

    torch.manual_seed(3)
    up = torch.nn.ConvTranspose2d(4, 3, kernel_size=4, stride=2, padding=1).double()
    conv = torch.nn.Conv2d(3, 2, kernel_size=3, padding=padding).double()
    x = torch.randn(1, 4, 3, 3, dtype=torch.float64)
    r_out = torch.rand(1, 2, 6, 6, dtype=torch.float64)

    def net(t):
        return conv(torch.relu(up(t)))

    with torch.no_grad():
        h = torch.relu(up(x))
    m_up = torch.autograd.functional.jacobian(lambda t: up(t) - up.bias[:, None, None], x).reshape(h.numel(), x.numel())
    m_conv = torch.autograd.functional.jacobian(lambda t: conv(t) - conv.bias[:, None, None], h).reshape(
        r_out.numel(), h.numel()
    )
    r_h = _dense_alpha_beta(m_conv, h.flatten(), r_out.flatten())  # the ReLU passes relevance unchanged
    want = _dense_alpha_beta(m_up, x.flatten(), r_h)
    got = {}
    for gradient in (False, True):
        xg = x.clone().requires_grad_(True)
        mode = RelevanceMode("chefer2021", gradient_pass=gradient)
        with mode:
            out = net(xg)
        mode.gradient = gradient
        (got[gradient],) = torch.autograd.grad(out, xg, r_out)
    assert (h >= 0).all() and (x < 0).any()
    torch.testing.assert_close(got[False].flatten(), want, rtol=1e-10, atol=1e-12)
    xg = x.clone().requires_grad_(True)
    (plain,) = torch.autograd.grad(net(xg), xg, r_out)
    torch.testing.assert_close(got[True], plain, rtol=1e-12, atol=1e-14)


def test_attnlrp_falls_back_to_the_pixels_when_the_patch_convolution_does_not_run_as_found(vit, monkeypatch):
    """A patch embedding that runs with another kernel than the module's own (a resampled one)
    is never the graph's leaf: the map is then computed at the pixels, the same map."""
    import copy

    lm, x = vit
    want = relevance(lm, x, "top", ["attnlrp"])
    other = copy.deepcopy(lm.model.patch_embed.proj)  # same numbers, not the weight the model runs
    monkeypatch.setattr(rel, "patch_conv", lambda lm, hw: other)
    got = relevance(lm, x, "top", ["attnlrp"])
    for b in range(2):
        torch.testing.assert_close(got[b].maps["attnlrp"], want[b].maps["attnlrp"], rtol=1e-4, atol=1e-6)


def test_no_graph_outlives_its_call(vit, monkeypatch):
    """The rules' graph is freed when the call returns: the functions keep the mode's flags, not
    the mode (which keeps the maps, whose graph would keep the functions: a cycle never freed)."""
    import gc
    import weakref

    from headscope.engine import lrp

    made: list[weakref.ref] = []

    class Recorded(lrp.RelevanceMode):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(weakref.ref(self))

    monkeypatch.setattr(lrp, "RelevanceMode", Recorded)
    lm, x = vit
    for methods in (["chefer2021"], ["chefer2021", "attnlrp", "chefer"], ["attnlrp"]):
        made.clear()
        relevance(lm, x, "top", methods)
        gc.collect()
        assert made and not [r for r in made if r() is not None], methods


_W, _B = torch.linspace(-2, 2, 8), torch.linspace(0.5, -0.5, 8)


_IDENTITY_RULES = {
    "layer_norm": lambda t: torch.nn.functional.layer_norm(t, (t.shape[-1],), _W, _B, 1e-6),
    "LayerNorm": lambda t: torch.nn.LayerNorm(t.shape[-1], eps=1e-6)(t),  # the module: F.layer_norm's keywords
    "layer_norm_plain": lambda t: torch.nn.functional.layer_norm(t, (t.shape[-1],)),
    "gelu": lambda t: torch.nn.functional.gelu(t),
    "gelu_tanh": lambda t: torch.nn.functional.gelu(t, approximate="tanh"),
    "softmax": lambda t: t.softmax(-1),
    "F.softmax": lambda t: torch.nn.functional.softmax(t, dim=-1),
    "mul": lambda t: t * _W,  # LayerScale
    "div": lambda t: t / 3.0,
    "broadcast": lambda t: t * torch.ones(2, 1, 1),  # a scaling that broadcasts: autograd sums it back
}


@pytest.mark.parametrize("name", list(_IDENTITY_RULES))
def test_the_identity_rules_derivatives_are_autograd_s_own_bit_for_bit(name):
    """The rules that pass relevance unchanged answer the gradient pass with the derivative
    written out (the kernel autograd's own backward runs, from what the forward kept): the
    same bits as autograd of the plain function, and the relevance passes unchanged."""
    from headscope.engine.lrp import RelevanceMode

    fn = _IDENTITY_RULES[name]
    torch.manual_seed(5)
    x = torch.randn(1, 5, 8) * 3
    g = torch.randn(torch.broadcast_shapes(fn(x).shape))
    xg = x.clone().requires_grad_(True)
    (want,) = torch.autograd.grad(fn(xg), xg, g)
    for gradient in (True, False):
        xg = x.clone().requires_grad_(True)
        mode = RelevanceMode("chefer2021", gradient_pass=True)
        with mode:
            out = fn(xg)
        assert torch.equal(out, fn(x))
        written_out = out.grad_fn.derivative is not None  # the broadcast alone computes fn again
        assert written_out == (out.shape == x.shape)
        mode.gradient = gradient
        (got,) = torch.autograd.grad(out, xg, g)
        if gradient:
            assert torch.equal(got, want)
        elif got.shape == g.shape:
            assert torch.equal(got, g)  # the identity rule


def test_a_dropout_that_drops_nothing_is_its_input_under_both_rules():
    """timm's ``Dropout(0)`` in evaluation returns its input: under the rules too, with no node
    in the graph (each was a node in both passes and an operator in the forward)."""
    from headscope.engine.lrp import RelevanceMode

    x = torch.randn(2, 3).requires_grad_(True)
    h = x * 2
    for rules in ("chefer2021", "attnlrp"):
        with RelevanceMode(rules):
            assert torch.nn.Dropout(0.0).eval()(h) is h
            assert torch.nn.Dropout(0.3).eval()(h) is h
            assert torch.nn.functional.dropout(h, 0.0, True) is h
            assert torch.nn.Dropout(0.5).train()(h) is not h  # a dropout that drops is left to its rule


def test_chefer2021_dispatches_at_most_400_operators_a_layer():
    """On a GPU the CVPR 2021 rule is bound by the host's dispatch (24x a forward at batch 8 on
    an H100), so what a layer dispatches is its cost: a forward under the rules and two
    backwards. Written-out derivatives for the identity rules, no dropout nodes and the Add
    rule's per-picture shares in one pass: 375 a layer here, where it was 445."""
    from helpers.dispatch import dispatched

    _, arch, kwargs, classes, hw = FAMILY["vit"]
    x = torch.randn(2, 3, *hw)
    counts = {}
    for depth in (2, 4):
        lm = load_family(arch, dict(kwargs, depth=depth), classes)
        relevance(lm, x, "top", ["chefer2021"])  # warm
        counts[depth] = dispatched(lambda lm=lm: relevance(lm, x, "top", ["chefer2021"]))
    per_layer = (counts[4] - counts[2]) / 2
    assert per_layer <= 400, counts
