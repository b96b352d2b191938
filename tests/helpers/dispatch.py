"""Counting what a call dispatches: on a GPU each operator costs the host about a kernel
launch's time (a view too, though it launches none), so a launch-bound pass's time follows it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode


def dispatched(fn: Callable[[], Any]) -> int:
    """The operators ``fn`` dispatches below autograd, its backwards' included."""

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.n += 1
            return func(*args, **(kwargs or {}))

    with Count():
        fn()
    return Count.n
