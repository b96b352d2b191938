"""CUDA against the CPU, fp32: the same numbers (issue 37). Skipped without CUDA.

The default model (the embedded DINOv2-S/14 with its saliency decoder) is loaded twice, on the
CPU and on the GPU, and every output kind is compared for the same pictures: the maps (<= 1e-5),
explain, relevance (<= 1e-4 of the map's maximum), the faithfulness curves, the statistics and
the ablation's importance. TF32 must be off while Headscope computes, and the user's flags must
be set back afterwards.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import headscope
from headscope.engine import device as device_module
from headscope.engine.device import reduced_fp32, tf32_flags

# HEADSCOPE_GPU_TESTS_DEVICE=cpu runs this module with the CPU as the "GPU" (CPU against CPU): a
# dry run of the test code itself on a machine without one (bench/gpu_run.sh DEVICE=cpu does).
DEVICE = os.environ.get("HEADSCOPE_GPU_TESTS_DEVICE", "cuda")
pytestmark = pytest.mark.skipif(DEVICE == "cuda" and not torch.cuda.is_available(), reason="needs a CUDA GPU")

SAMPLES = ["astronaut.png", "rocket.jpg"]


@pytest.fixture(scope="module")
def scopes():
    return headscope.load(device="cpu", precision="fp32"), headscope.load(device=DEVICE, precision="fp32")


@pytest.fixture(scope="module")
def pictures():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "static" / "samples"
    files = [root / n for n in SAMPLES if (root / n).exists()]
    if not files:  # no samples: two seeded pictures
        rng = np.random.default_rng(0)
        return [rng.integers(0, 256, (240, 320, 3), dtype=np.uint8) for _ in range(2)]
    return [f.read_bytes() for f in files]


def _close_rel(a: torch.Tensor, b: torch.Tensor, tol: float) -> float:
    err = float((a.float().cpu() - b.float().cpu()).abs().max() / b.float().abs().max().clamp_min(1e-30))
    assert err <= tol, f"{err:.2e} of the maximum > {tol:.0e}"
    return err


def test_maps_equal_the_cpu(scopes, pictures):
    cpu, gpu = scopes
    for layers in (None,):
        a = cpu.attention(pictures, query="all", layers=layers)
        b = gpu.attention(pictures, query="all", layers=layers)
        for x, y in zip(a, b):
            assert x.precision == y.precision == "fp32"
            err = float((x.maps - y.maps).abs().max())
            assert err <= 1e-5, err


def test_tensors_on_the_gpu_equal_the_bytes_path(scopes):
    _, gpu = scopes
    H, W = gpu.lm.input_size
    a = np.random.default_rng(3).integers(0, 256, (H, W, 3), dtype=np.uint8)
    from headscope.python.inputs import png_bytes

    t = torch.from_numpy(a).permute(2, 0, 1).contiguous().to(DEVICE)
    want = gpu.attention(png_bytes(a)).maps
    for pixels in (t, t.float() / 255.0):  # the float's levels made on the device (own_levels)
        assert torch.equal(gpu.attention(pixels).maps, want)


def test_a_batch_tensor_on_the_gpu_is_its_pictures(scopes):
    """A ``[B, 3, H, W]`` tensor on the device (copied to the host once, for the ids): each
    picture's id and maps are those it gets alone, and its maps those of its PNG bytes."""
    _, gpu = scopes
    H, W = gpu.lm.input_size
    from headscope.python.inputs import png_bytes

    levels = torch.from_numpy(np.random.default_rng(5).integers(0, 256, (3, 3, H, W), dtype=np.uint8))
    batch = gpu.attention(levels.to(DEVICE))
    for x, got in zip(levels, batch):
        alone = gpu.attention(x.to(DEVICE))
        assert got.meta["image_id"] == alone.meta["image_id"]
        assert float((got.maps - alone.maps).abs().max()) <= 1e-5
        assert float((got.maps - gpu.attention(png_bytes(x.permute(1, 2, 0).numpy())).maps).abs().max()) <= 1e-5


def test_pil_images_on_the_gpu_equal_the_bytes_path(scopes):
    from PIL import Image

    from headscope.python.inputs import png_bytes

    _, gpu = scopes
    rng = np.random.default_rng(4)
    rgba = Image.fromarray(rng.integers(0, 256, (300, 410, 4), dtype=np.uint8), "RGBA")
    for img in (rgba, rgba.convert("RGB"), rgba.convert("L")):
        assert torch.equal(gpu.attention(img).maps, gpu.attention(png_bytes(img)).maps)


def test_explain_equals_the_cpu(scopes, pictures):
    cpu, gpu = scopes
    a = cpu.attention(pictures[0]).explain(layer=5, head=2, query="patch:3,5")
    b = gpu.attention(pictures[0]).explain(layer=5, head=2, query="patch:3,5")
    for k, v in a.items():
        if isinstance(v, torch.Tensor):
            torch.testing.assert_close(b[k].cpu(), v, atol=1e-4, rtol=1e-4, msg=k)


@pytest.fixture(scope="module")
def nudged(scopes):
    """The CPU model with every weight moved by about one float32 rounding (x (1 + 1e-7 * noise)):
    how far a method's map moves under fp32 rounding alone, on the CPU, is its own floor."""
    scope = headscope.load(device="cpu", precision="fp32")
    assert scope.model is not scopes[0].model  # a model of its own
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in scope.model.parameters():
            p.mul_(1 + 1e-7 * torch.randn(p.shape, generator=g))
    return scope


@pytest.mark.parametrize("method", ["chefer", "grad_attention", "rollout", "attention", "chefer2021", "attnlrp"])
def test_relevance_equals_the_cpu(scopes, nudged, pictures, method):
    """<= 1e-4 of the map's maximum, or, for a map that fp32 rounding alone moves further on the
    CPU (the LRP rules divide by sums that nearly cancel: chefer2021 and attnlrp move by up to
    2e-2 of their maximum there when only the weights are rounded anew), within 10x that floor:
    CUDA rounds every product and sum differently, not only the weights (the second GPU run
    measured 3.0x and 3.6x the floor)."""
    cpu, gpu = scopes
    for pic in pictures:
        a, b = cpu.relevance(pic, method=method), gpu.relevance(pic, method=method)
        assert b["precision"] == "fp32"
        c = nudged.relevance(pic, method=method)["relevance"]
        floor = float((c - a["relevance"]).abs().max() / a["relevance"].abs().max().clamp_min(1e-30))
        _close_rel(b["relevance"], a["relevance"], max(1e-4, 10 * floor))
        assert b["y"] == pytest.approx(a["y"], rel=1e-4, abs=1e-6)


def test_faithfulness_curves_equal_the_cpu(scopes, pictures):
    cpu, gpu = scopes
    a = cpu.faithfulness(pictures[0], methods="chefer,attention,random", fractions=[0, 0.25, 0.5])
    b = gpu.faithfulness(pictures[0], methods="chefer,attention,random", fractions=[0, 0.25, 0.5])
    for m, ca in a["methods"].items():
        cb = b["methods"][m]
        for d in ("positive", "negative"):
            np.testing.assert_allclose(cb[d], ca[d], rtol=1e-3, atol=1e-5)


def test_statistics_equal_the_cpu(scopes, pictures):
    cpu, gpu = scopes
    a = cpu.attention(pictures[0]).stats()
    b = gpu.attention(pictures[0]).stats()
    for col in ("entropy", "entropy_cls", "distance_px", "prefix_mass", "artifact_mass"):
        np.testing.assert_allclose(b[col].to_numpy(float), a[col].to_numpy(float), rtol=1e-4, atol=1e-5)


def test_ablation_equals_the_cpu(scopes, pictures):
    cpu, gpu = scopes
    a = cpu.importance(pictures[0], method="ablation")["importance"]
    b = gpu.importance(pictures[0], method="ablation")["importance"]
    # An importance is a change of the output (0..1): near float32's resolution of the output
    # (a random backbone's heads change it by ~1e-8), compare in the output's units.
    err = float((b.cpu() - a).abs().max())
    assert err <= max(1e-4 * float(a.abs().max()), 1e-6), err
    oa, ob = cpu.output(pictures[0], ablate="2:1,5:0"), gpu.output(pictures[0], ablate="2:1,5:0")
    assert ob["precision"] == "fp32"
    _close_rel(ob["output"], oa["output"], 1e-4)
    for k, v in oa["change"].items():
        if isinstance(v, float):
            assert ob["change"][k] == pytest.approx(v, rel=1e-4, abs=1e-6), k


def test_tf32_is_off_while_computing_and_the_users_flags_come_back(scopes, pictures):
    _, gpu = scopes
    saved = tf32_flags()
    new_api = hasattr(torch.backends, "fp32_precision")
    saved_root = torch.backends.fp32_precision if new_api else None
    try:
        if new_api:  # torch >= 2.9: the per-backend settings (the older getters raise once used)
            torch.backends.fp32_precision = "tf32"
        else:
            torch.set_float32_matmul_precision("high")
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        user = tf32_flags()
        assert reduced_fp32()  # reduced somewhere (on a CPU dry run: oneDNN's settings)
        seen: list[list[str]] = []
        hooks = [
            gpu.model.blocks[0].register_forward_pre_hook(lambda m, a: seen.append(reduced_fp32())),
            # the patch embedding's convolution: cuDNN's TF32 setting, on by default
            gpu.model.patch_embed.register_forward_pre_hook(lambda m, a: seen.append(reduced_fp32())),
        ]
        try:
            gpu.attention(pictures[0])
            gpu.relevance(pictures[0], method="chefer")
        finally:
            for h in hooks:
                h.remove()
        assert seen and all(s == [] for s in seen)
        assert tf32_flags() == user
    finally:
        if new_api:
            # the root, then every operator as it was: exact_fp32 wrote the operators' own values,
            # which no longer follow the root (the root alone left TF32 on for later tests)
            torch.backends.fp32_precision = saved_root
            device_module._set_tf32_flags(saved)
        else:
            torch.set_float32_matmul_precision(saved[2])
            torch.backends.cuda.matmul.allow_tf32 = saved[0]
            torch.backends.cudnn.allow_tf32 = saved[1]


def test_bf16_says_so(scopes, pictures):
    lm = scopes[1].lm
    bf = headscope.load(lm, precision="bf16")
    att = bf.attention(pictures[0])
    assert att.precision == "bf16" and att.meta["precision"] == "bf16"
    assert bf.relevance(pictures[0])["precision"] == "bf16"
