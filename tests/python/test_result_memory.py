"""Issue 39 items 5 and 8 (Python side): a result keeps what it was asked for, measured by the
tensor storage it keeps alive (not by time); the capture comes back on demand with the same
numbers; bad ``target`` types and empty arrays get messages that say what was wrong."""

from __future__ import annotations

import gc
from pathlib import Path

import numpy as np
import pytest
import torch

import headscope

SAMPLES = Path(__file__).resolve().parents[2] / "static" / "samples"


@pytest.fixture(scope="module")
def scope():
    return headscope.load(device="cpu", batch_size=8)


def pictures(n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(5)
    return [rng.integers(0, 256, (60, 80, 3), dtype=np.uint8) for _ in range(n)]


def kept_bytes(obj, skip: tuple) -> int:
    """Bytes of the tensor and array storages reachable from ``obj`` (each storage once),
    not following ``skip`` (the model, the settings: shared, not the result's)."""
    seen: set[int] = set()
    storages: dict[int, int] = {}
    stack = [obj]
    while stack:
        o = stack.pop()
        if id(o) in seen or any(o is s for s in skip):
            continue
        seen.add(id(o))
        if isinstance(o, torch.Tensor):
            st = o.untyped_storage()
            storages[st.data_ptr()] = st.nbytes()
            continue
        if isinstance(o, np.ndarray):
            base = o
            while isinstance(base.base, np.ndarray):
                base = base.base
            storages[id(base)] = base.nbytes
            continue
        if isinstance(o, (str, bytes, int, float, type(None))) or callable(o) and not hasattr(o, "__dict__"):
            continue
        if isinstance(o, dict):
            stack.extend(o.values())
        elif isinstance(o, (list, tuple, set)):
            stack.extend(o)
        elif hasattr(o, "__dict__") and not isinstance(o, type):
            stack.extend(vars(o).values())
        elif hasattr(o, "__dataclass_fields__"):
            stack.extend(getattr(o, f) for f in o.__dataclass_fields__)
    return sum(storages.values())


def test_a_result_keeps_its_maps_not_the_batchs_capture(scope):
    atts = scope.attention(pictures(8), layers=-1, heads=0)
    gc.collect()
    for att in atts:
        maps_bytes = att.maps.numel() * att.maps.element_size()
        assert maps_bytes < 2048
        kept = kept_bytes(att, (scope.lm, scope.settings))
        assert kept <= 4 * maps_bytes, f"a result of {maps_bytes} B of maps keeps {kept:,} B of tensors"


def test_the_capture_comes_back_on_demand_with_the_same_numbers(scope):
    pics = pictures(3)
    light = scope.attention(pics, layers=-1, heads=0)
    kept = scope.attention(pics, layers=-1, heads=0, keep_capture=True)
    for a, b in zip(light, kept):
        torch.testing.assert_close(a.maps, b.maps, rtol=0, atol=0)
        other_a, other_b = a.select(heads=1, query="all"), b.select(heads=1, query="all")
        torch.testing.assert_close(other_a.maps, other_b.maps, rtol=1e-5, atol=1e-6)
        assert a.stats()["entropy"].between(0, 1).all()
    # kept on request: this picture's own capture, not views of the batch's buffers
    capture = kept_bytes(kept[0], (scope.lm, scope.settings))
    assert capture < 2 * kept_bytes(kept[0].capture, (scope.lm, scope.settings)) + 4096


def test_a_target_of_the_wrong_type_names_the_accepted_forms(scope):
    with pytest.raises(TypeError, match=r"'output'.*'box:X0,Y0,X1,Y1'.*'class:N'.*got int 5"):
        scope.relevance(SAMPLES / "cat.png", target=5)


@pytest.mark.parametrize("shape", [(0, 0, 3), (0, 10), (10, 0, 3)])
def test_an_empty_array_says_it_has_no_pixels(scope, shape):
    with pytest.raises(ValueError, match="no pixels"):
        scope.attention(np.zeros(shape, np.uint8))
