"""Eigenvalues of float64 Gram matrices, the batch spread over the host's cores.

The ranks of ``GET …/stats`` need the singular values of every layer's head outputs: the square
roots of the eigenvalues of each ``[N, H*d_v]`` matrix's float64 Gram matrix (the smaller side;
:func:`app.engine.stats.singular_values` says why float64). LAPACK's symmetric eigensolver reduces
a matrix to tridiagonal form with about ``10 n`` small BLAS calls, so at ``n = 257`` (a 224 px
image of a /14 model) it is bound by their latency, not by arithmetic: ~1.5 ms a matrix on this
project's 2-core VM, in float32 or float64, with MKL or OpenBLAS, and LAPACK's two-stage
reduction is slower still at that size. Measured on that VM (12 layers of the default model):

* ``torch.linalg.eigvalsh`` on the batch: MKL solves the matrices one after the other, 18-24 ms,
  and 212 ms under ``OMP_WAIT_POLICY=PASSIVE`` (each of those small calls wakes sleeping OpenMP
  threads); torch in two Python threads is slower still (MKL's threads contend);
* here: each of up to ``torch.get_num_threads()`` threads takes a share of the matrices and
  computes their Gram products and eigenvalues with numpy's LAPACK, its BLAS held to one thread
  meanwhile (two callers of a multi-threaded OpenBLAS queue behind each other): 13-19 ms for
  Gram and eigenvalues together, the same under ``PASSIVE``.

Off the host (CUDA) torch's batched solver is used as it is.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_pool_size = 0
_blas: Any = None  # threadpoolctl's controllers of numpy's OpenBLAS, found once
_blas_users = 0  # callers inside _one_blas_thread()
_blas_before: list[int] = []  # OpenBLAS's thread counts before the first of them


def gram_eigvalsh(x: torch.Tensor) -> torch.Tensor:
    """Eigenvalues, ascending, of the float64 Gram matrix of each ``[..., M, D]`` matrix.

    ``X X^T`` when ``M <= D``, else ``X^T X``: ``[..., min(M, D)]`` in float64, on the host for
    host (and MPS) input, else on ``x``'s device.

    Args:
        x: the matrices: float64 stays float64, any other float dtype is taken as float32
            (whose entries multiply exactly in float64).
    """
    if x.device.type not in ("cpu", "mps"):
        xd = x.double()
        return torch.linalg.eigvalsh(xd @ xd.mT if x.shape[-2] <= x.shape[-1] else xd.mT @ xd)
    lead = x.shape[:-2]
    keep = torch.float64 if x.dtype == torch.float64 else torch.float32
    mats = x.detach().to("cpu").to(keep).reshape(-1, *x.shape[-2:]).numpy()  # B, M, D
    workers = max(1, min(len(mats), torch.get_num_threads(), os.cpu_count() or 1))
    if workers == 1:
        lam = _eigvalsh(mats)
    else:
        shares = np.array_split(np.arange(len(mats)), workers)
        with _one_blas_thread():
            lam = np.concatenate(list(_executor(workers).map(lambda i: _eigvalsh(mats[i]), shares)))
    return torch.from_numpy(lam).reshape(*lead, lam.shape[-1])


def _eigvalsh(mats: np.ndarray) -> np.ndarray:
    """``[B, min(M, D)]`` Gram eigenvalues of ``[B, M, D]`` matrices (numpy's LAPACK)."""
    xd = mats.astype(np.float64)
    gram = xd @ xd.swapaxes(-1, -2) if mats.shape[-2] <= mats.shape[-1] else xd.swapaxes(-1, -2) @ xd
    return np.linalg.eigvalsh(gram)


def _executor(workers: int) -> ThreadPoolExecutor:
    """The shares' threads (numpy only: a thread that calls torch gets an OpenMP team of its own)."""
    global _pool, _pool_size
    with _lock:
        if _pool is None or _pool_size < workers:
            if _pool is not None:
                _pool.shutdown(wait=False)
            _pool, _pool_size = ThreadPoolExecutor(workers, thread_name_prefix="headscope-gram"), workers
        return _pool


@contextmanager
def _one_blas_thread() -> Iterator[None]:
    """numpy's OpenBLAS held to one thread while any shares run, then set back.

    Only OpenBLAS is touched (torch's MKL is its own, inside libtorch); where numpy uses another
    BLAS, or threadpoolctl is missing, nothing changes and the threads share that BLAS's pool.
    Counted, so overlapping callers set it back once, after the last of them.
    """
    global _blas, _blas_users, _blas_before
    with _lock:
        if _blas is None:
            try:
                from threadpoolctl import ThreadpoolController

                _blas = ThreadpoolController().select(internal_api="openblas")
            except Exception:  # noqa: BLE001 - an optional speed-up only
                _blas = False
        if _blas and _blas_users == 0:
            _blas_before = [c.num_threads for c in _blas.lib_controllers]
            _blas.limit(limits=1)
        _blas_users += 1
    try:
        yield
    finally:
        with _lock:
            _blas_users -= 1
            if _blas and _blas_users == 0:
                for c, n in zip(_blas.lib_controllers, _blas_before):
                    c.set_num_threads(n)
