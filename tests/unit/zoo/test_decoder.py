"""The default model's own output (the saliency decoder) equals the ONNX graph's
``output_importance``, unablated and with heads removed; the decoder is added to old conversions."""

from __future__ import annotations

import hashlib
import json
import shutil

import numpy as np
import pytest
import torch

from headscope.config import Settings
from headscope.engine.importance import masked_outputs
from headscope.engine.output import change, describe, describe_change
from headscope.serving.pictures import Pictures
from headscope.zoo import embedded, loaders
from helpers.server import ROOT, SAMPLES

MODELS = ROOT / "models"
LAYERS, HEADS = 12, 6


@pytest.fixture(scope="module")
def lm():
    return loaders.load_embedded(MODELS)


@pytest.fixture(scope="module")
def onnx_model():
    pytest.importorskip("onnxruntime")
    import onnx

    wheel = (MODELS / "_downloads" / embedded.WHEEL_NAME).read_bytes()
    model = onnx.load_from_string(embedded.read_onnx(wheel))
    dims = model.graph.input[0].type.tensor_type.shape.dim
    dims[2].dim_param, dims[3].dim_param = "height", "width"  # the graph itself is size-agnostic
    return model


def with_head_mask(model, ablate: list[tuple[int, int]]):
    """A copy of the graph whose heads' outputs (``MatMul_1_output_0``, ``[B, H, N, d]``) are
    multiplied by a ``[1, H, 1, 1]`` mask before the heads are concatenated (``Transpose_3``)."""
    import onnx
    from onnx import helper, numpy_helper

    g = onnx.ModelProto()
    g.CopyFrom(model)
    for layer in sorted({la for la, _ in ablate}):
        mask = np.ones((1, HEADS, 1, 1), np.float32)
        for la, h in ablate:
            if la == layer:
                mask[0, h] = 0.0
        prefix = f"/backbone/encoder/layer.{layer}/attention/attention/"
        src, dst = prefix + "MatMul_1_output_0", prefix + "MatMul_1_masked"
        consumers = [n for n in g.graph.node if src in n.input]
        assert [n.name for n in consumers] == [prefix + "Transpose_3"], consumers
        for n in consumers:
            n.input[list(n.input).index(src)] = dst
        g.graph.initializer.append(numpy_helper.from_array(mask, f"head_mask_{layer}"))
        mul = helper.make_node("Mul", [src, f"head_mask_{layer}"], [dst], name=f"head_mask_mul_{layer}")
        nodes = list(g.graph.node)
        nodes.insert(nodes.index(consumers[0]), mul)  # the graph stays topologically sorted
        del g.graph.node[:]
        g.graph.node.extend(nodes)
    onnx.checker.check_model(g)
    return g


def run_onnx(model, x: torch.Tensor) -> np.ndarray:
    import onnxruntime as ort

    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(["output_importance"], {"input_image": x.numpy()})[0][:, 0]  # B, H, W


def photo(lm, name: str) -> torch.Tensor:
    return Pictures.for_model(lm, Settings()).prepare((SAMPLES / name).read_bytes()).pixels[None]


def test_the_default_model_predicts_saliency(lm):
    assert lm.output_kind == "saliency" and lm.decoder is not None and lm.output_note == ""
    assert lm.info()["output"] == "saliency"
    assert not any(p.requires_grad for p in lm.decoder.parameters())


@pytest.mark.parametrize("hw", [(224, 224), (224, 336)], ids=["square", "aspect"])
def test_output_equals_the_onnx_graph(lm, onnx_model, hw):
    torch.manual_seed(0)
    x = torch.randn(2, 3, *hw)
    ref = run_onnx(onnx_model, x)
    got = torch.cat([masked_outputs(lm, x[i : i + 1], [()]) for i in range(2)]).numpy()
    assert got.shape == ref.shape == (2, *hw)
    np.testing.assert_allclose(got, ref, atol=1e-4, rtol=0)
    assert got.min() >= 0 and got.max() <= 1


@pytest.fixture(scope="module")
def cat_plain(lm, onnx_model):
    x = photo(lm, "cat.png")  # 224 x 336
    return x, run_onnx(onnx_model, x)


@pytest.mark.parametrize(
    "ablate",
    [[(11, 0)], [(0, 1)], [(3, 0), (3, 1), (7, 5)], [(layer, h) for layer in range(0, 12, 2) for h in range(3)]],
    ids=["11:0", "0:1", "three", "half-the-layers"],
)
def test_ablated_output_equals_the_onnx_graph_with_a_head_mask(lm, onnx_model, cat_plain, ablate):
    x, plain = cat_plain
    ref = run_onnx(with_head_mask(onnx_model, ablate), x)
    base, got = masked_outputs(lm, x, [(), tuple(ablate)])
    np.testing.assert_allclose(got.numpy(), ref[0], atol=1e-4, rtol=0)
    np.testing.assert_allclose(base.numpy(), plain[0], atol=1e-4, rtol=0)
    # the removal is real: the output moves by far more than the tolerance
    assert float(np.abs(ref[0] - plain[0]).mean()) > 1e-3
    assert float(change("saliency", base[None], got[None])[0]) == pytest.approx(
        float(np.abs(ref[0] - plain[0]).mean()), abs=1e-5
    )


def test_describe_saliency(lm):
    x = photo(lm, "coffee.png")
    base, out = masked_outputs(lm, x, [(), ((11, 0),)])
    arr = describe(lm, out)
    assert arr.shape == tuple(x.shape[-2:])
    ch = describe_change(lm, base, out)
    assert ch["metric"] == "mean_abs_diff"
    assert ch["mean_abs_diff"] == pytest.approx(float((out - base).abs().mean()), rel=1e-6)
    assert ch["max_abs_diff"] >= ch["mean_abs_diff"] > 0


@pytest.fixture
def old_conversion(tmp_path):
    """A models dir converted before the decoder existed: backbone + manifest, cached wheel."""
    src = embedded.model_dir(MODELS)
    dst = embedded.model_dir(tmp_path)
    dst.mkdir(parents=True)
    shutil.copy(src / "model.safetensors", dst / "model.safetensors")
    manifest = json.loads((src / "manifest.json").read_text())
    manifest.pop("decoder", None)
    (dst / "manifest.json").write_text(json.dumps(manifest))
    return tmp_path


def test_an_old_conversion_gets_the_decoder_on_first_use_backbone_untouched(old_conversion, monkeypatch):
    (old_conversion / "_downloads").mkdir()
    wheel = MODELS / "_downloads" / embedded.WHEEL_NAME
    (old_conversion / "_downloads" / embedded.WHEEL_NAME).symlink_to(wheel)

    def no_network(*a, **k):
        raise AssertionError("the cached wheel must be used")

    monkeypatch.setattr(embedded.subprocess, "run", no_network)
    d = embedded.model_dir(old_conversion)
    before = hashlib.sha256((d / "model.safetensors").read_bytes()).hexdigest()
    assert not embedded.has_decoder(old_conversion)
    lm = loaders.load_embedded(old_conversion)
    assert lm.output_kind == "saliency"
    assert embedded.has_decoder(old_conversion)
    manifest = json.loads((d / "manifest.json").read_text())
    data = (d / embedded.DECODER_FILE).read_bytes()
    assert manifest["decoder"]["file"] == embedded.DECODER_FILE
    assert manifest["decoder"]["sha256"] == hashlib.sha256(data).hexdigest()
    assert hashlib.sha256((d / "model.safetensors").read_bytes()).hexdigest() == before
    # The decoder lives in its own file: code that knows nothing of it still loads the backbone.
    from safetensors import safe_open

    with safe_open(str(d / "model.safetensors"), "pt") as f:
        names = list(f.keys())  # noqa: SIM118 (safe_open has no __iter__)
    assert names and not any(k.startswith(("decoder", "upconv", "bn", "final_conv")) for k in names)
    torch.manual_seed(0)
    x = torch.randn(1, 3, 224, 224)
    ref = masked_outputs(loaders.load_embedded(MODELS), x, [()])
    torch.testing.assert_close(masked_outputs(lm, x, [()]), ref, atol=0, rtol=0)


def test_an_old_conversion_offline_without_the_wheel_still_serves_attention(old_conversion, monkeypatch):
    def offline(*a, **k):
        import subprocess

        return subprocess.CompletedProcess(a, 1, "", "network unreachable")

    monkeypatch.setattr(embedded.subprocess, "run", offline)
    lm = loaders.load_embedded(old_conversion)
    assert lm.decoder is None and lm.output_kind == "embedding"
    assert "saliency decoder could not be added" in lm.output_note and "headscope fetch" in lm.output_note
    assert not embedded.has_decoder(old_conversion)
