"""Device and precision choices (the GPU paths, tested without a GPU)."""

from __future__ import annotations

import pytest
import torch

from headscope.engine.device import autocast_dtype, is_oom, resolve_device


def test_auto_picks_cpu_here_and_cpu_is_fp32():
    if not torch.cuda.is_available():
        assert resolve_device("auto").type in ("cpu", "mps")
    assert autocast_dtype("cpu", "auto") is None
    assert autocast_dtype("mps", "auto") is None


def test_cuda_autocast_prefers_bf16_when_supported():
    assert autocast_dtype("cuda", "auto", bf16_supported=True) is torch.bfloat16
    assert autocast_dtype("cuda", "auto", bf16_supported=False) is torch.float16
    assert autocast_dtype("cuda", "fp32") is None
    assert autocast_dtype("cpu", "bf16") is torch.bfloat16


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error without a GPU")
def test_asking_for_missing_cuda_is_a_clear_error():
    with pytest.raises(ValueError, match="CUDA is not available"):
        resolve_device("cuda:0")


def test_bad_device_and_precision():
    with pytest.raises(ValueError):
        resolve_device("tpu")
    with pytest.raises(ValueError):
        autocast_dtype("cuda", "int8")


def test_oom_detection():
    assert is_oom(torch.cuda.OutOfMemoryError("CUDA out of memory"))
    assert is_oom(RuntimeError("MPS backend out of memory"))
    assert not is_oom(RuntimeError("shape mismatch"))


def test_bf16_autocast_capture_stays_close_to_fp32():
    """The reduced-precision path (as on a GPU) runs on CPU too; its error is bounded."""
    from headscope.engine.block_capture import AttentionCapture
    from headscope.engine.device import autocast
    from helpers.models import make

    model = make("vit_small_patch16_224", dict(depth=2, embed_dim=64, num_heads=4, img_size=64))
    cap = AttentionCapture(model)
    x = torch.randn(1, 3, 64, 64)
    with torch.inference_mode(), cap.capturing():
        model.forward_features(x)
    ref = cap.results()[0]
    with torch.inference_mode(), autocast("cpu", torch.bfloat16), cap.capturing():
        model.forward_features(x)
    low = cap.results()[0]
    assert low.q[0].dtype == torch.bfloat16
    for layer in range(2):
        got = low.rows(layer)
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, ref.rows(layer), atol=0.05, rtol=0)
