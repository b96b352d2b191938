"""A model ready to use: the timm module, its capture hooks and what it takes to feed and read it.

Built by :mod:`app.zoo` (one loader per source); everything in the engine takes it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import torch.nn as nn

from .ablation import Ablation, parse_ablate
from .capture_base import CapturedAttention, CaptureHooks
from .captured_image import CapturedImage, captured
from .layout import Stage, TokenLayout, WindowedLayout


@dataclass
class LoadedModel:
    """A ready model with what the pipeline needs to feed and read it."""

    id: str
    source: str
    arch: str
    model: nn.Module
    capture: CaptureHooks
    patch_size: tuple[int, int]
    input_size: tuple[int, int]  # (height, width) of the model's native square input
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    prefix: list[str]
    dynamic: bool  # accepts any grid (aspect-preserving resize); else square resize only
    num_layers: int
    num_heads: int  # windowed models: the most heads of any stage (each stage has its own)
    description: str = ""
    # The model's own output after the backbone: the default model's saliency decoder (None for
    # others; see app.engine.output for the kinds), and why it is missing where it should be.
    decoder: nn.Module | None = None
    output_note: str = ""
    # CLIP-style models (open_clip): the text tower (app.engine.clip_text.TextTower) beside this
    # image tower, for text targets and zero-shot; None elsewhere, with why where it is missing.
    text: Any = None
    text_note: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def stages(self) -> list[Stage] | None:
        """Windowed models (Swin): the stages at ``input_size``; None for global attention."""
        return self.capture.stages

    @property
    def windowed(self) -> bool:
        """Whether the model attends within windows of one grid per stage (Swin)."""
        return self.stages is not None

    @property
    def output_kind(self) -> str:
        """``saliency`` (a decoder), ``classes`` (a classifier head) or ``embedding`` (neither)."""
        if self.decoder is not None:
            return "saliency"
        return "classes" if getattr(self.model, "num_classes", 0) else "embedding"

    def to(self, device) -> LoadedModel:
        """Move the backbone, the decoder and the text tower (where there are) to ``device``."""
        self.model.to(device)
        if self.decoder is not None:
            self.decoder.to(device)
        if self.text is not None:
            self.text.to(device)
        return self

    def layout(self, input_hw: tuple[int, int]) -> TokenLayout | WindowedLayout:
        """The token layout of an input of ``input_hw`` = (height, width) pixels (one grid per
        stage for a windowed model)."""
        if self.stages is not None:
            return WindowedLayout.at(self.stages, self.patch_size, input_hw)
        ph, pw = self.patch_size
        return TokenLayout(list(self.prefix), (input_hw[0] // ph, input_hw[1] // pw), self.patch_size)

    def captured(self, att: CapturedAttention, input_hw: tuple[int, int]) -> CapturedImage:
        """A capture of an input of ``input_hw`` pixels, read through this model's token layout."""
        return captured(att, self.layout(input_hw), input_hw)

    def keeps_maps(self, input_hw: tuple[int, int]) -> bool:
        """Whether a forward at this input whose answer needs every row of every map should keep
        the full maps (``capturing(materialise=True)``) rather than recompute them from q and k:
        while that pays in memory (``materialise_pays``); a windowed capture keeps its windows whole
        anyway."""
        layout = self.layout(input_hw)
        return isinstance(layout, TokenLayout) and self.capture.materialise_pays(layout.count)

    def ablation(self, spec: str | None) -> Ablation:
        """The heads an ``ablate`` text removes from this model (see :func:`~.ablation.parse_ablate`)."""
        return parse_ablate(spec, self.num_layers, self.num_heads, windowed=self.windowed)

    def info(self) -> dict[str, Any]:
        """What ``GET /api/v1/models`` says of a loaded model."""
        return dict(
            source=self.source,
            arch=self.arch,
            description=self.description,
            layers=self.num_layers,
            heads=self.num_heads,
            patch_size=list(self.patch_size),
            input_size=list(self.input_size),
            prefix_tokens=[{"index": i, "kind": k} for i, k in enumerate(self.prefix)],
            dynamic_size=self.dynamic,
            windowed=self.windowed,
            stages=[s.as_dict() for s in self.stages] if self.stages is not None else None,
            output=self.output_kind,
            text=self.text is not None,
        )
