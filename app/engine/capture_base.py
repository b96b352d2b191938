"""What the global (:mod:`~app.engine.block_capture`) and windowed (:mod:`~app.engine.windows`) captures
share, below both: their errors, the list of supported families, the softmax temperature, the
hook functions both install, and the two interfaces every caller reads them through.

* :class:`CaptureHooks`: a model's hooks (``AttentionCapture``, ``WindowCapture``): install them
  around one forward pass (``capturing``), then split what they kept per image (``results``).
* :class:`CapturedAttention`: one image's capture, what the hooks give back (``ImageAttention``,
  ``WindowedAttention``): softmax rows of any layer, head and query, at any temperature.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

import torch

from .layout import Stage

SUPPORTED_FAMILIES = (
    "vit, deit (incl. distilled), dinov2 (with and without registers), flexivit, siglip, "
    "eva/eva02 (RoPE), beit (relative position bias), swin and swinv2 (windowed, one grid per stage)"
)


class CaptureError(RuntimeError):
    """A capture came back empty, incomplete or malformed."""


class UnsupportedModelError(ValueError):
    """The model's attention blocks are of a kind Headscope cannot capture."""


Picked = list[int] | None  # indices along one axis, None for all
Out = torch.Tensor | None


class CapturedAttention(Protocol):
    """One image's capture, for every layer, where the forward ran.

    Layers are numbered across the model (a windowed model's stages included); a layer's maps
    are ``[heads_at(layer), tokens_at(layer), tokens_at(layer)]``.
    """

    @property
    def num_layers(self) -> int: ...

    @property
    def num_heads(self) -> int:
        """The most heads of any layer."""
        ...

    @property
    def num_tokens(self) -> int:
        """Tokens of the first layer's maps."""
        ...

    @property
    def device(self) -> torch.device: ...

    last_norms: torch.Tensor  # token norms of the last block's output, float32, where the capture is kept

    @property
    def head_out(self) -> list[torch.Tensor]:
        """Per layer: the concatenated head outputs, the input of W_O."""
        ...

    def heads_at(self, layer: int) -> int: ...

    def tokens_at(self, layer: int) -> int: ...

    def rows(
        self, layer: int, heads: Picked = ..., queries: Picked = ..., out: Out = ..., temperature: float = ...
    ) -> torch.Tensor:
        """Softmax rows of one layer, ``[heads, queries, tokens]`` float32, on :attr:`device`
        (``heads``, ``queries``: None for all; ``out``: a tensor to write into; ``temperature``:
        ``softmax(scores / T)``)."""
        ...

    def storages(self) -> dict[tuple[str, int], int]: ...

    def nbytes(self) -> int: ...


class CaptureHooks(Protocol):
    """A model's capture hooks, for one forward pass at a time::

    with hooks.capturing():
        model.forward_features(x)
    per_image = hooks.results()
    """

    @property
    def layers(self) -> list[tuple[Any, str]]:
        """``(attention module, kind)`` per block."""
        ...

    @property
    def num_heads(self) -> int:
        """The most heads of any block."""
        ...

    @property
    def stages(self) -> list[Stage] | None:
        """Windowed models: the stages at the model's own input size; None for global attention."""
        ...

    def capturing(self, materialise: bool = False) -> AbstractContextManager[Any]: ...

    def results(self, to: torch.device | str | None = None) -> Sequence[CapturedAttention]: ...

    def materialise_pays(self, num_tokens: int) -> bool: ...


# The largest float32: 1/T for a tiny T saturates here instead of overflowing to inf.
_FLOAT32_MAX = float(torch.finfo(torch.float32).max)


def temper_(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """``logits`` becomes ``(logits - rowmax) / temperature`` in place, whose softmax is
    ``softmax(logits / temperature)``.

    Subtracting the row's maximum first keeps every finite ``temperature > 0`` finite: for a
    tiny T the scores go to 0 (the maximum) or -inf, so the row becomes one-hot (ties share),
    and for a huge T they go to 0 and the row becomes uniform, instead of inf - inf = NaN.
    """
    logits.sub_(logits.amax(dim=-1, keepdim=True))
    return logits.mul_(min(1.0 / temperature, _FLOAT32_MAX))


def detached(t: torch.Tensor) -> torch.Tensor:
    """``t`` out of the autograd graph: itself where it is in none (inference: a ``detach``
    is an operator the host dispatches, per hook and call), else a detached view."""
    return t.detach() if t.requires_grad else t


def store_output(sink: list):
    """A forward hook that keeps the module's output (detached: a view, no copy)."""

    def hook(module, args, output):
        sink.append(detached(output))

    return hook


def store_input(sink: list):
    """A forward pre-hook that keeps the module's first input (detached: a view, no copy)."""

    def hook(module, args):
        sink.append(detached(args[0]))

    return hook


def keep_graph_input(sink: list):
    """A forward pre-hook that keeps the module's first input in the autograd graph (relevance
    differentiates with respect to it)."""

    def hook(module, args):
        sink.append(args[0])

    return hook


def store_norms(sink: list):
    """A forward hook on the last block that keeps its output's token norms, ``[B, tokens]``
    (a ViT's ``[B, N, C]`` output, or a Swin stage's ``[B, H, W, C]`` grid row-major)."""

    def hook(module, args, output):
        x = detached(output)
        x = x if x.dtype == torch.float32 else x.float()
        sink.append((x if x.dim() == 3 else x.flatten(1, -2)).norm(dim=-1))  # B, N

    return hook
