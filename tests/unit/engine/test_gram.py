"""The ranks' Gram eigenvalues on the host threads against torch's own solver."""

from __future__ import annotations

import os
import threading

import pytest
import torch

from headscope.engine import gram
from headscope.engine.gram import gram_eigvalsh


def _reference(x: torch.Tensor) -> torch.Tensor:
    """torch (MKL) on the float64 Gram matrix of the smaller side: another LAPACK than numpy's."""
    xd = x.double()
    return torch.linalg.eigvalsh(xd @ xd.mT if x.shape[-2] <= x.shape[-1] else xd.mT @ xd)


def _openblas_threads() -> list[int]:
    from threadpoolctl import threadpool_info

    return [i["num_threads"] for i in threadpool_info() if i["internal_api"] == "openblas"]


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("shape", [(12, 40, 64), (5, 64, 40), (2, 3, 30, 50), (40, 64)], ids=str)
def test_eigenvalues_equal_torch_on_the_smaller_side(shape, two_threads):
    torch.manual_seed(0)
    x = torch.randn(*shape)
    got = gram_eigvalsh(x)
    want = _reference(x)
    assert got.dtype == torch.float64 and got.shape == want.shape == (*shape[:-2], min(shape[-2:]))
    scale = want[..., -1:].abs()
    assert ((got - want).abs() / scale).max() < 1e-13


def test_float64_input_stays_float64():
    torch.manual_seed(1)
    u, _ = torch.linalg.qr(torch.randn(60, 30, dtype=torch.float64))
    s = torch.logspace(0, -5, 30, dtype=torch.float64)
    x = (u * s) @ torch.linalg.qr(torch.randn(30, 30, dtype=torch.float64))[0].T
    got = gram_eigvalsh(x.mT).sqrt()  # 30 x 60: X X^T
    # Eigenvalues down to 1e-10 of the largest: float64 resolves them (error ~ eps64 / 1e-10).
    # Entries rounded to float32 (6e-8 of the largest) would move the smallest singular values
    # by more than that: the input must not be rounded on its way.
    torch.testing.assert_close(got, s.flip(0), rtol=1e-4, atol=0)
    rounded = gram_eigvalsh(x.mT.float()).clamp_min(0).sqrt()
    assert not torch.allclose(rounded, s.flip(0), rtol=1e-4, atol=0)


def test_the_batch_is_shared_between_threads_and_blas_is_set_back(two_threads, monkeypatch):
    if (os.cpu_count() or 1) < 2:
        pytest.skip("one CPU: the batch runs on the calling thread")
    seen: list[tuple[str, list[int]]] = []
    inner = gram._eigvalsh
    # Each share waits for the other: shares run one after the other would time out here.
    both = threading.Barrier(2, timeout=20)

    def spy(mats):
        seen.append((threading.current_thread().name, _openblas_threads()))
        both.wait()
        return inner(mats)

    monkeypatch.setattr(gram, "_eigvalsh", spy)
    before = _openblas_threads()
    x = torch.randn(12, 30, 40)
    torch.testing.assert_close(gram_eigvalsh(x), _reference(x), rtol=1e-12, atol=1e-9)
    names = {name for name, _ in seen}
    assert len(names) == 2 and all(n.startswith("headscope-gram") for n in names)
    if before:  # numpy's BLAS is OpenBLAS: one thread while the shares ran, as before afterwards
        assert all(threads == [1] * len(before) for _, threads in seen)
    assert _openblas_threads() == before


def test_overlapping_callers_get_their_own_answers(two_threads):
    before = _openblas_threads()
    xs = [torch.randn(6, 20 + i, 30) for i in range(4)]
    out: dict[int, torch.Tensor] = {}

    def call(i: int) -> None:
        for _ in range(5):
            out[i] = gram_eigvalsh(xs[i])

    threads = [threading.Thread(target=call, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, x in enumerate(xs):
        torch.testing.assert_close(out[i], _reference(x), rtol=1e-12, atol=1e-9)
    assert _openblas_threads() == before
