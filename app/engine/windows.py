"""Windowed attention (Swin v1 and v2): each window's softmax, mapped back to its stage's grid.

A Swin block attends inside non-overlapping ``W x W`` windows of its stage's grid. Every second
block first rolls the grid by ``-shift`` (half a window), so that windows straddle the previous
block's window borders, and adds a mask (-100 before the softmax) between cells that the cyclic
roll brought together from opposite edges. A grid that is not a multiple of the window is padded
at the bottom and right (after the roll) with zero tokens, which the queries attend to like any
other key. The scores add a relative position bias: a learned table in v1; in v2 a small MLP of
log-spaced offsets (``16 * sigmoid``) added to cosine similarities scaled by a learned, clamped
``logit_scale``.

The capture keeps the softmax as the block computed it, one ``[nW, H, W*W, W*W]`` tensor per
layer (a hook on ``attn_drop``, the identity at eval), the windows' tokens that entered the
attention module (``[nW, W*W, C]``, after the roll, the padding and v1's pre-norm) with the mask
the block passed it, and maps the softmax to rows on demand:

* a row is the attention of one query cell over *its stage's* grid, row-major, 0 for every
  cell outside the query's window;
* in shifted blocks the window and the mask are those of the rolled grid, but rows and columns
  are named in the image's own (unrolled) grid: the keys of a query near the bottom edge may
  sit at the top of the image;
* padding cells are no cells of the grid and never appear; the weight a query gives them is
  part of the softmax, so a row of a window that hangs over the grid's edge sums to less
  than 1 (the rest went to the padding).

The windows' tokens are what a softmax temperature and the explain view need: the block's real
logits (q, k and the bias from the module's own weights, plus the captured mask) are recomputed
for the few windows a request touches (:mod:`app.engine.window_math`), instead of keeping q, k
and v of every window (three times the tokens' memory).

Dense ``[H, N, N]`` stage maps are never stored (3136 cells at stage 0 of Swin-T at 224 px: 118 MB
per layer for 3 heads against 1.8 MB of windows).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn

from .capture_base import SUPPORTED_FAMILIES, CaptureError, UnsupportedModelError, store_input, store_norms, temper_
from .layout import Stage, stage_of, tiles
from .window_math import window_logits

# timm modules whose WindowAttention this module knows (swin_transformer_v2_cr is another design).
WINDOWED_MODULES = ("swin_transformer", "swin_transformer_v2")


def _window_attention_kind(attn: Any) -> str | None:
    """``v1`` / ``v2`` for timm's own Swin ``WindowAttention`` classes, else None (no subclasses)."""
    from timm.models import swin_transformer, swin_transformer_v2

    if type(attn) is swin_transformer.WindowAttention:
        return "v1"
    if type(attn) is swin_transformer_v2.WindowAttention:
        return "v2"
    return None


def is_windowed(model: Any) -> bool:
    """Whether ``model`` is a timm Swin v1/v2 whose windows this module can capture."""
    stages = getattr(model, "layers", None)
    if not isinstance(stages, nn.Sequential) or len(stages) == 0:
        return False
    blocks = getattr(stages[0], "blocks", None)
    if blocks is None or len(blocks) == 0:
        return False
    return _window_attention_kind(getattr(blocks[0], "attn", None)) is not None


def window_blocks(model: Any) -> tuple[list[Any], list[Stage], str]:
    """Every Swin block in order, the stages (grids at the model's own input size) and the version.

    Args:
        model: a timm ``SwinTransformer`` or ``SwinTransformerV2``.

    Raises:
        UnsupportedModelError: anything else, or a block this module cannot read.
    """
    if not is_windowed(model):
        raise UnsupportedModelError(
            f"{type(model).__name__} is not a timm Swin v1/v2 model; supported families: {SUPPORTED_FAMILIES}"
        )
    ps = model.patch_embed.patch_size
    ps = (ps, ps) if isinstance(ps, int) else tuple(ps)
    grid0 = tuple(model.patch_embed.grid_size)
    blocks: list[Any] = []
    stages: list[Stage] = []
    kinds = set()
    scale = 1
    for si, stage in enumerate(model.layers):
        if not isinstance(stage.downsample, nn.Identity):
            scale *= 2
        shifts: list[tuple[int, int]] = []
        windows: set[tuple[int, int]] = set()
        heads: set[int] = set()
        for blk in stage.blocks:
            kind = _window_attention_kind(getattr(blk, "attn", None))
            if kind is None or not hasattr(blk, "shift_size") or not hasattr(blk.attn, "attn_drop"):
                raise UnsupportedModelError(
                    f"stage {si} of {type(model).__name__} has a block of kind {type(blk).__name__} that "
                    f"Headscope cannot capture; supported families: {SUPPORTED_FAMILIES}"
                )
            kinds.add(kind)
            windows.add((int(blk.window_size[0]), int(blk.window_size[1])))
            heads.add(blk.attn.num_heads)
            shifts.append((int(blk.shift_size[0]), int(blk.shift_size[1])))
            blocks.append(blk)
        if len(windows) != 1 or len(heads) != 1:
            raise UnsupportedModelError(f"stage {si}: blocks with different windows or head counts")
        first = len(blocks) - len(stage.blocks)
        grid = tiles(grid0, (scale, scale))
        (window,) = windows
        (h,) = heads
        stages.append(
            Stage(si, first, len(blocks) - 1, h, scale, window, tuple(shifts), grid, (ps[0] * scale, ps[1] * scale))
        )
    if len(kinds) != 1:
        raise UnsupportedModelError("a model mixing Swin v1 and v2 blocks")
    return blocks, stages, kinds.pop()


@dataclass
class WindowIndex:
    """Where each cell of a stage's grid sits among one block's windows.

    ``window[t]``, ``pos[t]``: the window of cell ``t`` (row-major in the image's grid) and its
    place in that window (row-major in the window); ``cells[w, p]``: the cell at place ``p`` of
    window ``w``, or -1 for padding. Windows are numbered as timm's ``window_partition`` lays them
    out: row-major over the rolled and padded grid.
    """

    window: torch.Tensor  # N, long
    pos: torch.Tensor  # N, long
    cells: torch.Tensor  # nW, W*W, long

    @classmethod
    def build(
        cls, grid: tuple[int, int], window: tuple[int, int], shift: tuple[int, int], device: torch.device
    ) -> WindowIndex:
        gh, gw = grid
        wh, ww = window
        sh, sw = shift
        nwh, nww = tiles(grid, window)
        # torch.roll(x, -shift) puts cell r at row (r - shift) mod H of the rolled grid; padding
        # follows the roll, at the bottom and right of the rolled grid.
        i = (torch.arange(gh, device=device) - sh) % gh  # rolled row of each image row
        j = (torch.arange(gw, device=device) - sw) % gw
        win = (i // wh)[:, None] * nww + (j // ww)[None, :]  # gh, gw
        pos = (i % wh)[:, None] * ww + (j % ww)[None, :]
        cells = torch.full((nwh * nww, wh * ww), -1, dtype=torch.long, device=device)
        cells[win.flatten(), pos.flatten()] = torch.arange(gh * gw, device=device)
        return cls(win.flatten(), pos.flatten(), cells)


@dataclass
class WindowedAttention:
    """Everything captured for one image under a Swin model, for every layer, where the forward ran.

    Shapes per layer ``l`` of stage ``s``: ``probs[l]``: ``[nW, H_s, W*W, W*W]``, the softmax of
    each window as the block computed it; ``head_out[l]``: ``[nW, W*W, H_s*d]``, the per-head
    outputs concatenated, before ``proj``, in the same window layout; ``last_norms``: ``[N_last]``
    token norms of the last block's output, row-major over the last stage's grid (on the host);
    ``inputs[l]``: ``[nW, W*W, C]`` the windows' tokens the attention module got; ``masks[l]``:
    ``[nW, W*W, W*W]`` the shift mask the block added (0 / -100), or None for unshifted blocks;
    ``modules[l]``: the block's attention module (its weights; a reference, not a copy).
    ``inputs``, ``masks`` and ``modules`` are empty for a capture built without them: rows at
    temperature 1 only, and no explain.
    """

    stages: list[Stage]  # grids of this image
    probs: list[torch.Tensor]
    head_out: list[torch.Tensor]
    last_norms: torch.Tensor
    inputs: list[torch.Tensor] = field(default_factory=list)
    masks: list[torch.Tensor | None] = field(default_factory=list)
    modules: list[Any] = field(default_factory=list, repr=False)
    version: str = "v1"
    _index: dict[int, WindowIndex] = field(default_factory=dict, repr=False)

    @property
    def num_layers(self) -> int:
        return len(self.probs)

    @property
    def num_heads(self) -> int:
        """The most heads of any stage (each stage has its own count: :meth:`heads_at`)."""
        return max(s.heads for s in self.stages)

    @property
    def num_tokens(self) -> int:
        """Cells of the first stage's grid (each stage has its own: :meth:`tokens_at`)."""
        return self.tokens_at(0)

    @property
    def device(self) -> torch.device:
        return self.probs[0].device

    def stage_of(self, layer: int) -> Stage:
        return stage_of(self.stages, layer)

    def heads_at(self, layer: int) -> int:
        return self.stage_of(layer).heads

    def tokens_at(self, layer: int) -> int:
        g = self.stage_of(layer).grid
        return g[0] * g[1]

    def index(self, layer: int) -> WindowIndex:
        """The window index of ``layer`` (built once per layer and image)."""
        if layer not in self._index:
            s = self.stage_of(layer)
            self._index[layer] = WindowIndex.build(s.grid, s.window, s.shift_of(layer), self.device)
        return self._index[layer]

    def storages(self) -> dict[tuple[str, int], int]:
        """Buffers this capture keeps alive, ``{(device, address): nbytes}``, each once."""
        tensors = [*self.probs, *self.head_out, self.last_norms, *self.inputs]
        tensors += [m for m in self.masks if m is not None]
        return {(str(t.device), t.untyped_storage().data_ptr()): t.untyped_storage().nbytes() for t in tensors}

    def nbytes(self) -> int:
        return sum(self.storages().values())

    def window_rows(self, layer: int, heads: list[int] | None = None) -> torch.Tensor:
        """``[heads, N, W*W]``: each cell's softmax over the keys of its window (padding included),
        in float32, cells row-major over the stage's grid."""
        p = self.probs[layer]
        if heads is not None:
            p = p[:, heads]
        ix = self.index(layer)
        return p[ix.window, :, ix.pos, :].transpose(0, 1).float()  # H, N, A

    def rows(
        self,
        layer: int,
        heads: list[int] | None = None,
        queries: list[int] | None = None,
        out: torch.Tensor | None = None,
        temperature: float = 1.0,
    ) -> torch.Tensor:
        """Softmax attention of one layer over its stage's grid, ``[heads, queries, N]`` float32.

        Args:
            layer: block index, counted across stages.
            heads: head indices of the layer's stage, or None for all.
            queries: query cells (row-major over the stage's grid), or None for all N.
            out: optional float32 ``[heads, queries, N]`` tensor on :attr:`device` to write into.
            temperature: ``softmax(scores / temperature)`` over the query's window; 1 is the model.
                Any other value recomputes the block's real logits of the windows the rows sit
                in (:meth:`window_logits`: bias and shift mask included, so at a high T the
                masked keys get weight too, as ``softmax(scores / T)`` says). Not from
                ``log p``: a masked key's probability underflows to 0 in float32
                (``exp(-100 - ...)``), and its log would stay ``-inf`` at any T.
        """
        p = self.probs[layer]  # nW, H, A, A
        if heads is not None:
            p = p[:, heads]
        ix = self.index(layer)
        n = ix.window.numel()
        if queries is None:
            q = torch.arange(n, device=p.device)
        else:
            q = torch.tensor(queries, dtype=torch.long, device=p.device)
        win, pos = ix.window[q], ix.pos[q]
        if temperature != 1.0:
            wins, inv = torch.unique(win, return_inverse=True)
            logits = self.window_logits(layer, wins, heads)  # w, H, A, A
            vals = torch.softmax(temper_(logits[inv, :, pos, :], temperature), dim=-1)  # R, H, A
        else:
            vals = p[win, :, pos, :]  # R, H, A: each query's row over its window
        keys = ix.cells[win]  # R, A: the grid cell of each key, -1 for padding
        r_idx, a_idx = (keys >= 0).nonzero(as_tuple=True)
        shape = (p.shape[1], q.numel(), n)
        if out is None:
            out = torch.zeros(shape, dtype=torch.float32, device=p.device)
        else:
            out.zero_()
        out[:, r_idx, keys[r_idx, a_idx]] = vals[r_idx, :, a_idx].T.float()
        return out

    def window_logits(self, layer: int, windows: torch.Tensor, heads: list[int] | None = None) -> torch.Tensor:
        """``[w, heads, W*W, W*W]`` float32: the block's pre-softmax scores of some windows.

        Recomputed from the captured windows' tokens with the module's own weights, in the order
        of timm's unfused branch: v1 ``(q * scale) @ k^T + bias + mask``; v2 ``cos(q, k) *
        exp(clamp(logit_scale)) + 16 * sigmoid(cpb) + mask``.

        Args:
            layer: block index, counted across stages.
            windows: window indices (as :class:`WindowIndex` numbers them), long.
            heads: head indices of the layer's stage, or None for all.
        """
        if not self.inputs:
            raise CaptureError("this windowed capture kept no window tokens: temperature 1 only, no explain")
        mask = self.masks[layer]
        x = self.inputs[layer][windows]  # w, A, C
        logits = window_logits(self.modules[layer], x, mask[windows] if mask is not None else None, self.version)
        return logits if heads is None else logits[:, heads]

    def head_out_cells(self, layer: int) -> torch.Tensor:
        """``[N, H*d]`` head outputs of ``layer`` per cell of the stage's grid (padding left out)."""
        h = self.head_out[layer]  # nW, A, D
        ix = self.index(layer)
        return h.reshape(-1, h.shape[-1])[ix.window * h.shape[1] + ix.pos]


class WindowCapture:
    """Hooks every Swin block of ``model`` for one forward pass at a time.

    Same use as :class:`~app.engine.block_capture.AttentionCapture`::

        cap = WindowCapture(model)
        with cap.capturing():
            model.forward_features(x)
        per_image = cap.results()  # list[WindowedAttention]
    """

    def __init__(self, model: nn.Module):
        self.model: Any = model
        self.blocks, self.stages, self.version = window_blocks(model)
        self.layers = [(blk.attn, "window") for blk in self.blocks]
        self.num_heads = max(s.heads for s in self.stages)
        self._reset()

    def materialise_pays(self, num_tokens: int) -> bool:
        """Windows are always kept whole (small); there is no other branch to choose."""
        return False

    def _reset(self) -> None:
        n = len(self.blocks)
        self._grid: list[list[tuple[int, int]]] = [[] for _ in range(n)]
        self._p: list[list[torch.Tensor]] = [[] for _ in range(n)]
        self._heads: list[list[torch.Tensor]] = [[] for _ in range(n)]
        self._inputs: list[list[tuple[torch.Tensor, torch.Tensor | None]]] = [[] for _ in range(n)]
        self._norms: list[torch.Tensor] = []

    @contextmanager
    def capturing(self, materialise: bool = False) -> Iterator[WindowCapture]:
        """Install the hooks for the block; switch v1's experimental fused path off meanwhile.

        Args:
            materialise: ignored (windows are always kept); for the same call as ``AttentionCapture``.
        """
        self._reset()
        with ExitStack() as stack:
            for i, blk in enumerate(self.blocks):
                attn = blk.attn
                if getattr(attn, "fused_attn", False):  # v1 only; SDPA never shows the softmax
                    attn.fused_attn = False
                    stack.callback(setattr, attn, "fused_attn", True)
                stack.callback(blk.register_forward_pre_hook(self._store_grid(self._grid[i])).remove)
                stack.callback(attn.attn_drop.register_forward_pre_hook(store_input(self._p[i])).remove)
                stack.callback(attn.proj.register_forward_pre_hook(store_input(self._heads[i])).remove)
                hook = attn.register_forward_pre_hook(self._store_windows(self._inputs[i]), with_kwargs=True)
                stack.callback(hook.remove)
            stack.callback(self.blocks[-1].register_forward_hook(store_norms(self._norms)).remove)
            yield self

    @staticmethod
    def _store_grid(sink: list):
        def hook(module, args):
            sink.append(tuple(args[0].shape[1:3]))  # B, H, W, C -> the stage's grid

        return hook

    @staticmethod
    def _store_windows(sink: list):
        def hook(module, args, kwargs):
            mask = kwargs["mask"] if "mask" in kwargs else (args[1] if len(args) > 1 else None)
            sink.append((args[0].detach(), mask.detach() if mask is not None else None))  # B*nW, A, C; nW, A, A

        return hook

    def results(self, to: torch.device | str | None = None) -> list[WindowedAttention]:
        """Split the last capture into per-image captures; raise if anything is missing or off.

        Args:
            to: a device to move the captures to; None keeps them where the forward ran.
        """
        for i in range(len(self.blocks)):
            got = (len(self._grid[i]), len(self._p[i]), len(self._heads[i]), len(self._inputs[i]))
            if got != (1, 1, 1, 1) or (i == len(self.blocks) - 1 and len(self._norms) != 1):
                raise CaptureError(
                    f"window attention capture of layer {i} fired {got[1]} time(s), expected once per "
                    f"forward; was the model called inside capturing() exactly once?"
                )
        grid0 = self._grid[0][0]
        B = self._p[0][0].shape[0] // math.prod(tiles(grid0, self.stages[0].window))
        move = to is not None and torch.device(to) != self._p[0][0].device

        def keep(t: torch.Tensor) -> torch.Tensor:
            return t.to(to).contiguous() if move else t

        probs, heads, inputs, masks, stages = [], [], [], [], []
        for s in self.stages:
            grid = self._grid[s.first_layer][0]
            stages.append(dataclasses.replace(s, grid=grid))
            nw = math.prod(stages[-1].windows)
            A = s.window[0] * s.window[1]
            for layer in s.layers:
                p, h = self._p[layer][0], self._heads[layer][0]
                xw, mask = self._inputs[layer][0]
                if self._grid[layer][0] != grid:
                    raise CaptureError(f"layer {layer}: grid {self._grid[layer][0]}, expected {grid} (stage {s.index})")
                if (
                    p.shape != (B * nw, s.heads, A, A)
                    or h.shape[:2] != (B * nw, A)
                    or xw.shape[:2] != (B * nw, A)
                    or (mask is not None and mask.shape != (nw, A, A))
                ):
                    raise CaptureError(
                        f"layer {layer}: window attention of shape {tuple(p.shape)}, expected "
                        f"({B * nw}, {s.heads}, {A}, {A}) for {B} image(s) of {nw} windows"
                    )
                # Maps from a reduced-precision forward become float32 once per layer, not per image.
                probs.append(p.float().reshape(B, nw, s.heads, A, A))
                heads.append(h.reshape(B, nw, A, -1))
                inputs.append(xw.reshape(B, nw, A, -1))
                masks.append(mask)  # one for the batch: each window's mask is the same in every image
        norms = self._norms[0].to("cpu", torch.float32)  # B, N_last
        out = [
            WindowedAttention(
                stages=stages,
                probs=[keep(p[b]) for p in probs],
                head_out=[keep(h[b]) for h in heads],
                last_norms=norms[b].clone(),
                inputs=[keep(x[b]) for x in inputs],
                masks=[keep(m) if m is not None else None for m in masks],
                modules=[blk.attn for blk in self.blocks],
                version=self.version,
            )
            for b in range(B)
        ]
        self._reset()
        return out
