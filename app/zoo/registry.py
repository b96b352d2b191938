"""The models this server offers, built lazily and kept (one instance per id)."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import torch

from ..engine.model import LoadedModel
from .errors import UnknownModelError
from .ids import ModelSpec
from .loaders import build, windowed_arch

log = logging.getLogger(__name__)


class Registry:
    """Model ids -> loaded models, built on first use (thread-safe).

    Args:
        ids: model ids as in :mod:`app.zoo.ids`; the first is the default.
        models_dir: where the embedded model is converted to.
        device: where models are moved once built.
    """

    def __init__(self, ids: list[str], models_dir: Path, device: torch.device | None = None):
        self.specs: dict[str, ModelSpec] = {}
        for raw in ids:
            spec = ModelSpec.parse(raw)
            self.specs.setdefault(spec.id, spec)
        self.ids = list(self.specs)
        self.default = self.ids[0]
        self.models_dir = Path(models_dir)
        self.device = device or torch.device("cpu")
        self._loaded: dict[str, LoadedModel] = {}
        self._errors: dict[str, str] = {}
        self._lock = threading.Lock()

    def resolve(self, model_id: str | None) -> str:
        mid = model_id or self.default
        if mid not in self.ids:
            raise UnknownModelError(f"unknown model {mid!r}; available: {', '.join(self.ids)}")
        return mid

    def get(self, model_id: str | None = None) -> LoadedModel:
        """Return the loaded model, loading it on first use."""
        mid = self.resolve(model_id)
        with self._lock:
            if mid not in self._loaded:
                try:
                    lm = build(self.specs[mid], self.models_dir)
                except Exception as e:
                    self._errors[mid] = str(e)
                    raise
                lm.to(self.device)  # the backbone and its decoder, if any
                self._loaded[mid] = lm
                self._errors.pop(mid, None)
                log.info("loaded %s (%s) on %s", mid, lm.arch, self.device)
            return self._loaded[mid]

    def loaded(self, model_id: str) -> LoadedModel | None:
        """The model if it is already built, else None (never loads)."""
        return self._loaded.get(model_id)

    def error(self, model_id: str) -> str | None:
        return self._errors.get(model_id)

    def info(self) -> list[dict[str, Any]]:
        out = []
        for mid, spec in self.specs.items():
            lm = self._loaded.get(mid)
            row: dict[str, Any] = {
                "id": mid,
                "default": mid == self.default,
                "loaded": lm is not None,
                "error": self._errors.get(mid),
                "source": spec.source,
            }
            if lm is not None:
                row.update(lm.info())
            else:
                # Known from the name alone, so that a page can ask a windowed model the right way
                # before its first load.
                row["windowed"] = spec.source != "embedded" and windowed_arch(spec.arch)
            out.append(row)
        return out
