"""Precision: fp32 means fp32 (TF32 and oneDNN's bf16 off while Headscope computes, the caller's
settings given back, a caller's autocast block kept out),
fp32 the default everywhere, and every answer says its precision. The flags exist on CPU-only
builds too, so this runs without a GPU."""

from __future__ import annotations

import asyncio

import pytest
import torch

from headscope.config import Settings
from headscope.engine import device
from headscope.engine.device import autocast_dtype, exact_fp32, precision_name, reduced_fp32, tf32_flags
from headscope.serving.worker import Worker

_LEVELS = (
    "",
    "cuda.matmul",
    "cudnn",
    "cudnn.conv",
    "cudnn.rnn",
    "mkldnn",
    "mkldnn.matmul",
    "mkldnn.conv",
    "mkldnn.rnn",
)
NEW_API = hasattr(torch.backends, "fp32_precision")


def _backend(name: str):
    obj = torch.backends
    for part in filter(None, name.split(".")):
        obj = getattr(obj, part)
    return obj


def _every_setting() -> list[str]:
    """Every level's ``fp32_precision`` (the root, the backends, the operators); [] on older torch."""
    return [_backend(n).fp32_precision for n in _LEVELS] if NEW_API else []


@pytest.fixture(params=["legacy", "per-backend"] if NEW_API else ["legacy"])
def user_flags(request):
    """A user who turned reduced-precision fp32 on, through torch's older switches (TF32 flags,
    ``set_float32_matmul_precision``) or its per-backend ``fp32_precision`` (torch >= 2.9: once
    used, the older getters raise); the settings as they were come back afterwards."""
    saved, saved_all = tf32_flags(), _every_setting()
    if request.param == "legacy":
        torch.set_float32_matmul_precision("medium")  # bf16 in oneDNN's fp32 matmuls, TF32 on CUDA
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    else:
        torch.backends.fp32_precision = "tf32"
        torch.backends.mkldnn.matmul.fp32_precision = "bf16"
    user = tf32_flags()
    assert reduced_fp32(), user  # the settings really are reduced
    yield user
    if NEW_API:
        for name, value in zip(_LEVELS, saved_all):
            _backend(name).fp32_precision = value
    else:
        torch.set_float32_matmul_precision(saved[2])
        torch.backends.cuda.matmul.allow_tf32 = saved[0]
        torch.backends.cudnn.allow_tf32 = saved[1]
    assert tf32_flags() == saved


def test_exact_fp32_turns_reduced_precision_off_and_gives_the_users_settings_back(user_flags):
    assert tf32_flags() == user_flags
    with exact_fp32():
        assert reduced_fp32() == []
        with exact_fp32():  # nested: still off, and the outer scope's state after
            assert reduced_fp32() == []
        assert reduced_fp32() == []
    assert tf32_flags() == user_flags


def test_the_flags_come_back_after_an_error_too(user_flags):
    with pytest.raises(KeyError), exact_fp32():
        raise KeyError("boom")
    assert tf32_flags() == user_flags


def test_calls_from_two_threads_share_one_exact_section(user_flags):
    """A call that ends while another thread's call still computes leaves fp32 exact for the
    other; the user's settings come back when the last ends. (Each call saved and gave back its
    own: the second saw exact settings and saved those, the first gave the user's bf16 back under
    the second's forward, whose maps were off by 0.09 and said fp32.)"""
    import threading

    inside, first_out, checked = threading.Event(), threading.Event(), []

    def second():
        with exact_fp32():
            inside.set()
            first_out.wait(30)
            checked.append(reduced_fp32())

    t = threading.Thread(target=second)
    with exact_fp32():
        t.start()
        assert inside.wait(30)
    first_out.set()  # the first call is out; the second still computes
    t.join(30)
    assert checked == [[]]
    assert tf32_flags() == user_flags


def test_a_call_coming_in_while_another_computes_makes_fp32_exact_again(user_flags):
    """The caller's code turned reduced precision back on while a call computed: the next call
    coming in makes fp32 exact again (only the first wrote it, so the second computed in bf16),
    and the caller's settings come back when the last ends."""
    import threading

    inside, go_on, checked = threading.Event(), threading.Event(), []

    def first():
        with exact_fp32():
            inside.set()
            go_on.wait(30)

    t = threading.Thread(target=first)
    t.start()
    assert inside.wait(30)
    device._set_tf32_flags(user_flags)  # the caller's own thread, meanwhile
    with exact_fp32():
        checked.append(reduced_fp32())
    go_on.set()
    t.join(30)
    assert checked == [[]]
    assert tf32_flags() == user_flags


@pytest.mark.skipif(not NEW_API, reason="torch without per-backend fp32_precision")
def test_settings_already_exact_are_not_written(monkeypatch):
    """A value torch sees written stays the user's (a later ``torch.backends.fp32_precision``
    would not reach it): where nothing is reduced, a call writes nothing."""
    before = _every_setting()
    written: list[str] = []
    monkeypatch.setattr(device, "_set_tf32_flags", lambda flags: written.append(flags))
    with exact_fp32():
        pass
    assert written == [] and _every_setting() == before


def test_the_python_api_computes_exactly_and_restores_the_flags(user_flags, tmp_path):
    import numpy as np

    import headscope

    scope = headscope.load("random:test_vit", device="cpu", models_dir=tmp_path)
    seen: list[list[str]] = []
    hook = scope.model.blocks[0].register_forward_pre_hook(lambda m, a: seen.append(reduced_fp32()))
    try:
        att = scope.attention(np.zeros((32, 32, 3), np.uint8))
    finally:
        hook.remove()
    assert seen == [[]]
    assert tf32_flags() == user_flags
    assert att.precision == "fp32" and att.meta["precision"] == "fp32"
    assert set(att.stats()["precision"]) == {"fp32"}


def test_fp32_stays_fp32_inside_a_users_autocast_block(tmp_path):
    """precision fp32 computes in fp32 whatever the caller's context: a user's bf16 autocast
    block does not reach Headscope's forward (its answers would say fp32 and be bf16)."""
    import numpy as np

    import headscope

    scope = headscope.load("random:test_vit", device="cpu", models_dir=tmp_path)
    x = np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    dtypes: list[torch.dtype] = []
    hook = scope.model.blocks[0].attn.qkv.register_forward_hook(lambda m, a, out: dtypes.append(out.dtype))
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got = scope.attention(x, query="all").maps
            out = scope.output(x)
            rel = scope.relevance(x)
    finally:
        hook.remove()
    assert dtypes and set(dtypes) == {torch.float32}, dtypes
    # the same seeded weights in another Scope, outside any autocast block
    ref = headscope.load("random:test_vit", device="cpu", models_dir=tmp_path).attention(x, query="all").maps
    torch.testing.assert_close(got, ref, rtol=0, atol=0)
    assert out["precision"] == "fp32" and rel["precision"] == "fp32"


def test_the_worker_runs_its_calls_without_reduced_precision(user_flags):
    w = Worker(torch.device("cpu"))
    assert w.precision == "fp32"
    got = asyncio.run(w.run_in_worker(reduced_fp32))
    assert got == [] and tf32_flags() == user_flags


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


def test_maps_made_after_the_forward_are_exact_too(user_flags, tmp_path, monkeypatch):
    """The maps of a picture computed alone (and of ``select``) are made from its capture after
    the forward, outside the model's lock: they too are computed without reduced precision or the
    caller's autocast (they were bf16 matmuls under ``set_float32_matmul_precision("medium")``
    while the answer said fp32)."""
    import numpy as np

    import headscope
    from headscope.serving import answers

    scope = headscope.load("random:test_vit", device="cpu", models_dir=tmp_path)
    seen: list[tuple[list[str], bool]] = []
    made = answers.map_tensor

    def recorded(*args, **kwargs):
        seen.append((reduced_fp32(), torch.is_autocast_enabled("cpu")))
        return made(*args, **kwargs)

    monkeypatch.setattr(answers, "map_tensor", recorded)
    x = np.random.default_rng(1).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        att = scope.attention(x)
        att.select(query="all")
    assert len(seen) == 2 and seen == [([], False)] * 2, seen
    assert tf32_flags() == user_flags


def test_relevance_keeps_a_users_autocast_block_out(tmp_path, monkeypatch):
    """The products after relevance's forward and backward (chefer's gradient times attention,
    rolled out) are fp32 inside a user's bf16 autocast block as outside it."""
    import numpy as np

    import headscope
    from headscope.engine import relevance as engine_relevance

    scope = headscope.load("random:test_vit", device="cpu", models_dir=tmp_path)
    x = np.random.default_rng(2).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    ref = scope.relevance(x, method="chefer")["relevance"]
    enabled: list[bool] = []
    products = engine_relevance.gradient_maps

    def recorded(*args, **kwargs):
        enabled.append(torch.is_autocast_enabled("cpu"))
        return products(*args, **kwargs)

    monkeypatch.setattr(engine_relevance, "gradient_maps", recorded)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = scope.relevance(x, method="chefer")
    assert enabled == [False]
    assert got["precision"] == "fp32"
    torch.testing.assert_close(torch.as_tensor(got["relevance"]), torch.as_tensor(ref), rtol=0, atol=0)
