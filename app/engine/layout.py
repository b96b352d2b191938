"""Where each token of the sequence comes from (no torch: parsing a selection needs only this)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


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
