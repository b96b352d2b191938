"""A list of pictures is computed batch by batch while the pool prepares the rest (issue 37): on a
device other than the pool's CPU a batch is a quarter of the list, so that decoding and the
forwards overlap; on the CPU and for tensors batches are as large as ``batch_size``. The first
batch is yielded before the last picture is prepared, every index comes back once and in order,
and the maps equal those of one picture at a time. Relevance (and so faithfulness) streams the
same way."""

from __future__ import annotations

import io
import threading

import numpy as np
import pytest
import torch
from PIL import Image

import headscope
from headscope.python import scope as scope_module

MODEL = "random:test_vit"


@pytest.fixture(scope="module")
def scope(tmp_path_factory):
    return headscope.load(MODEL, device="cpu", models_dir=tmp_path_factory.mktemp("models"), batch_size=8)


@pytest.fixture
def gpu_policy(scope, monkeypatch):
    """The batching policy of a model on CUDA with a 2-thread pool; the forwards still run on the CPU."""
    monkeypatch.setattr(scope, "device", torch.device("cuda"))
    monkeypatch.setattr(scope_module, "_cores", lambda: 2)
    return scope


def _jpegs(n: int) -> list[bytes]:
    out = []
    for i in range(n):
        buf = io.BytesIO()
        px = np.random.default_rng(i).integers(0, 256, (30, 40, 3), dtype=np.uint8)
        Image.fromarray(px).save(buf, "JPEG", quality=90)
        out.append(buf.getvalue())
    return out


def test_the_default_batch_is_the_servers_for_the_device(tmp_path):
    s = headscope.load(MODEL, device="cpu", models_dir=tmp_path)
    assert s.batch_size == s.settings.batching("cpu")[0] == 8
    assert s.settings.batching("cuda")[0] == 64


def test_on_the_cpu_batches_are_as_large_as_batch_size(scope):
    batches = list(scope._stream(_jpegs(20)))
    assert [list(b) for b in batches] == [list(range(8)), list(range(8, 16)), list(range(16, 20))]


def test_on_another_device_a_batch_is_a_quarter_of_the_list(gpu_policy):
    batches = list(gpu_policy._stream(_jpegs(20)))
    assert [list(b) for b in batches] == [list(range(k, k + 5)) for k in range(0, 20, 5)]
    # tensors have nothing to decode: batches as large as batch_size
    pixels = torch.zeros(20, 3, 224, 224, dtype=torch.uint8)
    assert [len(b) for b in gpu_policy._stream(pixels)] == [8, 8, 4]
    # never fewer pictures per batch than the pool has threads
    assert [len(b) for b in gpu_policy._stream(_jpegs(5))] == [2, 2, 1]


def test_a_list_s_ids_are_hashed_on_the_preparation_threads(scope, monkeypatch):
    """A PIL image's id hashes its pixels (about a millisecond for a photo): done beside its
    preparation, in the pool, not one after another on the caller's thread when the results are
    made. The ids are those of each picture alone."""
    from headscope.python import inputs

    hashed_on: list[str] = []
    pixels_id = inputs.pixels_id

    def recording(image):
        hashed_on.append(threading.current_thread().name)
        return pixels_id(image)

    images = [Image.open(io.BytesIO(f)).convert("RGB") for f in _jpegs(6)]
    alone = [scope.attention(im).image_id for im in images]
    monkeypatch.setattr(inputs, "pixels_id", recording)
    got = scope.attention(images)
    assert [g.image_id for g in got] == alone
    assert len(hashed_on) == 6 and all(name.startswith("headscope-prepare") for name in hashed_on), hashed_on


def test_a_list_s_ids_are_hashed_at_once_on_two_threads(scope, monkeypatch):
    """Two pictures' ids are hashed on two preparation threads at the same time: each hash
    waits here until the other has started. Python 3.11's ``functools.cached_property`` held
    one lock for every picture's id, so the second waited for the first (here: the barrier
    breaks)."""
    from headscope.python import inputs

    monkeypatch.setattr(scope_module, "_cores", lambda: 2)
    both = threading.Barrier(2, timeout=10)
    pixels_id = inputs.pixels_id

    def meeting(image):
        both.wait()
        return pixels_id(image)

    images = [Image.open(io.BytesIO(f)).convert("RGB") for f in _jpegs(2)]
    alone = [scope.attention(im).image_id for im in images]
    monkeypatch.setattr(inputs, "pixels_id", meeting)
    assert [g.image_id for g in scope.attention(images)] == alone


def test_the_first_batch_comes_before_the_last_picture_is_prepared(gpu_policy, monkeypatch):
    files = _jpegs(20)
    release, last_done = threading.Event(), threading.Event()
    prepare = gpu_policy._prepare

    def slow_last(item):
        if item is files[-1]:
            release.wait(30)
            try:
                return prepare(item)
            finally:
                last_done.set()
        return prepare(item)

    monkeypatch.setattr(gpu_policy, "_prepare", slow_last)
    stream = gpu_policy._stream(files)
    try:
        first = next(stream)
        assert list(first) == [0, 1, 2, 3, 4]
        assert not last_done.is_set(), "the first batch waited for every picture"
    finally:
        release.set()
    assert [i for b in stream for i in b] == list(range(5, 20))
    assert last_done.is_set()


def test_streamed_maps_equal_one_picture_at_a_time(scope, gpu_policy):
    files = _jpegs(9) + [_jpegs(1)[0]]  # a repeat of picture 0 as another object
    many = gpu_policy.attention(files, layers=[0, -1])
    assert [m.image_id for m in many] == [scope.attention(f, layers=[0, -1]).image_id for f in files]
    for f, m in zip(files, many):
        assert torch.equal(m.maps, scope.attention(f, layers=[0, -1]).maps)


def test_an_error_names_its_picture_and_stops_the_pool(gpu_policy):
    files = _jpegs(12)
    files[7] = b"not a picture"
    with pytest.raises(ValueError, match=r"pictures\[7\]"):
        gpu_policy.attention(files)


def test_a_failing_batch_stops_the_pool_at_once(gpu_policy, monkeypatch):
    """The forward of the first batch fails: the call raises, and no preparing thread is left
    running or waiting, though the exception (its traceback) is still held."""

    def fail(*args, **kwargs):
        raise RuntimeError("the forward failed")

    monkeypatch.setattr(gpu_policy.runner, "capture", fail)
    with pytest.raises(RuntimeError, match="the forward failed") as caught:
        gpu_policy.attention(_jpegs(20))
    assert caught.value is not None
    assert not [t.name for t in threading.enumerate() if t.name.startswith("headscope-prepare")]


def _wide_jpeg() -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(99).integers(0, 256, (30, 90, 3), dtype=np.uint8)).save(buf, "JPEG")
    return buf.getvalue()


def test_relevance_of_a_list_is_computed_while_the_rest_is_prepared(gpu_policy, monkeypatch):
    """The first batch's relevance runs before the last picture is prepared (that picture waits
    for it); the maps come back in order, and equal those of one picture at a time."""
    files = _jpegs(7) + [_wide_jpeg()] + _jpegs(9)[7:]  # two input sizes, the wide one in the middle
    computed, in_time = threading.Event(), []
    relevance, prepare = gpu_policy.runner.relevance, gpu_policy._prepare

    def noted(*args, **kwargs):
        computed.set()
        return relevance(*args, **kwargs)

    def last_waits(item):
        if item is files[-1]:
            in_time.append(computed.wait(10))
        return prepare(item)

    monkeypatch.setattr(gpu_policy.runner, "relevance", noted)
    monkeypatch.setattr(gpu_policy, "_prepare", last_waits)
    many = gpu_policy.relevance(files)
    assert in_time == [True], "relevance waited for every picture to be prepared"
    monkeypatch.undo()
    assert [r["image_id"] for r in many] == [gpu_policy.relevance(f)["image_id"] for f in files]
    for f, r in zip(files, many):
        assert torch.equal(r["relevance"], gpu_policy.relevance(f)["relevance"])


def test_faithfulness_of_a_list_keeps_its_order_across_input_sizes(scope):
    files = [_jpegs(1)[0], _wide_jpeg(), _jpegs(2)[1]]
    many = scope.faithfulness(files, methods="attention,random", fractions="0,0.5")
    for f, r in zip(files, many):
        one = scope.faithfulness(f, methods="attention,random", fractions="0,0.5")
        assert r["image_id"] == one["image_id"]
        assert r["methods"] == one["methods"]
