"""Attention capture for timm ViT blocks.

Two ways to get ``softmax(Q K^T / sqrt(d))`` out of a block, chosen per attention class:

* ``qk``: for timm's plain ``Attention`` (vit, deit, dinov2, flexivit, siglip) the forward stays
  fused; forward hooks on ``q_norm``/``k_norm`` (identity modules unless the model uses QK-norm)
  keep q and k, and the rows a query asks for are recomputed from them exactly as the unfused
  branch would. No N x N matrix exists unless a caller asks for every row.
* ``probs``: for classes that add something between q k^T and the softmax (EVA's RoPE is applied
  after ``k_norm``; BEiT adds a relative position bias), fused attention is switched off for the
  duration of the capture and a hook on ``attn_drop`` (identity at eval) keeps the softmax output.
  Callers that want every row of every map (``capturing(materialise=True)``, used for
  ``query=all`` and rollout) get this branch for plain ``Attention`` too: one unfused forward
  costs less than a fused one plus recomputing all N x N maps.

A capture stays where the forward ran and keeps the forward's own tensors (no copies, no
device-to-host transfer): each image's q, k and head outputs are views of the batch's tensors.
Only the rows an answer asks for leave the device. Batch-mates therefore share buffers, which
:meth:`ImageAttention.storages` names so that a cache can charge each buffer once.

Either way a capture that did not fire once per block raises :class:`CaptureError`: a model that
silently returns no maps is the classic bug this module exists to prevent.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.nn as nn

if TYPE_CHECKING:
    from .windows import WindowCapture

SUPPORTED_FAMILIES = (
    "vit, deit (incl. distilled), dinov2 (with and without registers), flexivit, siglip, "
    "eva/eva02 (RoPE), beit (relative position bias), swin and swinv2 (windowed, one grid per stage)"
)


class CaptureError(RuntimeError):
    """A capture came back empty, incomplete or malformed."""


class UnsupportedModelError(ValueError):
    """The model's attention blocks are of a kind Headscope cannot capture."""


def _attention_kind(attn: nn.Module) -> str | None:
    from timm.layers.attention import Attention

    if type(attn) is Attention and isinstance(attn.q_norm, nn.Module) and getattr(attn, "gate", None) is None:
        return "qk"
    name = type(attn).__name__
    module = type(attn).__module__
    if name == "EvaAttention" or (name == "Attention" and module.endswith(".beit")):
        return "probs"
    return None


# Full maps (H*N*N floats) are kept while they are at most twice what a q/k capture keeps
# (about 4*N*D = 4*N*H*head_dim floats), i.e. while N <= 8 * head_dim: see materialise_pays().
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
        if not hasattr(attn, "attn_drop"):
            raise UnsupportedModelError(f"block {i}: attention has no attn_drop to hook")
        out.append((attn, kind))
    return out


@dataclass
class ImageAttention:
    """Everything captured for one image, for every layer, where the forward ran.

    Rows of the attention matrix are recomputed on demand from ``q``/``k`` (``qk`` layers) or
    sliced from ``probs`` (``probs`` layers). Shapes: ``q``, ``k``: ``[H, N, d]``;
    ``probs``: ``[H, N, N]``; ``last_norms``: ``[N]`` (token norms of the last block's output, for
    artifact tokens);
    ``head_out``: ``[L, N, H*d_v]`` (the per-head outputs concatenated, before ``proj``).
    """

    num_layers: int
    num_heads: int
    num_tokens: int
    q: list[torch.Tensor | None]
    k: list[torch.Tensor | None]
    scale: list[float]
    probs: list[torch.Tensor | None]
    last_norms: torch.Tensor  # on the host
    head_out: list[torch.Tensor] = field(default_factory=list)

    @property
    def device(self) -> torch.device:
        """Where the maps are kept (and computed): the device of the forward, or the host."""
        return self.head_out[0].device

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
        tensors = [t for t in (*self.q, *self.k, *self.probs, *self.head_out) if t is not None]
        tensors.append(self.last_norms)
        return {(str(t.device), t.untyped_storage().data_ptr()): t.untyped_storage().nbytes() for t in tensors}

    def nbytes(self) -> int:
        """Bytes of the buffers this capture keeps alive, whole: a buffer shared with batch-mates
        counts in full here; a cache charges it once through :meth:`storages`."""
        return sum(self.storages().values())

    def rows(
        self, layer: int, heads: list[int] | None = None, rows: list[int] | None = None, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Softmax attention of one layer, ``[heads, rows, N]`` in float32, on :attr:`device`.

        Args:
            layer: block index (0-based, non-negative).
            heads: head indices, or None for all.
            rows: query token indices, or None for all N rows.
            out: optional float32 ``[heads, rows, N]`` tensor on :attr:`device` to write into
                (no allocation).
        """
        p = self.probs[layer]
        if p is not None:
            p = _take(_take(p, heads, 0), rows, 1)
            return out.copy_(p) if out is not None else p.float()
        q, k = self.q[layer], self.k[layer]
        assert q is not None and k is not None  # a layer keeps either its probs or its q and k
        q, k = _take(q, heads, 0), _take(k, heads, 0)
        q = _take(q, rows, 1)
        # Same order of operations as timm's unfused branch: scale q, then q k^T, then softmax.
        q = q.float() * self.scale[layer]
        logits = torch.matmul(q, k.float().transpose(-2, -1), out=out)  # H, R, N
        return torch.softmax(logits, dim=-1, out=logits)


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

    def __init__(self, model: nn.Module):
        self.model = model
        self.layers = attention_layers(model)
        self.num_heads: int = self.layers[0][0].num_heads
        self._reset()

    def materialise_pays(self, num_tokens: int) -> bool:
        """Whether ``capturing(materialise=True)`` is worth it for ``num_tokens`` tokens.

        In compute it always is (a fused forward plus recomputing every map does the same
        softmax work and more); in memory the full maps grow with N^2 while q/k grow with N. A
        ``qk`` layer keeps about 4*N*D floats (q and k are views of qkv, which keeps v, plus the
        head outputs); its maps are H*N*N. The unfused branch is taken while the maps are at
        most twice that, i.e. up to N = 8 * head_dim tokens (512 for 64-dim heads: 224 px
        squares yes, a 640x200 picture with 817 tokens no: 192 MB of maps against 60 MB for ViT-S).
        """
        dims = [getattr(attn, "head_dim", None) for attn, kind in self.layers if kind == "qk"]
        return all(d is not None and num_tokens <= MATERIALISE_TOKENS_PER_HEAD_DIM * d for d in dims)

    def _reset(self) -> None:
        n = len(self.layers)
        self._q: list[list[torch.Tensor]] = [[] for _ in range(n)]
        self._k: list[list[torch.Tensor]] = [[] for _ in range(n)]
        self._p: list[list[torch.Tensor]] = [[] for _ in range(n)]
        self._norms: list[torch.Tensor] = []
        self._heads: list[list[torch.Tensor]] = [[] for _ in range(n)]
        self._kinds = [kind for _, kind in self.layers]

    @contextmanager
    def capturing(self, materialise: bool = False) -> Iterator[AttentionCapture]:
        """Install the hooks (and switch fused attention off where needed) for the block.

        Args:
            materialise: keep every layer's full softmax matrix from the unfused branch instead
                of q and k. For callers that want every row: the unfused forward costs less
                than recomputing all N x N maps after a fused one (bench/: +3 ms vs +8 ms per
                image for ViT-S/14 at 224 on 2 CPU cores).
        """
        self._reset()
        self._kinds = ["probs" if materialise else kind for _, kind in self.layers]
        blocks: nn.Sequential = self.model.blocks  # type: ignore[assignment]  # every supported family
        with ExitStack() as stack:
            for i, (attn, kind) in enumerate(self.layers):
                if kind == "qk" and not materialise:
                    stack.callback(attn.q_norm.register_forward_hook(self._store(self._q[i])).remove)
                    stack.callback(attn.k_norm.register_forward_hook(self._store(self._k[i])).remove)
                else:
                    was_fused = attn.fused_attn
                    attn.fused_attn = False
                    stack.callback(setattr, attn, "fused_attn", was_fused)
                    stack.callback(attn.attn_drop.register_forward_pre_hook(self._store_input(self._p[i])).remove)
                stack.callback(attn.proj.register_forward_pre_hook(self._store_input(self._heads[i])).remove)
            # Only the last block's token norms are used (artifact tokens); one hook, not L.
            stack.callback(blocks[-1].register_forward_hook(self._store_norm(self._norms)).remove)
            yield self

    @staticmethod
    def _store(sink: list):
        def hook(module, args, output):
            sink.append(output.detach())

        return hook

    @staticmethod
    def _store_input(sink: list):
        def hook(module, args):
            sink.append(args[0].detach())

        return hook

    @staticmethod
    def _store_norm(sink: list):
        def hook(module, args, output):
            sink.append(output.detach().float().norm(dim=-1))  # B, N

        return hook

    def results(self, to: torch.device | str | None = None) -> list[ImageAttention]:
        """Split the last capture into per-image captures; raise if anything is missing.

        Args:
            to: a device to move the captures to (e.g. ``"cpu"`` to keep a GPU's memory for
                the forward); None keeps them where the forward ran, as views of its tensors.
        """
        L = len(self.layers)
        for i, kind in enumerate(self._kinds):
            got = (len(self._q[i]), len(self._k[i])) if kind == "qk" else (len(self._p[i]),) * 2
            if got != (1, 1) or len(self._heads[i]) != 1 or (i == L - 1 and len(self._norms) != 1):
                raise CaptureError(
                    f"attention capture of layer {i} fired {got[0]} time(s), expected once per "
                    f"forward; was the model called inside capturing() exactly once?"
                )
        B, N, _ = self._heads[0][0].shape  # batch, tokens, heads * head dim
        H = self.num_heads
        move = to is not None and torch.device(to) != self._heads[0][0].device

        def keep(t: torch.Tensor) -> torch.Tensor:
            # Views of the forward's tensors: nothing else holds them once the forward is
            # done, and copying apart would cost more than the hooks (1.4 ms/img on 2 CPU
            # cores at B=8; on a GPU, a kernel launch per tensor and image).
            return t.to(to).contiguous() if move else t

        # Maps from a reduced-precision forward become float32 once per layer, not per image.
        probs = {i: self._p[i][0].float() for i, kind in enumerate(self._kinds) if kind == "probs"}
        norms = self._norms[0].to("cpu", torch.float32)  # B, N: a few KB, always on the host
        out = []
        for b in range(B):
            q: list[torch.Tensor | None] = []
            k: list[torch.Tensor | None] = []
            p: list[torch.Tensor | None] = []
            for i, kind in enumerate(self._kinds):
                if kind == "qk":
                    qi, ki = self._q[i][0][b], self._k[i][0][b]  # H, N, d
                    if qi.shape[:2] != (H, N) or ki.shape[:2] != (H, N):
                        raise CaptureError(f"layer {i}: q/k of shape {tuple(qi.shape)}, expected ({H}, {N}, d)")
                    q.append(keep(qi))
                    k.append(keep(ki))
                    p.append(None)
                else:
                    pi = probs[i][b]  # H, N, N
                    if pi.shape != (H, N, N):
                        raise CaptureError(f"layer {i}: attention of shape {tuple(pi.shape)}, expected ({H}, {N}, {N})")
                    p.append(keep(pi))
                    q.append(None)
                    k.append(None)
            out.append(
                ImageAttention(
                    num_layers=L,
                    num_heads=H,
                    num_tokens=N,
                    q=q,
                    k=k,
                    scale=[float(a.scale) for a, _ in self.layers],
                    probs=p,
                    last_norms=norms[b].clone(),
                    head_out=[keep(h[0][b]) for h in self._heads],
                )
            )
        self._reset()
        return out


def capture_for(model: nn.Module) -> AttentionCapture | WindowCapture:
    """The capture that fits ``model``: windows for Swin v1/v2, else global attention blocks.

    Raises:
        UnsupportedModelError: neither fits; the message lists the supported families.
    """
    from .windows import WindowCapture, is_windowed

    return WindowCapture(model) if is_windowed(model) else AttentionCapture(model)
