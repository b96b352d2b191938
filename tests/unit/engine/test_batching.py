"""The batch runner (engine/batching.py): the device normalisation equals the host's old formula
bit for bit, grouping, the out-of-memory split, and a capture equal to the forward of the host
input."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from headscope.engine.batching import (
    BatchRunner,
    Buckets,
    OutOfMemory,
    groups,
    normal_table,
    normalise,
    split_on_oom,
)
from headscope.engine.forward import forward_capture
from headscope.zoo.registry import Registry

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    return Registry(["random:test_vit"], tmp_path_factory.mktemp("m")).get()


def _host_formula(levels: np.ndarray) -> np.ndarray:
    """What serving/preprocess.py computed before the runner: float32 / 255, minus mean, over std."""
    a = levels.astype(np.float32) / 255.0  # H, W, 3
    a = (a - np.asarray(MEAN, np.float32)) / np.asarray(STD, np.float32)
    return np.ascontiguousarray(a.transpose(2, 0, 1))


def test_the_table_lookup_is_the_host_formula_bit_for_bit():
    rng = np.random.default_rng(0)
    levels = rng.integers(0, 256, (37, 53, 3), dtype=np.uint8)
    levels[0, :3] = [[0, 0, 0], [255, 255, 255], [128, 1, 254]]  # the ends of the range too
    raw = torch.from_numpy(np.ascontiguousarray(levels.transpose(2, 0, 1)))
    got = normalise(raw, normal_table(MEAN, STD))
    assert got.dtype == torch.float32
    assert torch.equal(got, torch.from_numpy(_host_formula(levels)))
    batch = normalise(torch.stack([raw, raw.flip(-1)]), normal_table(MEAN, STD))
    assert torch.equal(batch[1], torch.from_numpy(_host_formula(levels[:, ::-1])))


def test_normalise_refuses_what_is_not_uint8_rgb():
    with pytest.raises(TypeError, match="uint8"):
        normalise(torch.zeros(3, 4, 4), normal_table(MEAN, STD))
    with pytest.raises(ValueError, match=r"\[\.\.\., 3, H, W\]"):
        normalise(torch.zeros(4, 4, 3, dtype=torch.uint8), normal_table(MEAN, STD))


def test_groups_keep_shapes_apart_in_order_and_bounded():
    keys = ["a", "b", "a", "a", "b", "a"]
    assert groups(keys, 2) == [[0, 2], [3, 5], [1, 4]]
    assert groups(keys, 10) == [[0, 2, 3, 5], [1, 4]]


def _oom() -> RuntimeError:
    return RuntimeError("CUDA out of memory. Tried to allocate 2 GiB")


def test_buckets_hand_out_full_batches_as_they_fill_and_the_rest_as_groups_would():
    keys = ["a", "b", "a", "a", "b", "a", "c", "a"]
    buckets: Buckets[int] = Buckets(2)
    full = [b for i, k in enumerate(keys) if (b := buckets.add(k, i)) is not None]
    assert full == [[0, 2], [1, 4], [3, 5]]  # each as soon as it fills: at items 2, 4 and 5
    assert buckets.waiting() == 2
    assert list(buckets.rest()) == [[6], [7]]
    assert buckets.waiting() == 0 and list(buckets.rest()) == []
    # everything at once: the same batches as groups(), in the same order
    at_once: Buckets[int] = Buckets(10)
    assert [at_once.add(k, i) for i, k in enumerate(keys)] == [None] * len(keys)
    assert list(at_once.rest()) == [[0, 2, 3, 5, 7], [1, 4], [6]] == groups(keys, 10)


def test_the_fullest_bucket_is_taken_first_to_bound_what_waits():
    buckets: Buckets[str] = Buckets(8)
    for i, k in enumerate("abbcbb"):
        buckets.add(k, f"{k}{i}")
    assert buckets.fullest() == ["b1", "b2", "b4", "b5"]
    assert buckets.waiting() == 2
    assert list(buckets.rest()) == [["a0"], ["c3"]]


def test_out_of_memory_splits_until_it_fits_and_errors_stay_with_their_item():
    calls: list[list[int]] = []

    def run(batch: list[int]) -> list[int]:
        calls.append(list(batch))
        if len(batch) > 2:
            raise _oom()
        if 3 in batch:
            raise ValueError("bad picture")
        return [b * 10 for b in batch]

    splits: list[int] = []
    errors: list[BaseException] = []
    out = split_on_oom(run, [0, 1, 2, 3, 4], torch.device("cpu"), on_split=splits.append, on_error=errors.append)
    assert out[:3] == [0, 10, 20] and out[4] == 40
    assert isinstance(out[3], ValueError) and errors == [out[3]]
    assert splits == [5, 3]  # 5 -> 2 + 3, 3 -> 1 + 2
    assert [3] in calls and [4] in calls  # the culprit isolated, its batch-mate rerun alone


def test_out_of_memory_frees_once_then_a_single_item_gets_out_of_memory():
    freed: list[int] = []

    def run(batch: list[int]) -> list[int]:
        raise _oom()

    out = split_on_oom(run, [7], torch.device("cpu"), free=lambda: freed.append(1) or 100)
    assert isinstance(out[0], OutOfMemory) and freed == [1]


def test_the_failed_batchs_tensors_are_gone_before_its_retries_run():
    """The halves of a batch that ran out of memory run after the failed forward's tensors are
    freed (they were held by the error's traceback while the retry ran inside the except block,
    so on a GPU emptying the cache freed nothing and the halves ran out of memory too)."""
    import weakref

    made: list[weakref.ref] = []
    alive_at_retry: list[bool] = []

    def run(batch: list[int]) -> list[int]:
        alive_at_retry.extend(r() is not None for r in made)
        activations = torch.ones(1000)  # what the forward held when it failed
        made.append(weakref.ref(activations))
        if len(batch) > 1:
            raise _oom()
        return [b * 10 for b in batch]

    freed: list[int] = []
    out = split_on_oom(run, [1, 2], torch.device("cpu"), free=lambda: freed.append(1) or 100)
    assert out == [10, 20] and freed == [1]
    assert alive_at_retry and not any(alive_at_retry)
    # an error that is not out of memory keeps its traceback for the log
    err = split_on_oom(lambda b: [][1], [5], torch.device("cpu"))[0]
    assert isinstance(err, IndexError) and err.__traceback__ is not None


def test_the_runner_captures_what_the_forward_of_the_host_input_captures(lm):
    rng = np.random.default_rng(1)
    H, W = lm.input_size
    levels = [rng.integers(0, 256, (H, W, 3), dtype=np.uint8) for _ in range(3)]
    raws = [torch.from_numpy(np.ascontiguousarray(a.transpose(2, 0, 1))) for a in levels]
    runner = BatchRunner(lm, None, batch_size=4)
    assert runner.precision == "fp32"
    table = normal_table(lm.mean, lm.std)
    host = torch.stack([normalise(r, table) for r in raws])
    with lm.lock:
        got = runner.capture(raws)
        want = forward_capture(lm, host)
    for a, b in zip(got, want):
        for layer in range(a.num_layers):
            assert torch.equal(a.rows(layer), b.rows(layer))
    # float32 input is taken as already normalised (the engine's convention)
    assert torch.equal(runner.inputs(host), host)
