"""The user's model in eval mode, under its lock, while Headscope computes with it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch.nn as nn

from ..engine.device import exact_fp32
from ..engine.model import LoadedModel


@contextlib.contextmanager
def computing(lm: LoadedModel, lock: bool = True) -> Iterator[None]:
    """The model in eval mode while Headscope computes: a module that was training (one being
    fine-tuned, say) gets each submodule's mode back afterwards. Under the model's lock
    (``lock=False`` for the server's works, whose pieces take it themselves). fp32 means fp32
    meanwhile: TF32 off, the caller's flags set back afterwards (`exact_fp32`)."""
    with lm.lock if lock else contextlib.nullcontext(), exact_fp32():
        training = _training(lm.model)
        for m in training:
            m.training = False
        try:
            yield
        finally:
            for m in training:
                m.training = True


def _training(root: nn.Module) -> list[nn.Module]:
    """The modules under ``root`` (itself included) in training mode, each once: what
    ``[m for m in root.modules() if m.training]`` gives, without the name ``modules()`` builds
    for every submodule on each call."""
    out: list[nn.Module] = []
    seen: set[int] = set()
    todo = [root]
    while todo:
        m = todo.pop()
        if id(m) in seen:
            continue
        seen.add(id(m))
        if m.training:
            out.append(m)
        todo.extend(c for c in m._modules.values() if c is not None)
    return out
