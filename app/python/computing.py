"""The user's model in eval mode, under its lock, while Headscope computes with it."""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Iterator

import torch.nn as nn
from torch.nn.modules.module import register_module_module_registration_hook

from ..engine.batching import model_device
from ..engine.device import exact_computing
from ..engine.model import LoadedModel


@contextlib.contextmanager
def computing(lm: LoadedModel, lock: bool = True) -> Iterator[None]:
    """The model in eval mode while Headscope computes: a module that was training (one being
    fine-tuned, say) gets each submodule's mode back afterwards. Under the model's lock
    (``lock=False`` for the server's works, whose pieces take it themselves). fp32 means fp32
    meanwhile (`numerics`)."""
    with lm.lock if lock else contextlib.nullcontext(), numerics(lm), _eval_mode(lm.model):
        yield


# Per model: how many calls are computing with it and the modules the first one found training.
# Counted, as exact_fp32's flags are: calls that take the model's lock only inside their work
# (lock=False) overlap, and the second one in found the modules in eval mode already, so the
# first one out set them training again under the second one's forwards (dropout on). A module
# the caller adds or sets training while a call computes is left as it is until the next call.
_EVAL: weakref.WeakKeyDictionary[nn.Module, list] = weakref.WeakKeyDictionary()
_EVAL_LOCK = threading.Lock()


@contextlib.contextmanager
def _eval_mode(root: nn.Module) -> Iterator[None]:
    with _EVAL_LOCK:
        entry = _EVAL.get(root)
        if entry is None:
            training = _training(root)
            for m in training:
                m.training = False
            entry = _EVAL[root] = [0, training]
        entry[0] += 1
    try:
        yield
    finally:
        with _EVAL_LOCK:
            entry[0] -= 1
            if entry[0] == 0:
                del _EVAL[root]
                for m in entry[1]:
                    m.training = True


def numerics(lm: LoadedModel) -> contextlib.ExitStack:
    """fp32 means fp32 while Headscope computes with ``lm``'s outputs (maps made from a capture,
    say), the model's lock not needed: TF32 off and the caller's own ``torch.autocast`` off, the
    caller's settings set back afterwards (`exact_computing`)."""
    return exact_computing(model_device(lm).type)


def _training(root: nn.Module) -> list[nn.Module]:
    """The modules under ``root`` (itself included) in training mode, each once: what
    ``[m for m in root.modules() if m.training]`` gives."""
    return [m for m in _modules(root) if m.training]


# Every module under a root, walked once and kept until any module anywhere registers a
# submodule (torch's global registration hook empties it): a walk of the default model's 180
# modules cost 0.1 ms a call, a seventh of a one-picture call's host time.
_FLAT: weakref.WeakKeyDictionary[nn.Module, tuple[nn.Module, ...]] = weakref.WeakKeyDictionary()
_watching = False


def _forget(module: nn.Module, name: str, submodule: nn.Module | None) -> None:
    _FLAT.clear()


def _modules(root: nn.Module) -> tuple[nn.Module, ...]:
    global _watching
    if not _watching:
        register_module_module_registration_hook(_forget)
        _watching = True
    flat = _FLAT.get(root)
    if flat is None:
        flat = _FLAT[root] = _walk(root)
    return flat


def _walk(root: nn.Module) -> tuple[nn.Module, ...]:
    """The modules under ``root``, each once, without the names ``modules()`` builds."""
    out: list[nn.Module] = []
    seen: set[int] = set()
    todo = [root]
    while todo:
        m = todo.pop()
        if id(m) in seen:
            continue
        seen.add(id(m))
        out.append(m)
        todo.extend(c for c in m._modules.values() if c is not None)
    return tuple(out)
