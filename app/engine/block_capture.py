"""Attention capture for timm ViT blocks.

Two ways to get each head's q, k and v out of a block, chosen per attention class; every layer
keeps them, so any row, at any softmax temperature, and one head's whole computation
(:mod:`app.engine.explain`) can be recomputed later without another forward pass:

* ``qk``: for timm's plain ``Attention`` (vit, deit, dinov2, flexivit, siglip) the forward stays
  fused; one forward hook on ``qkv`` keeps its output, whose views q, k and v are, made as
  timm makes them when first read (:class:`QKVPart`; with QK-norm, q and k come from hooks on
  ``q_norm``/``k_norm`` instead, and v alone from ``qkv``). The rows a query asks for are
  recomputed from q and k exactly as the unfused branch would. No N x N matrix exists unless a
  caller asks for every row.
* ``sdpa``: for classes that change q and k after the last module that sees them or add a bias
  before the softmax (EVA applies RoPE after ``k_norm``; BEiT computes qkv with ``F.linear`` and
  adds a relative position bias), the forward stays fused too: while the attention module runs, a
  ``TorchFunctionMode`` records the arguments of its ``scaled_dot_product_attention`` call, i.e.
  q and k after RoPE, v, and the additive mask (BEiT's relative position bias), exactly as the
  model hands them to the kernel.

Callers that want every row of every map (``capturing(materialise=True)``, used for ``query=all``
and rollout) also keep every softmax matrix ("probs"): plain ``Attention`` runs its unfused
branch for the capture and a hook on ``attn_drop`` keeps the softmax output; for ``sdpa`` layers
the recorded call is answered with the same unfused math (q * scale @ k^T + mask, softmax, @ v)
instead of the fused kernel. One unfused forward costs less than a fused one plus recomputing
all N x N maps. The maps serve temperature 1 only; any other temperature is recomputed from q
and k.

Relevance (:mod:`app.engine.relevance`) differentiates the model's output with respect to every
softmax map: ``capturing(grad=True)`` materialises the maps the same way but keeps them in the
autograd graph, and :meth:`AttentionCapture.graph_maps` hands them over (``[B, H, N, N]`` per
layer) before :meth:`AttentionCapture.results` splits detached views per image.

A capture stays where the forward ran and keeps the forward's own tensors (no copies, no
device-to-host transfer): each image's q, k and head outputs are views of the batch's tensors.
Only the rows an answer asks for leave the device. Batch-mates therefore share buffers, which
:meth:`ImageAttention.storages` names so that a cache can charge each buffer once.

Either way a capture that did not fire once per block raises :class:`CaptureError`: a model that
silently returns no maps is the classic bug this module exists to prevent.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any, cast

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from .capture_base import (
    SUPPORTED_FAMILIES,
    CaptureError,
    UnsupportedModelError,
    detached,
    keep_graph_input,
    store_input,
    store_norms,
    store_output,
    temper_,
)


def _attention_kind(attn: nn.Module) -> str | None:
    from timm.layers.attention import Attention

    if type(attn) is Attention and isinstance(attn.q_norm, nn.Module) and getattr(attn, "gate", None) is None:
        return "qk"
    name = type(attn).__name__
    module = type(attn).__module__
    if name == "EvaAttention" or (name == "Attention" and module.endswith(".beit")):
        return "sdpa"
    return None


# Full maps (H*N*N floats) are kept while they add at most twice what every capture keeps
# (about 4*N*D = 4*N*H*head_dim floats: q, k, v and the head outputs), i.e. while
# N <= 8 * head_dim: see materialise_pays().
MATERIALISE_TOKENS_PER_HEAD_DIM = 8


def attention_layers(model: nn.Module) -> list[tuple[Any, str]]:
    """Return ``(attention_module, kind)`` for every block, or raise for unsupported models.

    The modules are typed ``Any``: their attributes (``q_norm``, ``fused_attn``, ``scale``...)
    differ between timm's attention classes and are checked at run time instead.

    Args:
        model: a timm model.
    """
    blocks = getattr(model, "blocks", None)
    if blocks is None or len(blocks) == 0:
        raise UnsupportedModelError(
            f"{type(model).__name__} has no transformer 'blocks' with global self-attention; "
            f"supported families: {SUPPORTED_FAMILIES}"
        )
    out: list[tuple[Any, str]] = []
    for i, blk in enumerate(blocks):
        attn = getattr(blk, "attn", None)
        kind = _attention_kind(attn) if attn is not None else None
        if kind is None:
            raise UnsupportedModelError(
                f"block {i} of {type(model).__name__} uses {type(attn).__name__}, which is not "
                f"global softmax self-attention Headscope can capture (channel, class-only or "
                f"pooled attention); supported families: {SUPPORTED_FAMILIES}"
            )
        if not hasattr(attn, "attn_drop") or not hasattr(attn, "fused_attn"):
            raise UnsupportedModelError(f"block {i}: attention has no attn_drop to hook")
        out.append((attn, kind))
    return out


@dataclass
class ImageAttention:
    """Everything captured for one image, for every layer, where the forward ran.

    Rows of the attention matrix are recomputed on demand from ``q``/``k`` (and ``bias``), or
    sliced from ``probs`` where a materialised capture kept them (temperature 1 only). Shapes:
    ``q``, ``k``, ``v``: ``[H, N, d]`` per layer, exactly as the model uses them (after QK-norm
    and RoPE); ``bias``: ``[H, N, N]`` (often a broadcast view) or None, what the model adds to
    ``q * scale @ k^T`` before the softmax (BEiT's relative position bias); ``probs``:
    ``[H, N, N]`` or None; ``last_norms``: ``[N]`` (token norms of the last block's output, for
    artifact tokens; float32); ``head_out``: ``[L, N, H*d_v]`` (the input of ``proj``: the per-head
    outputs concatenated, after the module's inner norm where it has one).
    """

    num_layers: int
    num_heads: int
    num_tokens: int
    scale: list[float]
    last_norms: torch.Tensor  # where the capture is kept, like the rest
    # The forward's batch this capture is a slice of (row ``index``), so that batch-mates' rows
    # are computed in one product per layer (:meth:`CaptureBatch.layer_rows`); None once moved or copied.
    batch: CaptureBatch | None = field(default=None, repr=False, compare=False)
    index: int = 0
    # q, k, v, probs, head_out and bias (the properties below): per layer, given, or made from
    # ``views`` when first read.
    per_layer: dict[str, list[torch.Tensor | None]] = field(default_factory=dict, repr=False)
    views: BatchViews | None = field(default=None, repr=False, compare=False)

    def _layers(self, name: str) -> list[Any]:
        got = self.per_layer.get(name)
        if got is None:
            got = self.views.of(name, self.index) if self.views is not None else []
            self.per_layer[name] = got
        return got

    @property
    def q(self) -> list[torch.Tensor | None]:
        return self._layers("q")

    @property
    def k(self) -> list[torch.Tensor | None]:
        return self._layers("k")

    @property
    def v(self) -> list[torch.Tensor | None]:
        return self._layers("v")

    @property
    def probs(self) -> list[torch.Tensor | None]:
        return self._layers("probs")

    @property
    def head_out(self) -> list[torch.Tensor]:
        return self._layers("head_out")

    @property
    def bias(self) -> list[torch.Tensor | None]:
        return self._layers("bias")

    def _kept(self) -> list[torch.Tensor]:
        """The tensors this capture holds: its views, or the batch tensors they would be views
        of where none is made yet (the same buffers)."""
        out = []
        for name in LAYER_TENSORS:
            src = self._layers(name) if name in self.per_layer or self.views is None else self.views.tensors[name]
            out += [t for t in src if t is not None]
        return out

    @property
    def device(self) -> torch.device:
        """Where the maps are kept (and computed): the device of the forward, or the host."""
        return self.last_norms.device

    def owned(self) -> ImageAttention:
        """This image's capture in memory of its own (every tensor copied), of no batch: what a
        result keeps without keeping its batch-mates' buffers alive."""
        copies = {n: [t.clone() if t is not None else None for t in self._layers(n)] for n in LAYER_TENSORS}
        return ImageAttention(
            self.num_layers,
            self.num_heads,
            self.num_tokens,
            list(self.scale),
            self.last_norms.clone(),
            per_layer=copies,
        )

    def heads_at(self, layer: int) -> int:
        """Heads of ``layer`` (the same for every layer here; windowed models differ per stage)."""
        return self.num_heads

    def tokens_at(self, layer: int) -> int:
        """Tokens of ``layer``'s maps (the same for every layer here)."""
        return self.num_tokens

    def storages(self) -> dict[tuple[str, int], int]:
        """Buffers this capture keeps alive, ``{(device, address): nbytes}``, each once.

        q and k are views of the forward's qkv tensor, and batch-mates are views of the same
        batch tensors: a cache charges each buffer once, however many captures use it.
        """
        tensors = [*self._kept(), self.last_norms]
        return {(str(t.device), t.untyped_storage().data_ptr()): t.untyped_storage().nbytes() for t in tensors}

    def nbytes(self) -> int:
        """Bytes of the buffers this capture keeps alive, whole: a buffer shared with batch-mates
        counts in full here; a cache charges it once through :meth:`storages`."""
        return sum(self.storages().values())

    def logits(
        self,
        layer: int,
        heads: list[int] | None = None,
        queries: list[int] | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Pre-softmax scores of one layer, ``[heads, queries, N]`` in float32, on :attr:`device`.

        ``q * scale @ k^T`` in the order of operations of timm's unfused branch, plus the
        additive bias the model uses (BEiT's relative position bias), if any.

        Args:
            layer: block index (0-based, non-negative).
            heads: head indices, or None for all.
            queries: query token indices, or None for all N.
            out: optional float32 ``[heads, queries, N]`` tensor on :attr:`device` to write into.
        """
        q, k = self.q[layer], self.k[layer]
        if q is None or k is None:
            raise CaptureError(f"layer {layer}: the capture kept no q and k")
        q, k = _take(q, heads, 0), _take(k, heads, 0)
        q = _take(q, queries, 1)
        # Same order of operations as timm's unfused branch: scale q, then q k^T, then the bias.
        # Contiguous operands, as CaptureBatch.layer_rows makes them: the same product for one image
        # alone and among batch-mates, bit for bit.
        q = (q.float() * self.scale[layer]).contiguous()
        logits = torch.matmul(q, k.float().contiguous().transpose(-2, -1), out=out)  # H, R, N
        bias = self.bias[layer] if self.bias else None
        if bias is not None:
            logits.add_(_take(_take(bias, heads, 0), queries, 1))
        return logits

    def rows(
        self,
        layer: int,
        heads: list[int] | None = None,
        queries: list[int] | None = None,
        out: torch.Tensor | None = None,
        temperature: float = 1.0,
    ) -> torch.Tensor:
        """Softmax attention of one layer, ``[heads, queries, N]`` in float32, on :attr:`device`.

        Args:
            layer: block index (0-based, non-negative).
            heads: head indices, or None for all.
            queries: query token indices, or None for all N rows.
            out: optional float32 ``[heads, queries, N]`` tensor on :attr:`device` to write into
                (no allocation).
            temperature: ``softmax(scores / temperature)``; 1 is the model itself.
        """
        p = self.probs[layer]
        if p is not None and temperature == 1.0:
            p = _take(_take(p, heads, 0), queries, 1)
            return out.copy_(p) if out is not None else p.float()
        logits = self.logits(layer, heads, queries, out)
        if temperature != 1.0:
            temper_(logits, temperature)
        return torch.softmax(logits, dim=-1, out=logits)


LAYER_TENSORS = ("q", "k", "v", "probs", "head_out", "bias")


class BatchViews:
    """Per layer, the batch tensors one image's views are taken from, when first read.

    Making every view of every image at once (an ``unbind`` per tensor and layer) was the
    largest part of a capture's host time, and the common answers (CLS rows, computed for
    batch-mates at once by :class:`CaptureBatch`) read none of them.

    Args:
        tensors: per name of :data:`LAYER_TENSORS`, per layer ``[B, ...]``, ``[1, ...]`` (one
            tensor for the whole batch: an attention mask) or None.
        batch_size: ``B``.
        heads: a bias's heads (a per-image ``[1, N, N]`` bias is expanded to ``[H, N, N]``).
        keep: what is done to each image's slice (None: the view itself). A tensor shared by
            the batch is kept once for every image.
    """

    def __init__(
        self,
        tensors: dict[str, Sequence[torch.Tensor | None]],
        batch_size: int,
        heads: int,
        keep: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ):
        self.tensors, self.batch_size, self.heads = tensors, batch_size, heads
        self.keep = keep or (lambda t: t)
        self._shared: dict[int, torch.Tensor] = {}  # id of a [1, ...] tensor -> its kept slice

    def of(self, name: str, b: int) -> list[torch.Tensor | None]:
        """Image ``b``'s slices of ``name``, one per layer."""
        out: list[torch.Tensor | None] = []
        for t in self.tensors[name]:
            if t is None:
                out.append(None)
                continue
            if t.shape[0] == self.batch_size:
                x = self.keep(t[b])
            else:
                if id(t) not in self._shared:
                    self._shared[id(t)] = self.keep(t[0])
                x = self._shared[id(t)]
            out.append(_expand_heads(x, self.heads) if name == "bias" else x)
        return out


@dataclass(eq=False)
class CaptureBatch:
    """One forward's capture, whole: per layer the batch's ``q``, ``k`` ``[B, H, N, d]``, the
    additive ``bias`` ``[B or 1, H or 1, N, N]`` (or None) and the maps ``probs`` ``[B, H, N, N]``
    (or None). What :class:`ImageAttention` holds views of, one image each."""

    q: Sequence[torch.Tensor]
    k: Sequence[torch.Tensor]
    scale: list[float]
    bias: list[torch.Tensor | None]
    probs: list[torch.Tensor | None]

    # Most bytes of keys :meth:`layer_rows` stacks for one product (a big batch's layers go one
    # by one: each is one product for the whole batch already).
    STACK_BYTES = 32 * 2**20

    def layer_rows(
        self,
        layers: list[int],
        images: list[int],
        heads: list[int] | None,
        queries: list[int] | None,
        out: torch.Tensor,
        temperature: float = 1.0,
    ) -> torch.Tensor:
        """:meth:`ImageAttention.rows` of the batch's ``images`` at once, for each of ``layers``,
        into ``out`` ``[layers, images, heads, queries, N]`` float32 (contiguous): the same
        operations in the same order as one image's, on the same contiguous operands, so the
        same numbers, bit for bit (a batched product over strided views is not).

        A layer is one product for all the images. Consecutive layers recomputed from q and k
        alike (no kept maps to slice, no bias, one scale) are one product and one softmax for
        the run, bounded to :attr:`STACK_BYTES` of stacked keys: a handful of operations instead
        of a handful per layer (on a GPU at batch 1 each is a kernel launch the device waits for).
        """
        run: list[int] = []  # positions in ``layers`` of the run being gathered
        run_bytes = 0

        def stacked(ts: list[torch.Tensor]) -> torch.Tensor:
            return ts[0].unsqueeze(0) if len(ts) == 1 else torch.stack(ts)

        def flush() -> None:
            if not run:
                return
            lo, hi, first = run[0], run[-1] + 1, layers[run[0]]
            p = self.probs[first]
            if p is not None and temperature == 1.0:  # a run of one
                out[lo].copy_(_take(_take(_take(p, images, 0), heads, 1), queries, 2))
                run.clear()
                return
            q = stacked([_take(_take(self._q_rows(layers[j], queries), images, 0), heads, 1) for j in run])
            k = stacked([_take(_take(self.k[layers[j]], images, 0), heads, 1) for j in run])  # R, B, H, N, d
            q = (q.float() * self.scale[first]).contiguous()  # R, B, H, Q, d
            logits = torch.matmul(q, k.float().contiguous().transpose(-2, -1), out=out[lo:hi])  # R, B, H, Q, N
            bias = self.bias[first]
            if bias is not None:  # a run of one
                bias = bias if bias.shape[0] == 1 else _take(bias, images, 0)
                bias = bias if bias.shape[1] == 1 else _take(bias, heads, 1)
                logits[0].add_(_take(bias, queries, 2))
            if temperature != 1.0:
                temper_(logits, temperature)
            torch.softmax(logits, dim=-1, out=logits)
            run.clear()

        for j, layer in enumerate(layers):
            k = self.k[layer]
            alike = self.bias[layer] is None and (self.probs[layer] is None or temperature != 1.0)
            if run and not (alike and self.scale[layer] == self.scale[layers[run[0]]]):
                flush()
            nbytes = len(images) * (len(heads) if heads is not None else k.shape[1]) * k.shape[2] * k.shape[3] * 4
            if run and run_bytes + nbytes > self.STACK_BYTES:
                flush()
            if not run:
                run_bytes = 0
            run.append(j)
            run_bytes += nbytes
            if not alike:
                flush()
        flush()
        return out

    def _q_rows(self, layer: int, queries: list[int] | None) -> torch.Tensor:
        """``q`` of ``layer`` at the tokens ``queries``, ``[B, H, Q, d]``."""
        if isinstance(self.q, LazyLayers):
            return self.q.rows(layer, queries)
        return _take(self.q[layer], queries, 2)


def _take(t: torch.Tensor, idx: list[int] | None, dim: int) -> torch.Tensor:
    """``t`` indexed along ``dim``: itself for all indices in order, a view for a contiguous run."""
    if idx is None:
        return t
    n = t.shape[dim]
    if len(idx) == n and idx == list(range(n)):
        return t
    if idx == list(range(idx[0], idx[0] + len(idx))):
        return t.narrow(dim, idx[0], len(idx))
    return t.index_select(dim, torch.tensor(idx, dtype=torch.long, device=t.device))


class AttentionCapture:
    """Hooks every block's attention of ``model`` for one forward pass at a time.

    Usage::

        cap = AttentionCapture(model)
        with cap.capturing():
            model(x)
        per_image = cap.results()  # list[ImageAttention], one per batch item
    """

    stages: None = None  # global attention: one token sequence for every layer

    def __init__(self, model: nn.Module):
        self.model = model
        self.layers = attention_layers(model)
        self.num_heads: int = self.layers[0][0].num_heads
        self._reset()

    def materialise_pays(self, num_tokens: int) -> bool:
        """Whether ``capturing(materialise=True)`` is worth it for ``num_tokens`` tokens.

        In compute it always is (a fused forward plus recomputing every map does the same
        softmax work and more); in memory the full maps grow with N^2 while q/k/v grow with N.
        Every layer keeps about 4*N*D floats (q, k and v, views of qkv, plus the head outputs);
        the maps add H*N*N. They are kept while they add at most twice that, i.e. up to
        N = 8 * head_dim tokens (512 for 64-dim heads: 224 px squares yes, a 640x200 picture
        with 817 tokens no: 192 MB of maps on top of 60 MB for ViT-S).
        """
        return all(num_tokens <= MATERIALISE_TOKENS_PER_HEAD_DIM * head_dim(attn) for attn, _ in self.layers)

    def _reset(self) -> None:
        n = len(self.layers)
        self._qkv: list[list[torch.Tensor]] = [[] for _ in range(n)]  # qkv's output, B, N, 3 * H * d
        self._q: list[list[torch.Tensor]] = [[] for _ in range(n)]  # QK-norm's q and k, B, H, N, d
        self._k: list[list[torch.Tensor]] = [[] for _ in range(n)]
        self._sdpa: list[list[_SdpaCall]] = [[] for _ in range(n)]
        self._p: list[list[torch.Tensor]] = [[] for _ in range(n)]
        self._norms: list[torch.Tensor] = []
        self._heads: list[list[torch.Tensor]] = [[] for _ in range(n)]
        self._materialise = False

    @contextmanager
    def capturing(self, materialise: bool = False, grad: bool = False) -> Iterator[AttentionCapture]:
        """Install the hooks (and switch fused attention off or on where needed) for the block.

        Args:
            materialise: also keep every layer's full softmax matrix (from the unfused
                branch, or the same math for ``sdpa`` layers). For callers that want every
                row: the unfused forward costs less than recomputing all N x N maps after a
                fused one (bench/: +3 ms vs +8 ms per image for ViT-S/14 at 224 on 2 CPU cores).
            grad: keep the maps in the autograd graph (implies ``materialise``); the forward
                must run with gradients enabled. :meth:`graph_maps` returns them.
        """
        self._reset()
        self._materialise = materialise or grad
        materialise = self._materialise
        keep = keep_graph_input if grad else store_input
        blocks: nn.Sequential = self.model.blocks  # type: ignore[assignment]  # every supported family
        # What undoes the block, in reverse order: a plain list, not an ExitStack (its callbacks
        # cost a call's host more than the hooks themselves at batch 1).
        undo: list[Callable[[], Any]] = []

        def fused(attn: Any, value: bool) -> None:
            if attn.fused_attn != value:
                undo.append(partial(setattr, attn, "fused_attn", attn.fused_attn))
                attn.fused_attn = value

        try:
            for i, (attn, kind) in enumerate(self.layers):
                if kind == "qk":
                    # qkv's output, whose views q, k and v are (made from it when first read:
                    # each view is an operator the host dispatches, and a CLS-rows answer reads
                    # only k and q's rows); with QK-norm, q and k as the norms give them.
                    # Without it one hook, not three (each hooked module call costs the host a
                    # few microseconds, per layer and call).
                    undo.append(attn.qkv.register_forward_hook(store_output(self._qkv[i])).remove)
                    if not _plain_qk(attn):
                        undo.append(attn.q_norm.register_forward_hook(store_output(self._q[i])).remove)
                        undo.append(attn.k_norm.register_forward_hook(store_output(self._k[i])).remove)
                    if materialise:
                        fused(attn, False)
                        undo.append(attn.attn_drop.register_forward_pre_hook(keep(self._p[i])).remove)
                else:
                    # The fused call is what records q, k, v and the mask.
                    fused(attn, True)
                    tap = _SdpaTap(self._sdpa[i], float(attn.scale), materialise, grad)
                    undo.append(attn.register_forward_pre_hook(tap.enter).remove)
                    undo.append(attn.register_forward_hook(tap.exit).remove)
                    undo.append(tap.close)  # if the forward raised inside the module
                undo.append(attn.proj.register_forward_pre_hook(store_input(self._heads[i])).remove)
            # Only the last block's token norms are used (artifact tokens); one hook, not L.
            undo.append(blocks[-1].register_forward_hook(store_norms(self._norms)).remove)
            yield self
        finally:
            for step in reversed(undo):
                step()

    def _check_fired(self) -> None:
        """Raise :class:`CaptureError` unless every hook fired exactly once."""
        L = len(self.layers)
        for i, (attn, kind) in enumerate(self.layers):
            if kind == "qk":
                norms = [] if _plain_qk(attn) else [len(self._q[i]), len(self._k[i])]
                got = [len(self._qkv[i]), *norms] + ([len(self._p[i])] if self._materialise else [])
            else:
                got = [len(self._sdpa[i])]
            got += [len(self._heads[i])] + ([len(self._norms)] if i == L - 1 else [])
            if any(n != 1 for n in got):
                fired = next(n for n in got if n != 1)
                raise CaptureError(
                    f"attention capture of layer {i} fired {fired} time(s), expected once per "
                    f"forward; was the model called inside capturing() exactly once?"
                )

    def graph_maps(self) -> list[torch.Tensor]:
        """Every layer's softmax maps of the last capture, ``[B, H, N, N]``, as the forward made
        them (in the autograd graph after ``capturing(grad=True)``); call before :meth:`results`.

        Raises:
            CaptureError: the capture kept no maps (not materialised) or did not fire once per block.
        """
        if not self._materialise:
            raise CaptureError("graph_maps() needs a capture with materialise=True or grad=True")
        self._check_fired()
        maps = [self._p[i][0] if kind == "qk" else self._sdpa[i][0].probs for i, (_, kind) in enumerate(self.layers)]
        if any(p is None for p in maps):
            raise CaptureError("a layer's softmax maps were not kept")
        return cast(list[torch.Tensor], maps)

    def discard(self) -> None:
        """Let the last capture go without splitting it per image (a caller that needed only
        :meth:`graph_maps`)."""
        self._reset()

    def results(self, to: torch.device | str | None = None) -> list[ImageAttention]:
        """Split the last capture into per-image captures; raise if anything is missing.

        Args:
            to: a device to move the captures to (e.g. ``"cpu"`` to keep a GPU's memory for
                the forward); None keeps them where the forward ran, as views of its tensors.
        """
        L = len(self.layers)
        kinds = [kind for _, kind in self.layers]
        self._check_fired()
        B, N, _ = self._heads[0][0].shape  # batch, tokens, heads * head dim
        H = self.num_heads
        move = to is not None and torch.device(to) != self._heads[0][0].device

        # Per layer, the batch's q, k, v [B, H, N, d] (None: a view of qkv's output, made when
        # first read), mask (None or [B or 1, H or 1, N, N]) and maps [B, H, N, N] or None.
        layers: list[tuple[Any, Any, Any, torch.Tensor | None, torch.Tensor | None]] = []
        raws: list[torch.Tensor | None] = [None] * L
        for i, kind in enumerate(kinds):
            if kind == "qk":
                raw = raws[i] = self._qkv[i][0]
                if raw.dim() != 3 or raw.shape[:2] != (B, N) or raw.shape[2] % (3 * H):
                    raise CaptureError(f"layer {i}: qkv of shape {tuple(raw.shape)}, expected ({B}, {N}, 3 * {H} * d)")
                q, k, v, mask = self._q[i][0] if self._q[i] else None, self._k[i][0] if self._k[i] else None, None, None
                p = self._p[i][0] if self._materialise else None
            else:
                call = self._sdpa[i][0]
                q, k, v, mask, p = call.q, call.k, call.v, call.mask, call.probs
            for name, t in (("q", q), ("k", k), ("v", v)):
                if t is not None and (t.dim() != 4 or t.shape[:3] != (B, H, N)):
                    raise CaptureError(f"layer {i}: {name} of shape {tuple(t.shape)}, expected ({B}, {H}, {N}, d)")
            if p is not None:
                # Maps from a reduced-precision forward become float32 once per layer, not per
                # image; detached: a capture never keeps an autograd graph alive.
                p = detached(p)
                p = p if p.dtype == torch.float32 else p.float()
                if p.shape != (B, H, N, N):
                    raise CaptureError(f"layer {i}: attention of shape {tuple(p.shape)}, expected ({B}, {H}, {N}, {N})")
            layers.append((q, k, v, _as_additive(mask, B, H, N, i), p))

        def split(j: int) -> LazyLayers:
            return LazyLayers(
                [
                    t if t is not None else QKVPart(cast(torch.Tensor, raws[i]), H, j)
                    for i, t in enumerate(row[j] for row in layers)
                ]
            )

        qs, ks = split(0), split(1)
        bias, probs = [m for *_, m, _ in layers], [p for *_, p in layers]
        per_layer: dict[str, Sequence[torch.Tensor | None]] = {
            "q": qs,
            "k": ks,
            "v": split(2),
            "bias": bias,
            "probs": probs,
            "head_out": [h[0] for h in self._heads],
        }
        scale = [float(a.scale) for a, _ in self.layers]
        # The last block's token norms stay where the forward ran too: a copy to the host would
        # wait for the forward here, and on a GPU everything here is done while it still runs.
        norms = self._norms[0]  # B, N float32
        if move:
            # Each image's part copied there on its own (views of a moved batch would keep all of
            # it alive); a mask shared by the batch (``[1, ...]``) is copied once.
            moved = BatchViews(per_layer, B, H, keep=lambda t: t.to(to).contiguous())
            return self._done(
                [
                    ImageAttention(
                        L, H, N, list(scale), moved.keep(norms[b]), per_layer={n: moved.of(n, b) for n in LAYER_TENSORS}
                    )
                    for b in range(B)
                ]
            )
        # Views of the forward's tensors, made when first read: nothing else holds them once the
        # forward is done, and copying apart would cost more than the hooks (1.4 ms/img on 2 CPU
        # cores at B=8; on a GPU, a kernel launch per tensor and image).
        batch = CaptureBatch(q=qs, k=ks, scale=scale, bias=bias, probs=probs)
        views = BatchViews(per_layer, B, H)
        return self._done(
            [
                ImageAttention(L, H, N, list(scale), last, batch=batch, index=b, views=views)
                for b, last in enumerate(norms.unbind(0))
            ]
        )

    def _done(self, out: list[ImageAttention]) -> list[ImageAttention]:
        self._reset()
        return out


def _plain_qk(attn: Any) -> bool:
    """Whether ``attn`` uses q and k as ``qkv`` makes them (no QK-norm: identity modules)."""
    children = attn._modules  # not nn.Module.__getattr__: this runs per layer and call
    return isinstance(children.get("q_norm"), nn.Identity) and isinstance(children.get("k_norm"), nn.Identity)


@dataclass(frozen=True)
class QKVPart:
    """q, k or v (``which`` 0, 1, 2) of ``qkv``'s output ``[B, N, 3 * H * d]``, not made yet."""

    qkv: torch.Tensor
    heads: int
    which: int

    def view(self, rows: tuple[int, int] | None = None) -> torch.Tensor:
        """``[B, H, N, d]`` (``rows``: ``(first, count)`` of the tokens only): the view timm's
        ``reshape(B, N, 3, H, d).permute(2, 0, 3, 1, 4).unbind(0)`` makes, with the same strides
        (the same numbers in every later product), in one operator, not three or four."""
        qkv, H = self.qkv, self.heads
        B, N, C = qkv.shape  # batch, tokens, 3 * heads * head dim
        d = C // (3 * H)
        first, count = rows if rows is not None else (0, N)
        if not qkv.is_contiguous():  # reshape would copy: timm's own operators
            t = qkv.reshape(B, N, 3, H, d).permute(2, 0, 3, 1, 4)[self.which]
            return t if rows is None else t.narrow(2, first, count)
        return qkv.as_strided((B, H, count, d), (N * C, d, C, 1), qkv.storage_offset() + first * C + self.which * H * d)


class LazyLayers(Sequence):
    """Per layer, a tensor, made when first read where it is a `QKVPart` (q, k and v are views of
    qkv's output: each view is an operator the host dispatches, about a kernel launch's time on
    a GPU at batch 1, and the CLS rows read only k and q's first row).

    Args:
        items: per layer a tensor, None, or a `QKVPart`.
    """

    def __init__(self, items: list[Any]):
        self._items = items

    def __len__(self) -> int:
        return len(self._items)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        t = self._items[i]
        if isinstance(t, QKVPart):
            t = self._items[i] = t.view()
        return t

    def __iter__(self) -> Iterator[Any]:
        return (self[i] for i in range(len(self)))

    def rows(self, i: int, queries: list[int] | None) -> torch.Tensor:
        """Layer ``i``'s tensor ``[B, H, N, d]`` at the tokens ``queries`` only (None: all), in one
        view where it is not made yet and they are a run."""
        t = self._items[i]
        if isinstance(t, QKVPart) and queries and queries == list(range(queries[0], queries[0] + len(queries))):
            return t.view((queries[0], len(queries)))
        return _take(self[i], queries, 2)


def head_dim(attn: nn.Module) -> int:
    """Channels per head of an attention module (BEiT's keeps no ``head_dim`` attribute)."""
    d = getattr(attn, "head_dim", None)
    if d is not None:
        return int(d)
    proj = cast(nn.Linear, attn.proj)
    return proj.in_features // int(cast(int, attn.num_heads))


@dataclass
class _SdpaCall:
    """What one ``scaled_dot_product_attention`` call of an attention module was given."""

    q: torch.Tensor  # B, H, N, d
    k: torch.Tensor  # B, H, N, d
    v: torch.Tensor  # B, H, N, d
    mask: torch.Tensor | None  # additive or boolean, broadcastable to B, H, N, N
    probs: torch.Tensor | None = None  # B, H, N, N when materialised


def _sdpa_arg(args: tuple, kwargs: dict, i: int, name: str, default: Any = None) -> Any:
    return args[i] if len(args) > i else kwargs.get(name, default)


class _SdpaTap(TorchFunctionMode):
    """Records the arguments of the ``scaled_dot_product_attention`` calls made while active.

    Entered by a forward pre-hook on one attention module and left by its forward hook, so it
    sees that module's call only. With ``materialise`` the call is answered with timm's
    unfused math (``q * scale @ k^T + mask``, softmax, ``@ v``) and the softmax is kept.

    Args:
        sink: where each call's :class:`_SdpaCall` goes.
        scale: the module's scale (what its unfused branch multiplies q by).
        materialise: keep the softmax matrix.
        grad: keep it in the autograd graph (not detached).
    """

    def __init__(self, sink: list, scale: float, materialise: bool, grad: bool = False):
        super().__init__()
        self.sink, self.scale, self.materialise, self.grad = sink, scale, materialise, grad
        self.active = False

    def enter(self, module: nn.Module, args: tuple) -> None:
        self.__enter__()
        self.active = True

    def exit(self, module: nn.Module, args: tuple, output: Any) -> None:
        self.close()

    def close(self) -> None:
        if self.active:
            self.active = False
            self.__exit__(None, None, None)

    def __torch_function__(self, func: Callable, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is not F.scaled_dot_product_attention:
            return func(*args, **kwargs)
        q, k, v = (_sdpa_arg(args, kwargs, i, n) for i, n in enumerate(("query", "key", "value")))
        mask = _sdpa_arg(args, kwargs, 3, "attn_mask")
        scale = kwargs.get("scale")
        if _sdpa_arg(args, kwargs, 5, "is_causal", False) or _sdpa_arg(args, kwargs, 4, "dropout_p", 0.0):
            raise CaptureError("causal or dropout attention is not softmax self-attention Headscope can capture")
        if scale is not None and not math.isclose(scale, self.scale, rel_tol=1e-6):
            raise CaptureError(f"attention called with scale {scale}, the module's is {self.scale}")
        if scale is None and not math.isclose(q.shape[-1] ** -0.5, self.scale, rel_tol=1e-6):
            raise CaptureError(f"attention of head dim {q.shape[-1]} uses the default scale, not {self.scale}")
        call = _SdpaCall(q.detach(), k.detach(), v.detach(), None if mask is None else mask.detach())
        self.sink.append(call)
        if not self.materialise:
            return func(*args, **kwargs)
        # timm's unfused branch, written out (fused_attn=False runs the same operations).
        attn = (q * self.scale) @ k.transpose(-2, -1)  # B, H, N, N
        B, H, N, _ = attn.shape
        bias = _as_additive(mask, B, H, N, layer=None)
        if bias is not None:
            attn = attn + bias
        attn = attn.softmax(dim=-1)
        call.probs = attn if self.grad else attn.detach()
        return attn @ v


def _as_additive(mask: torch.Tensor | None, B: int, H: int, N: int, layer: int | None) -> torch.Tensor | None:
    """An attention mask as an additive float ``[B or 1, H or 1, N, N]`` view (or None)."""
    if mask is None:
        return None
    if mask.dtype == torch.bool:  # True = takes part (SDPA's convention)
        mask = torch.zeros(mask.shape, device=mask.device).masked_fill(~mask, float("-inf"))
    while mask.dim() < 4:
        mask = mask.unsqueeze(0)
    ok = mask.dim() == 4 and mask.shape[0] in (1, B) and mask.shape[1] in (1, H) and mask.shape[2:] == (N, N)
    if not ok:
        where = f"layer {layer}: " if layer is not None else ""
        raise CaptureError(f"{where}attention mask of shape {tuple(mask.shape)} does not fit ({B}, {H}, {N}, {N})")
    return mask


def _expand_heads(bias: torch.Tensor | None, H: int) -> torch.Tensor | None:
    """A per-image ``[H or 1, N, N]`` bias as ``[H, N, N]`` (a broadcast view, no copy)."""
    return None if bias is None else bias.expand(H, *bias.shape[1:])
