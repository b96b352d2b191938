"""Tensors into the Python API: pixels ``[3, H, W]`` / ``[B, 3, H, W]`` (uint8 0..255 or float
0..1) give exactly what the bytes path gives for the same pixels, for every call; wrong shapes,
dtypes and ranges are clear errors; the precision is in every result."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import headscope
from headscope.python.inputs import png_bytes
from helpers.dispatch import dispatched, operators

MODEL = "random:test_vit"


@pytest.fixture(scope="module")
def scope(tmp_path_factory):
    return headscope.load(MODEL, device="cpu", models_dir=tmp_path_factory.mktemp("models"))


def _levels(seed: int, hw) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (*hw, 3), dtype=np.uint8)


def _chw(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a.transpose(2, 0, 1)))


def test_uint8_and_float_tensors_equal_the_bytes_path(scope):
    H, W = scope.lm.input_size
    a = _levels(0, (H, W))  # already the input size: used as it is
    want = scope.attention(png_bytes(a), query="all")
    for t in (_chw(a), _chw(a).float() / 255.0):
        got = scope.attention(t, query="all")
        assert torch.equal(got.maps, want.maps)
        assert got.input_size == want.input_size and got.image_size == want.image_size
    b = _levels(1, (50, 70))  # another size: resized as its PNG would be
    assert torch.equal(scope.attention(_chw(b)).maps, scope.attention(png_bytes(b)).maps)


def test_a_batch_tensor_gives_one_result_per_picture_in_order(scope):
    H, W = scope.lm.input_size
    pics = [_levels(s, (H, W)) for s in (2, 3, 4)]
    batch = torch.stack([_chw(a) for a in pics])  # 3, 3, H, W
    got = scope.attention(batch)
    assert isinstance(got, list) and len(got) == 3
    for g, a in zip(got, pics):
        assert torch.equal(g.maps, scope.attention(png_bytes(a)).maps)
    assert [g.image_id for g in got] == [scope.attention(_chw(a)).image_id for a in pics]
    assert len({g.image_id for g in got}) == 3
    # a list of tensors, mixed with bytes
    mixed = scope.attention([_chw(pics[0]), png_bytes(pics[1])])
    assert torch.equal(mixed[0].maps, got[0].maps) and torch.equal(mixed[1].maps, got[1].maps)


def test_batch_mates_share_a_selection_but_each_answer_is_its_own(scope):
    """A batch's selection is resolved once (`batch_selections`), yet every result's metadata
    equals the picture's alone, including what depends on its own tokens (``drop=artifacts``),
    and its lists are its own."""
    H, W = scope.lm.input_size
    pics = [_levels(s, (H, W)) for s in (5, 6, 7)]
    batch = torch.stack([_chw(a) for a in pics])
    kw = dict(query="0,3", layers="0,-1", heads="1,0", drop="prefix,artifacts")
    got = scope.attention(batch, **kw)
    for g, a in zip(got, pics):
        alone = scope.attention(_chw(a), **kw)
        assert torch.equal(g.maps, alone.maps)
        assert g.meta == alone.meta
    got[0].meta["layers"].append(99)
    got[0].meta["query"].append(99)
    got[0].meta["dropped"].append(99)
    assert all(99 not in g.meta[k] for g in got[1:] for k in ("layers", "query", "dropped"))
    assert scope.attention(batch[:2], **kw)[1].meta["layers"] == [0, scope.lm.num_layers - 1]


def test_a_batch_s_ids_hashed_in_threads_are_each_picture_s_own(monkeypatch):
    """`TensorBatch` hashes every picture's id when the first is read, runs of pictures on
    threads for a large batch; every id is the one the picture gets alone and that its PIL image
    gets (`pixels_id`), and the pictures are those of the call, whatever the caller's tensor
    holds afterwards."""
    from concurrent.futures import ThreadPoolExecutor

    from PIL import Image

    from headscope.python import inputs
    from headscope.python.inputs import TensorBatch, TensorPicture, own_levels, pixels_id

    pools: list[int] = []

    class Counted(ThreadPoolExecutor):
        def __init__(self, n, **kw):
            pools.append(n)
            super().__init__(n, **kw)

    monkeypatch.setattr(inputs, "ThreadPoolExecutor", Counted)
    pics = [_levels(10 + s, (300, 400)) for s in range(12)]  # 4.3 MB in all: two threads of 2 MiB
    batch = torch.stack([_chw(a) for a in pics])
    tb = TensorBatch(own_levels(batch), threads=4)
    kept = batch.clone()
    batch.zero_()  # the caller's buffer takes the next pictures
    assert tb._ids is None and not pools  # nothing hashed before an id is read
    alone = [TensorPicture(_chw(a)).image_id for a in pics]
    assert [p.image_id for p in tb.pictures()] == alone
    assert pools == [2]  # the threads did run, once for the batch
    assert alone == [pixels_id(Image.fromarray(a)) for a in pics]
    assert torch.equal(tb.host(4), kept[4]) and torch.equal(tb.pictures()[4]._levels, kept[4])
    single = TensorBatch(kept[:2], threads=4)  # small: hashed on the reading thread
    assert single.image_id(1) == alone[1] and pools == [2]


def test_a_tensor_s_pictures_are_copied_once_whatever_the_dtype():
    """`own_levels` snapshots a call's pictures in one copy: a uint8 tensor is cloned, a float
    tensor's levels (a new tensor already) are not copied again; either way they share no memory
    with the caller's tensor and are contiguous, and the float range is read in one pass."""
    from headscope.python.inputs import TensorBatch, own_levels

    u8 = torch.from_numpy(_levels(20, (8 * 6, 5))).reshape(2, 3, 4, 5, 6)[..., 0]  # B, 3, H, W: strided
    for t in (
        u8,
        u8.contiguous(),
        u8.float() / 255.0,
        (u8.float() / 255.0).contiguous(memory_format=torch.channels_last),
    ):
        made: list[torch.Tensor] = []
        seen = operators(lambda t=t, made=made: made.append(own_levels(t)))
        got = made[0]
        copies = [n for n in seen if n in ("clone", "copy_", "_to_copy", "contiguous")]
        assert copies == (
            ["clone"] if t.dtype == torch.uint8 else ["_to_copy"] if t.is_contiguous() else ["_to_copy", "clone"]
        )
        assert seen.count("min") + seen.count("max") == 0 and seen.count("aminmax") == (t.dtype != torch.uint8)
        assert got.dtype == torch.uint8 and got.is_contiguous() and torch.equal(got, u8)
        assert got.untyped_storage().data_ptr() != t.untyped_storage().data_ptr()
        assert torch.equal(TensorBatch(got).batch, u8)
    with pytest.raises(ValueError, match="contiguous"):
        TensorBatch(u8)


def test_every_call_takes_tensors(scope):
    H, W = scope.lm.input_size
    a = _levels(5, (H, W))
    t, data = _chw(a), png_bytes(a)
    got, want = scope.relevance(t, method="chefer"), scope.relevance(data, method="chefer")
    assert torch.equal(got["relevance"], want["relevance"]) and got["y"] == want["y"]
    assert got["precision"] == "fp32" and isinstance(got["uniform"], bool)
    f_got = scope.faithfulness(t, methods="chefer,random", fractions=[0, 0.5])
    f_want = scope.faithfulness(data, methods="chefer,random", fractions=[0, 0.5])
    assert f_got["methods"] == f_want["methods"] and f_got["precision"] == "fp32"
    o_got, o_want = scope.output(t), scope.output(data)
    assert o_got["precision"] == "fp32"
    assert o_got["output"].keys() == o_want["output"].keys()
    imp_got, imp_want = scope.importance(t, method="gradient"), scope.importance(data, method="gradient")
    assert torch.equal(imp_got["importance"], imp_want["importance"])
    stats = scope.attention(t).stats()
    assert set(stats["precision"]) == {"fp32"}


def test_bad_tensors_are_clear_errors(scope):
    with pytest.raises(ValueError, match=r"0\.\.1"):
        scope.attention(torch.randn(3, 32, 32))  # a normalised input, not pixels
    with pytest.raises(ValueError, match=r"0\.\.1"):
        scope.attention(torch.full((3, 32, 32), 200.0))  # 0..255 as floats
    with pytest.raises(ValueError, match="channels last"):
        scope.attention(torch.zeros(32, 32, 3, dtype=torch.uint8))
    with pytest.raises(ValueError, match=r"\[3, H, W\]"):
        scope.attention(torch.zeros(4, 32, 32, dtype=torch.uint8))
    with pytest.raises(ValueError, match="empty"):
        scope.attention(torch.zeros(3, 0, 32, dtype=torch.uint8))
    with pytest.raises(TypeError, match="uint8"):
        scope.attention(torch.zeros(3, 32, 32, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"pictures\[1\]"):
        scope.attention([torch.zeros(3, 32, 32, dtype=torch.uint8), torch.randn(3, 32, 32)])
    with pytest.raises(TypeError, match="dense"):
        scope.attention(torch.rand(3, 32, 32).to_sparse())
    with pytest.raises(TypeError, match="meta device"):
        scope.relevance(torch.empty(3, 32, 32, device="meta"))
    with pytest.raises(TypeError, match="nested"):
        scope.attention(torch.nested.nested_tensor([torch.rand(3, 32, 32), torch.rand(3, 32, 32)]))
    with pytest.raises(TypeError, match="float8"):
        scope.attention(torch.zeros(3, 32, 32).to(torch.float8_e4m3fn))


def test_float_arrays_are_the_pictures_float_tensors_are(scope):
    """An HxWx3 float array of 0..1 is quantised by the tensors' rule: the same levels, the same
    maps and the same image_id as the tensor of the same values (float64 and float16 too)."""
    a = np.random.default_rng(7).random((40, 50, 3))
    for dtype in (np.float64, np.float32, np.float16):
        arr = a.astype(dtype)
        t = torch.from_numpy(np.ascontiguousarray(arr.transpose(2, 0, 1)))
        got, want = scope.attention(arr), scope.attention(t)
        assert torch.equal(got.maps, want.maps) and got.image_id == want.image_id, dtype
    with pytest.raises(ValueError, match="NaN or infinite"):
        scope.attention(np.full((8, 8, 3), np.inf, np.float32))


def test_out_of_range_floats_say_exactly_what_is_wrong(scope):
    with pytest.raises(ValueError, match=r"1\.0000001"):  # not rounded to "1"
        scope.attention(torch.full((3, 32, 32), 1.0000001, dtype=torch.float64))
    with pytest.raises(ValueError, match="NaN or infinite"):
        scope.attention(torch.full((3, 32, 32), float("nan")))
    batch = torch.rand(3, 3, 32, 32)
    batch[2] = batch[2] * 2 - 1  # the third picture normalised
    with pytest.raises(ValueError, match="picture 2 of the batch"):
        scope.output(batch)


def test_a_cls_capture_dispatches_a_few_operators_beyond_the_forward(scope):
    """On a GPU at batch 1 the forward is bound by the host's dispatch of its operators, so a
    capture's ratio to it is about the ratio of the operators each runs. CLS rows of one picture
    cost the model's forward, two views a layer (q's CLS row and k, of qkv's output: no view in
    the hooks) and a fixed handful (the normalisation, the stacked product and softmax, the
    norms); each batch-mate adds one copy (its maps in memory of its own)."""
    H, W = scope.lm.input_size
    L = scope.lm.num_layers
    for B in (1, 4):
        t = torch.stack([_chw(_levels(20 + b, (H, W))) for b in range(B)])
        x = scope.runner.inputs(t)
        scope.attention(t)  # warm

        def forward(x=x):
            with torch.inference_mode():
                scope.lm.model.forward_features(x)

        extra = dispatched(lambda t=t: scope.attention(t)) - dispatched(forward)
        assert extra <= 2 * L + 30 + B, (B, extra)


def test_a_batch_s_results_hash_no_id_until_one_is_read(scope):
    """An answer's metadata is made when first read (`PartMeta`): a batch's call hashes no
    picture's pixels (a millisecond a photo) unless its id is read, and then gives what the
    picture alone gives."""
    H, W = scope.lm.input_size
    pics = [_levels(30 + s, (H, W)) for s in range(3)]
    got = scope.attention(torch.stack([_chw(a) for a in pics]))  # small: no hashing thread
    batch = got[0]._item.picture._batch
    assert batch is not None and batch._ids is None and batch._hosts is None
    assert got[1].meta["image_id"] == scope.attention(_chw(pics[1])).image_id
    assert got[2].image_id == got[2].meta["image_id"] == scope.attention(_chw(pics[2])).image_id


def test_a_buffer_refilled_after_the_call_changes_no_result(scope):
    """The pictures of a tensor are taken as they are when the call is made: a caller that
    refills its buffer with the next pictures changes neither a result's id, nor its PNG, nor a
    capture computed again (`select`), for a batch and for a list of tensors alike."""
    H, W = scope.lm.input_size
    pics = [_levels(40 + s, (H, W)) for s in range(2)]
    for make in (lambda t: t, lambda t: list(t.unbind(0))):
        buf = torch.stack([_chw(a) for a in pics])
        got = scope.attention(make(buf))
        buf.zero_()
        for g, a in zip(got, pics):
            alone = scope.attention(_chw(a))
            assert g.image_id == alone.image_id and g.image_bytes == png_bytes(a)
            assert torch.equal(g.select(query="all").maps, alone.select(query="all").maps)


def test_a_tensor_batch_goes_to_the_forward_as_its_one_copy(scope):
    """The pictures of a tensor at the input size go to the forward as a view of the call's one
    copy (`TensorBatch.batch`), not stacked again; pictures that are not its consecutive
    pictures as they are (a list of tensors) go as they are."""
    H, W = scope.lm.input_size
    t = torch.stack([_chw(_levels(50 + s, (H, W))) for s in range(3)])
    batch = next(scope._stream(t))
    raws = scope._raws(batch, list(batch))
    tb = batch[0].picture._batch
    assert isinstance(raws, torch.Tensor) and raws.data_ptr() == tb.batch.data_ptr() and torch.equal(raws, t)
    part = scope._raws(batch, [1, 2])
    assert isinstance(part, torch.Tensor) and part.data_ptr() == tb.batch[1].data_ptr()
    mixed = next(scope._stream(list(t.unbind(0))))
    assert isinstance(scope._raws(mixed, list(mixed)), list)
