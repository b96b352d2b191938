"""Head importance: the exact sweep equals removing each head in a whole forward; the gradient
method equals finite differences of its loss; the pruning curve's order and steps."""

from __future__ import annotations

import pytest
import timm
import torch
from safetensors.torch import save_file

from headscope.engine import importance as imp
from headscope.engine.output import change, class_names, describe, describe_change, kl_divergence
from headscope.zoo import loaders
from headscope.zoo.ids import ModelSpec
from helpers.server import ROOT


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    """``local:test_vit@…`` with a 1000-class head (random weights saved to a file)."""
    torch.manual_seed(3)
    model = timm.create_model("test_vit", pretrained=False)
    with torch.no_grad():
        model.head.weight.mul_(50)  # a confident head: the top class is clear
    path = tmp_path_factory.mktemp("w") / "test_vit_head.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return loaders.load_local(ModelSpec.parse(f"local:test_vit@{path}"))


@pytest.fixture(scope="module")
def embedder():
    return loaders.load_random(ModelSpec.parse("random:vit_small_patch16_224"), depth=3, embed_dim=64, num_heads=4)


@pytest.fixture(scope="module")
def saliency():
    return loaders.load_embedded(ROOT / "models")


def pixels(lm, seed=0):
    torch.manual_seed(seed)
    return torch.randn(1, 3, *lm.input_size)


def naive(lm, x, layer):
    """Each head of ``layer`` removed in a whole forward of its own."""
    outs = imp.masked_outputs(lm, x, [()] + [((layer, h),) for h in range(lm.num_heads)])
    return change(lm.output_kind, outs[:1], outs[1:]), outs


def test_output_kinds(classifier, embedder, saliency):
    assert (classifier.output_kind, embedder.output_kind, saliency.output_kind) == ("classes", "embedding", "saliency")
    labels, desc = class_names(classifier.model)
    assert labels[1] == "goldfish" and desc[1].startswith("goldfish, Carassius auratus")


@pytest.mark.parametrize("which", ["classifier", "embedder"])
def test_sweep_equals_removing_each_head_in_a_whole_forward(which, request):
    lm = request.getfixturevalue(which)
    x = pixels(lm)
    base = imp.baseline(lm, x)
    for layer in range(lm.num_layers):
        got = imp.sweep_block(lm, base, layer)
        want, outs = naive(lm, x, layer)
        torch.testing.assert_close(got["change"], want, atol=2e-5, rtol=1e-4)
        if lm.output_kind == "classes":
            torch.testing.assert_close(got["kl"], kl_divergence(outs[:1], outs[1:]), atol=2e-5, rtol=1e-4)
    assert torch.stack([imp.sweep_block(lm, base, la)["change"] for la in range(lm.num_layers)]).abs().max() > 1e-4


@pytest.mark.parametrize("layer", [0, 5, 11])
def test_sweep_of_the_default_model_equals_whole_forwards(saliency, layer):
    x = pixels(saliency, 1)[..., :224, :]  # 224 x 224
    base = imp.baseline(saliency, x)
    got = imp.sweep_block(saliency, base, layer)["change"]
    want, _ = naive(saliency, x, layer)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-4)
    assert got.shape == (6,) and (got > 0).all()


def test_the_sweep_leaves_the_model_as_it_was(embedder):
    x = pixels(embedder)
    before = imp.masked_outputs(embedder, x, [()])
    base = imp.baseline(embedder, x)
    imp.sweep_block(embedder, base, 1)
    for m in embedder.model.modules():
        assert "forward" not in vars(m) and not m._forward_pre_hooks
    torch.testing.assert_close(imp.masked_outputs(embedder, x, [()]), before, atol=0, rtol=0)


def finite_difference(lm, x, layer, head, loss_of, eps=1e-2):
    def loss(value):
        gates = {layer: torch.ones(lm.num_heads)}
        gates[layer][head] = value
        from headscope.engine.ablation import heads_masked

        with torch.no_grad(), heads_masked(lm.model, gates):
            out = imp.head_output(lm, lm.model.forward_features(x), tuple(x.shape[-2:]))
        return float(loss_of(out))

    return (loss(1 + eps) - loss(1 - eps)) / (2 * eps)


@pytest.mark.parametrize("which", ["classifier", "embedder", "saliency"])
def test_gradient_importance_equals_finite_differences(which, request):
    lm = request.getfixturevalue(which)
    x = pixels(lm, 2)
    grad, loss = imp.gradient_importance(lm, x)
    assert grad.shape == (lm.num_layers, lm.num_heads) and (grad >= 0).all()
    base = imp.masked_outputs(lm, x, [()])
    # the loss with the unablated model's own decisions held fixed, as the method defines it
    if lm.output_kind == "saliency":
        target = (base > 0.5).float()
        loss_of = lambda out: torch.nn.functional.binary_cross_entropy(out.clamp(1e-6, 1 - 1e-6), target)  # noqa: E731
    elif lm.output_kind == "classes":
        top = int(base[0].argmax())
        loss_of = lambda out: -out[0, top]  # noqa: E731
    else:
        loss_of = lambda out: out.norm(dim=-1).sum()  # noqa: E731
    assert loss == pytest.approx(float(loss_of(base)), rel=1e-4)
    picks = [(0, 0), (lm.num_layers - 1, lm.num_heads - 1), (lm.num_layers // 2, 1)]
    for layer, head in picks:
        fd = finite_difference(lm, x, layer, head, loss_of)
        assert grad[layer, head].item() == pytest.approx(abs(fd), rel=5e-2, abs=1e-4), (layer, head)


def test_classes_output_and_change(classifier):
    x = pixels(classifier)
    base, out = imp.masked_outputs(classifier, x, [(), tuple((la, 0) for la in range(classifier.num_layers))])
    d = describe(classifier, base)
    assert len(d["top5"]) == 5 and d["top5"][0]["label"] and d["probabilities"].shape == (1000,)
    assert sum(d["probabilities"]) == pytest.approx(1.0, abs=1e-4)
    probs = [c["probability"] for c in d["top5"]]
    assert probs == sorted(probs, reverse=True) and probs[0] == pytest.approx(float(base.exp().max()), rel=1e-6)
    ch = describe_change(classifier, base, out)
    top = int(base.argmax())
    assert ch["top1_before"]["index"] == top and ch["top1_after"]["index"] == int(out.argmax())
    assert ch["top1_logprob_drop"] == pytest.approx(float(base[top] - out[top]), rel=1e-5)
    assert ch["kl"] == pytest.approx(float((base.exp() * (base - out)).sum()), rel=1e-5) and ch["kl"] > 0


def test_embedding_output_and_change(embedder):
    x = pixels(embedder)
    base, out = imp.masked_outputs(embedder, x, [(), ((0, 0), (2, 3))])
    d = describe(embedder, base)
    assert d["dim"] == 64 and d["norm"] == pytest.approx(float(base.norm()), rel=1e-6)
    ch = describe_change(embedder, base, out)
    assert ch["relative_l2"] == pytest.approx(float((out - base).norm() / base.norm()), rel=1e-5)
    assert ch["norm_after"] == pytest.approx(float(out.norm()), rel=1e-6)


def test_pruning_order_steps_and_rank_correlation():
    imp_ = torch.tensor([[0.3, 0.1], [0.2, 0.1]])
    assert imp.pruning_order(imp_) == [(0, 1), (1, 1), (1, 0), (0, 0)]
    assert imp.pruning_steps(4, 25) == [0, 1, 2, 3, 4]
    steps = imp.pruning_steps(72, 25)
    assert steps[0] == 0 and steps[-1] == 72 and len(steps) == 25 and steps == sorted(set(steps))
    a = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert imp.spearman(a, a * 10) == pytest.approx(1.0)
    assert imp.spearman(a, -a) == pytest.approx(-1.0)
    assert imp.spearman(a, torch.tensor([1.0, 3.0, 2.0, 4.0])) == pytest.approx(0.8)
    assert imp.spearman(torch.tensor([1.0, 1.0, 2.0]), torch.tensor([1.0, 2.0, 3.0])) == pytest.approx(0.8660254)
