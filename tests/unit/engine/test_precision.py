"""Precision: fp32 means fp32 (TF32 off while Headscope computes, the caller's flags given back),
fp32 the default everywhere, and every answer says its precision. The flags exist on CPU-only
builds too, so this runs without a GPU."""

from __future__ import annotations

import asyncio

import pytest
import torch

from headscope.config import Settings
from headscope.engine.device import autocast_dtype, exact_fp32, precision_name, tf32_flags
from headscope.serving.worker import Worker


@pytest.fixture
def user_flags():
    """A user who turned TF32 on everywhere; the flags as they were come back afterwards."""
    saved = tf32_flags()
    torch.set_float32_matmul_precision("high")
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    yield (True, True, "high")
    torch.set_float32_matmul_precision(saved[2])
    torch.backends.cuda.matmul.allow_tf32 = saved[0]
    torch.backends.cudnn.allow_tf32 = saved[1]


def test_exact_fp32_turns_tf32_off_and_gives_the_users_flags_back(user_flags):
    assert tf32_flags() == user_flags
    with exact_fp32():
        assert tf32_flags() == (False, False, "highest")
        with exact_fp32():  # nested: still off, and the outer scope's state after
            assert tf32_flags() == (False, False, "highest")
        assert tf32_flags() == (False, False, "highest")
    assert tf32_flags() == user_flags


def test_the_flags_come_back_after_an_error_too(user_flags):
    with pytest.raises(KeyError), exact_fp32():
        raise KeyError("boom")
    assert tf32_flags() == user_flags


def test_the_python_api_computes_without_tf32_and_restores_the_flags(user_flags, tmp_path):
    import numpy as np

    import headscope

    scope = headscope.load("random:test_vit", device="cpu", models_dir=tmp_path)
    seen: list[tuple] = []
    hook = scope.model.blocks[0].register_forward_pre_hook(lambda m, a: seen.append(tf32_flags()))
    try:
        att = scope.attention(np.zeros((32, 32, 3), np.uint8))
    finally:
        hook.remove()
    assert seen == [(False, False, "highest")]
    assert tf32_flags() == user_flags
    assert att.precision == "fp32" and att.meta["precision"] == "fp32"
    assert set(att.stats()["precision"]) == {"fp32"}


def test_the_worker_runs_its_calls_without_tf32(user_flags):
    w = Worker(torch.device("cpu"))
    assert w.precision == "fp32"
    got = asyncio.run(w.run_in_worker(tf32_flags))
    assert got == (False, False, "highest") and tf32_flags() == user_flags


def test_fp32_is_the_default_everywhere_and_names_are_short():
    assert Settings().precision == "fp32"
    assert Worker(torch.device("cpu")).amp_dtype is None
    assert autocast_dtype("cuda", Settings().precision) is None
    assert [precision_name(d) for d in (None, torch.float32, torch.bfloat16, torch.float16)] == [
        "fp32",
        "fp32",
        "bf16",
        "fp16",
    ]
    assert Worker(torch.device("cpu"), "bf16").precision == "bf16"


def test_batching_defaults_per_device():
    s = Settings()
    assert s.batching("cpu") == (s.max_batch_size, s.max_wait_ms) == (8, 5.0)
    assert s.batching("cuda") == (s.cuda_max_batch_size, s.cuda_max_wait_ms)
    assert s.cuda_max_batch_size > s.max_batch_size
