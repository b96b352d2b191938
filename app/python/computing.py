"""The user's model in eval mode, under its lock, while Headscope computes with it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from ..engine.device import exact_fp32
from ..engine.model import LoadedModel


@contextlib.contextmanager
def computing(lm: LoadedModel, lock: bool = True) -> Iterator[None]:
    """The model in eval mode while Headscope computes: a module that was training (one being
    fine-tuned, say) gets each submodule's mode back afterwards. Under the model's lock
    (``lock=False`` for the server's works, whose pieces take it themselves). fp32 means fp32
    meanwhile: TF32 off, the caller's flags set back afterwards (`exact_fp32`)."""
    with lm.lock if lock else contextlib.nullcontext(), exact_fp32():
        training = [m for m in lm.model.modules() if m.training]
        for m in training:
            m.training = False
        try:
            yield
        finally:
            for m in training:
                m.training = True
