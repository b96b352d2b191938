"""Counting what a call dispatches: on a GPU each operator costs the host about a kernel
launch's time (a view too, though it launches none), so a launch-bound pass's time follows it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode


def operators(fn: Callable[[], Any]) -> list[str]:
    """The names of the operators ``fn`` dispatches below autograd (``clone``, ``mm``...), in
    order, its backwards' included."""
    seen: list[str] = []

    class Names(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    with Names():
        fn()
    return seen


def dispatched(fn: Callable[[], Any]) -> int:
    """How many operators ``fn`` dispatches below autograd, its backwards' included."""
    return len(operators(fn))
