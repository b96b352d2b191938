"""Seeded random weights (``random:ARCH``, an open_clip model without a tag) that leave the
caller's random stream as it was: a notebook's ``torch.manual_seed(0); torch.randn(...)`` gives the
same numbers whether or not a random model was loaded in between."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

RANDOM_SEED = 0  # random models are the same on every start


@contextmanager
def seeded(seed: int = RANDOM_SEED) -> Iterator[None]:
    """Within: the CPU generator seeded with ``seed``; after: the caller's streams as they were
    (`rng_kept`).

    Models are built on the CPU and moved, so the CPU generator is the one their initialisation
    draws from. Where the caller made another device the default (``torch.set_default_device``),
    the model is built there: that device's generator is seeded too (and, on CUDA, given back).
    """
    device = torch.get_default_device()
    with rng_kept():
        torch.random.default_generator.manual_seed(seed)
        if device.type == "cuda" and device.index is not None:
            with torch.cuda.device(device.index):  # manual_seed seeds the current device, not cuda:N
                torch.cuda.manual_seed(seed)
        elif device.type not in ("cpu", "meta"):
            torch.get_device_module(device.type).manual_seed(seed)
        yield


@contextmanager
def rng_kept() -> Iterator[None]:
    """Within: anything; after: the caller's random streams as they were. Building a model with
    loaded weights still runs timm's random initialisation (then overwritten), which would move a
    notebook's seeded stream (``torch.manual_seed(0); headscope.load(); torch.randn(3)``)."""
    device = torch.get_default_device()
    cuda = device.type == "cuda" and torch.cuda.is_available()
    index = (device.index if device.index is not None else torch.cuda.current_device()) if cuda else None
    with torch.random.fork_rng(devices=[index] if index is not None else []):
        yield
