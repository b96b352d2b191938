"""Where each token of the sequence comes from (no torch: parsing a selection needs only this)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


def tiles(size: tuple[int, int], tile: tuple[int, int]) -> tuple[int, int]:
    """How many ``tile`` cover ``size`` on each side, counting the last, padded ones: a stage's
    grid over stage 0's (tiles of ``scale x scale`` cells), or a grid's windows."""
    return -(-size[0] // tile[0]), -(-size[1] // tile[1])


@dataclass
class TokenLayout:
    """The token sequence of one image under one model.

    ``prefix`` lists the prefix tokens in sequence order with their kind (``cls``, ``dist``,
    ``reg``); patch tokens follow, row-major over ``grid`` = (rows, cols). Token
    ``t >= num_prefix`` is patch ``t - num_prefix``.
    """

    prefix: list[str]
    grid: tuple[int, int]
    patch_size: tuple[int, int]

    @property
    def num_prefix(self) -> int:
        return len(self.prefix)

    @property
    def num_patches(self) -> int:
        return self.grid[0] * self.grid[1]

    @property
    def count(self) -> int:
        return self.num_prefix + self.num_patches

    @property
    def cls_index(self) -> int | None:
        """Index of the CLS token, or None for models without one (SigLIP)."""
        return self.prefix.index("cls") if "cls" in self.prefix else None

    def token_of_cell(self, row: int, col: int) -> int:
        """Token index of grid cell (row, col); both already in range."""
        return self.num_prefix + row * self.grid[1] + col

    def as_dict(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "num_prefix": self.num_prefix,
            "prefix": [{"index": i, "kind": k} for i, k in enumerate(self.prefix)],
            "grid": list(self.grid),
            "patch_size": list(self.patch_size),
        }


# Windowed stages with more cells than this get no dense answers (query=all, rollout): the N x N
# maps of a Swin-T stage 0 at 3:1 (56 x 168 = 9408 cells) take 354 MB per head and layer (2.1 GB
# for its 3 heads x 2 layers), almost all zeros; rollout would multiply such matrices. Swin-T at
# 224 x 224: stages 1-3 (784, 196, 49 cells) have them, stage 0 (3136) does not.
MAX_DENSE_CELLS = 2048


@dataclass(frozen=True)
class Stage:
    """One stage of a windowed model (Swin) at one input size.

    Layers are numbered across stages (Swin-T: 2 + 2 + 6 + 2 = 12). A stage's blocks attend
    inside non-overlapping ``window`` cells of its own ``grid``; block ``i`` of the stage shifts
    the grid cyclically by ``shifts[i]`` first (every second block, by half a window). Cell
    ``(r, c)`` covers input pixels ``[r * cell_size[0], (r + 1) * cell_size[0])`` (likewise for
    columns): ``scale`` patches of stage 0 on a side, merged by the patch-merging layers, which
    pad odd grids, so the last row or column may reach past the input's edge.
    """

    index: int
    first_layer: int
    last_layer: int  # inclusive
    heads: int
    scale: int  # cells of stage 0 per cell of this stage, on a side (1, 2, 4, 8 in Swin-T)
    window: tuple[int, int]
    shifts: tuple[tuple[int, int], ...]  # one per layer of the stage
    grid: tuple[int, int]
    cell_size: tuple[int, int]  # input pixels per cell (patch size * scale)

    @property
    def layers(self) -> range:
        return range(self.first_layer, self.last_layer + 1)

    def shift_of(self, layer: int) -> tuple[int, int]:
        return self.shifts[layer - self.first_layer]

    @property
    def windows(self) -> tuple[int, int]:
        """Windows per column and per row, counting those the padding completes."""
        return tiles(self.grid, self.window)

    def tokens(self) -> TokenLayout:
        """The stage's grid as a token layout: no prefix tokens, one token per cell, row-major."""
        return TokenLayout([], self.grid, self.cell_size)

    def label(self) -> str:
        a, b = self.first_layer, self.last_layer
        span = f"layer {a}" if a == b else f"layers {a}-{b}"
        return (
            f"stage {self.index} = {span} ({self.grid[0]} x {self.grid[1]} cells, "
            f"{self.window[0]} x {self.window[1]} windows, {self.heads} heads)"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "layers": [self.first_layer, self.last_layer],
            "heads": self.heads,
            "grid": list(self.grid),
            "cell_size": list(self.cell_size),
            "window": list(self.window),
            "windows": list(self.windows),
            "shifts": [list(s) for s in self.shifts],
            "dense": self.grid[0] * self.grid[1] <= MAX_DENSE_CELLS,
        }


@dataclass
class WindowedLayout:
    """The token layout of one image under a windowed model: one grid per stage, no prefix."""

    stages: list[Stage]
    patch_size: tuple[int, int]

    @classmethod
    def at(cls, stages: list[Stage], patch_size: tuple[int, int], input_hw: tuple[int, int]) -> WindowedLayout:
        """The stages of ``stages`` (any input size) laid over an input of ``input_hw`` pixels.

        Each patch-merging layer halves the grid, rounding up (it pads odd grids).
        """
        grid0 = (input_hw[0] // patch_size[0], input_hw[1] // patch_size[1])
        out = [
            dataclasses.replace(
                s, grid=tiles(grid0, (s.scale, s.scale)), cell_size=(patch_size[0] * s.scale, patch_size[1] * s.scale)
            )
            for s in stages
        ]
        return cls(out, tuple(patch_size))  # type: ignore[arg-type]

    @property
    def num_layers(self) -> int:
        return self.stages[-1].last_layer + 1

    def stage_of(self, layer: int) -> Stage:
        return stage_of(self.stages, layer)

    def describe(self) -> str:
        """Which layers form each stage, in words (for error messages)."""
        return "; ".join(s.label() for s in self.stages)

    def as_dict(self) -> list[dict[str, Any]]:
        return [s.as_dict() for s in self.stages]


def stage_of(stages: Sequence[Stage], layer: int) -> Stage:
    """The stage that holds ``layer`` (numbered across stages)."""
    for s in stages:
        if s.first_layer <= layer <= s.last_layer:
            return s
    raise IndexError(f"layer {layer} is outside the {stages[-1].last_layer + 1} layers")
