"""The user's model in eval mode, under its lock, while Headscope computes with it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from ..engine.model import LoadedModel


@contextlib.contextmanager
def computing(lm: LoadedModel, lock: bool = True) -> Iterator[None]:
    """The model in eval mode while Headscope computes: a module that was training (one being
    fine-tuned, say) gets each submodule's mode back afterwards. Under the model's lock
    (``lock=False`` for the server's works, whose pieces take it themselves)."""
    with lm.lock if lock else contextlib.nullcontext():
        training = [m for m in lm.model.modules() if m.training]
        for m in training:
            m.training = False
        try:
            yield
        finally:
            for m in training:
                m.training = True
