"""The models this server offers, built lazily and kept (one instance per id, a bounded number at once)."""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch

from ..engine.model import LoadedModel
from .errors import ModelRefusedError, UnknownModelError
from .ids import ModelSpec, add_distinct
from .loaders import build, windowed_arch

log = logging.getLogger(__name__)


class Registry:
    """Model ids -> loaded models, built on first use (thread-safe).

    At most ``max_loaded`` models are kept in memory: loading one more unloads the least recently
    used model other than the default (which the server warmed up and ``/readyz`` stands for) and
    the one just asked for. An unloaded model stays offered and is built again when asked for:
    its weights are on disk by then (the models folder, a local file or the hub's cache).

    Args:
        ids: model ids as in :mod:`app.zoo.ids`; the first is the default.
        models_dir: where the embedded model is converted to.
        device: where models are moved once built.
        max_loaded: models kept in memory at once (None: no bound).
    """

    def __init__(
        self, ids: list[str], models_dir: Path, device: torch.device | None = None, max_loaded: int | None = None
    ):
        self.specs: dict[str, ModelSpec] = {}
        for raw in ids:
            add_distinct(self.specs, ModelSpec.parse(raw))
        self.ids = list(self.specs)
        self.default = self.ids[0]
        self.models_dir = Path(models_dir)
        self.device = device or torch.device("cpu")
        self.max_loaded = max_loaded
        self._loaded: OrderedDict[str, LoadedModel] = OrderedDict()  # least recently used first
        self._errors: dict[str, str] = {}
        self._refused: set[str] = set()  # failed for good at start-up: never built again
        self._on_demand: set[str] = set()
        self._lock = threading.Lock()  # held while a model builds: never taken on the event loop
        self._offer_lock = threading.Lock()  # short: adding an id
        self.unloaded = 0  # how many times a model was unloaded to make room (tests, logs)

    def offer(self, raw: str) -> str:
        """Offer one more model (a name the catalogue allowed); returns its id. Loads nothing."""
        spec = ModelSpec.parse(raw)
        with self._offer_lock:
            if spec.id not in self.specs:
                self.specs[spec.id] = spec
                self.ids = [*self.ids, spec.id]  # a new list: readers iterate the old one safely
                self._on_demand.add(spec.id)
        return spec.id

    def withdraw(self, model_id: str) -> None:
        """Stop offering a model added with :meth:`offer` (one that failed to load); configured ones stay."""
        with self._offer_lock:
            if model_id in self._on_demand:
                self._on_demand.discard(model_id)
                self.specs.pop(model_id, None)
                self.ids = [m for m in self.ids if m != model_id]
                self._errors.pop(model_id, None)

    def refuse(self, raw: str, why: str) -> str:
        """Mark a configured model as one that cannot load while the server runs (found at
        start-up: a misspelt name, an unsupported family); asking for it answers ``why`` at once.
        Returns its id."""
        mid = self._id_of(raw)
        if mid in self.specs:
            self._refused.add(mid)
            self._errors[mid] = why
        return mid

    def fail(self, model_id: str, why: str) -> None:
        """Record why a model failed to load (the page and ``/api/v1/models`` show it); a
        configured id as written is taken too."""
        mid = self._id_of(model_id)
        if mid in self.specs:
            self._errors[mid] = why

    def is_default_spec(self, raw: str) -> bool:
        """Whether ``raw`` (a configured model as written) is the default model."""
        try:
            return self._id_of(raw) == self.default
        except ValueError:
            return False

    def _id_of(self, raw: str) -> str:
        """The id of a configured model as written (an id already is one)."""
        return raw if raw in self.specs else ModelSpec.parse(raw).id

    def use_default(self, model_id: str) -> None:
        """Serve ``model_id`` as the default (the configured default failed to load at start-up)."""
        self.resolve(model_id)
        self.default = model_id

    def start_order(self) -> list[str]:
        """The configured models in the order start-up tries them: the default, then the others
        (the first that loads is served as the default); refused ones left out."""
        order = dict.fromkeys([self.default, *self.ids])
        return [m for m in order if m not in self._refused and m not in self._on_demand]

    def is_loaded(self, model_id: str) -> bool:
        """Whether the model is in memory now (does not count as a use)."""
        return model_id in self._loaded

    def resolve(self, model_id: str | None) -> str:
        mid = model_id or self.default
        if mid not in self.ids:
            raise UnknownModelError(f"unknown model {mid!r}; available: {', '.join(self.ids)}")
        return mid

    def get(self, model_id: str | None = None) -> LoadedModel:
        """Return the loaded model, loading it on first use (and unloading the least recently used)."""
        mid = self.resolve(model_id)
        if mid in self._refused:
            raise ModelRefusedError(f"{mid} cannot be loaded: {self._errors.get(mid, 'refused at start-up')}")
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
                self._make_room(keep=mid)
            self._loaded.move_to_end(mid)
            return self._loaded[mid]

    def _make_room(self, keep: str) -> None:
        """Unload the least recently used models beyond ``max_loaded`` (never the default nor ``keep``)."""
        if self.max_loaded is None:
            return
        for mid in list(self._loaded):
            if len(self._loaded) <= self.max_loaded:
                break
            if mid in (self.default, keep):
                continue
            del self._loaded[mid]  # requests running on it hold their own reference
            self.unloaded += 1
            log.info("unloaded %s: over %d models loaded (it loads again when asked for)", mid, self.max_loaded)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def loaded(self, model_id: str) -> LoadedModel | None:
        """The model if it is already built, else None (never loads); counts as a use.

        Called on the event loop, so it never waits for the lock a loading model holds: each
        dict operation is atomic, and a model unloaded meanwhile is simply not there.
        """
        lm = self._loaded.get(model_id)
        if lm is not None:
            try:
                self._loaded.move_to_end(model_id)
            except KeyError:  # unloaded between the two lines
                pass
        return lm

    def error(self, model_id: str) -> str | None:
        return self._errors.get(model_id)

    def windowed(self, model_id: str) -> bool:
        """Whether the model is windowed (Swin), loaded or not: its loaded form says, else its
        name (the same rule as :meth:`info`). Never loads."""
        lm = self._loaded.get(model_id)
        if lm is not None:
            return lm.windowed
        spec = self.specs.get(model_id)  # None: withdrawn meanwhile (the request fails where it loads)
        return spec is not None and spec.source != "embedded" and windowed_arch(spec.arch)

    def info(self) -> list[dict[str, Any]]:
        specs, loaded = dict(self.specs), dict(self._loaded)  # copies: a model may load meanwhile
        out = []
        for mid, spec in specs.items():
            lm = loaded.get(mid)
            row: dict[str, Any] = {
                "id": mid,
                "default": mid == self.default,
                "loaded": lm is not None,
                "error": self._errors.get(mid),
                "source": spec.source,
                "on_demand": mid in self._on_demand,
            }
            if lm is not None:
                row.update(lm.info())
            else:
                # Known from the name alone, so that a page can ask a windowed model the right way
                # before its first load.
                row["windowed"] = self.windowed(mid)
            out.append(row)
        return out
