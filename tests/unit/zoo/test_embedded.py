"""The embedded default model equals the original ONNX graph, Softmax by Softmax."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from headscope.engine.forward import forward_capture
from headscope.serving import preprocess
from headscope.zoo import embedded, loaders
from helpers.server import ROOT, SAMPLES

MODELS = ROOT / "models"


@pytest.fixture(scope="module")
def lm():
    return loaders.load_embedded(MODELS)


@pytest.fixture(scope="module")
def onnx_session():
    ort = pytest.importorskip("onnxruntime")
    import onnx

    wheel = (MODELS / "_downloads" / embedded.WHEEL_NAME).read_bytes()
    model = onnx.load_from_string(embedded.read_onnx(wheel))
    names = [f"/backbone/encoder/layer.{i}/attention/attention/Softmax_output_0" for i in range(12)]
    for n in names:
        model.graph.output.append(onnx.helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, None))
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess, names


def test_manifest_and_weights_outside_git(lm):
    d = embedded.model_dir(MODELS)
    manifest = json.loads((d / "manifest.json").read_text())
    assert manifest["wheel_sha256"] == embedded.WHEEL_SHA256
    assert manifest["licence"].startswith("MIT")
    assert manifest["input_size"] == [224, 224] and manifest["patch_size"] == [14, 14]
    assert (lm.num_layers, lm.num_heads, lm.prefix) == (12, 6, ["cls"])
    import subprocess

    tracked = subprocess.run(["git", "ls-files", "models"], cwd=ROOT, capture_output=True, text=True).stdout
    assert ".safetensors" not in tracked and ".whl" not in tracked


def test_fetch_is_offline_after_first_download(monkeypatch):
    def no_network(*a, **k):
        raise AssertionError("fetch tried to download although the model is converted")

    monkeypatch.setattr(embedded.subprocess, "run", no_network)
    assert embedded.fetch(MODELS) == embedded.model_dir(MODELS)


def _capture(lm, x):
    return forward_capture(lm, x)


def test_every_layer_and_head_equals_the_onnx_softmax(lm, onnx_session):
    sess, names = onnx_session
    torch.manual_seed(0)
    x = torch.randn(2, 3, 224, 224)
    ref = sess.run(names, {"input_image": x.numpy()})
    res = _capture(lm, x)
    for layer in range(12):
        mine = torch.stack([r.rows(layer) for r in res]).numpy()  # B, H, N, N
        assert mine.shape == (2, 6, 257, 257)
        np.testing.assert_allclose(mine, ref[layer], atol=1e-4, rtol=0)
        np.testing.assert_allclose(mine.sum(-1), 1.0, atol=1e-5)


def test_a_224_photo_goes_through_unchanged_and_matches_onnx(lm, onnx_session):
    sess, names = onnx_session
    img = Image.open(SAMPLES / "astronaut.png").convert("RGB").resize((224, 224), Image.BICUBIC)
    prep = preprocess.prepare(img, lm.input_size, lm.patch_size, lm.mean, lm.std)
    assert prep.input_size == (224, 224)
    direct = (np.asarray(img, np.float32) / 255 - np.array(lm.mean, np.float32)) / np.array(lm.std, np.float32)
    np.testing.assert_array_equal(prep.pixels.numpy(), direct.transpose(2, 0, 1))
    ref = sess.run(names, {"input_image": prep.pixels[None].numpy()})
    res = _capture(lm, prep.pixels[None])[0]
    for layer in range(12):
        np.testing.assert_allclose(res.rows(layer).numpy(), ref[layer][0], atol=1e-4, rtol=0)


def test_position_table_is_resampled_without_antialias(lm):
    """At other grids the table follows the original graph's bicubic, antialias-free resize."""
    m = lm.model
    x = torch.zeros(1, 20, 30, 384)
    got = m._pos_embed(x)[0, 1:]  # patch positions (x is zero, so this is the table)
    table = m.pos_embed[:, 1:].reshape(1, 37, 37, 384).permute(0, 3, 1, 2)
    want = F.interpolate(table, size=(20, 30), mode="bicubic", align_corners=False, antialias=False)
    torch.testing.assert_close(got, want.permute(0, 2, 3, 1).reshape(600, 384), atol=1e-6, rtol=0)
    timm_aa = F.interpolate(table, size=(20, 30), mode="bicubic", align_corners=False, antialias=True)
    assert (timm_aa - want).abs().max() > 1e-3  # the distinction matters
