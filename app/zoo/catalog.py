"""The pretrained timm models a page may load on demand: timm's own list, cut to the supported families.

A request names a model, never a place: the name is looked up here, and only timm's own
pretrained configuration says which Hugging Face repository and file hold its weights. A name
that is not in this list (a URL, a path, another family) is refused before anything is fetched.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from .errors import UnknownModelError

# timm modules whose models Headscope captures (app/engine/block_capture.py SUPPORTED_FAMILIES, and
# app/engine/windows.py for Swin), with the family name the picker shows.
FAMILIES = {
    "vision_transformer": "vit",
    "deit": "deit",
    "eva": "eva",
    "beit": "beit",
    "swin_transformer": "swin",
    "swin_transformer_v2": "swinv2",
}

# Models of those modules whose attention Headscope cannot capture, found by building every
# catalogue architecture on the meta device (tests/unit/zoo/test_catalog.py; all of them with
# HEADSCOPE_SLOW=1): RoPE ViTs that run timm's AttentionRope (naver's rope ViTs, Perception
# Encoder, Sapiens2), differential attention and parallel blocks.
UNSUPPORTED_PATTERNS: tuple[str, ...] = (
    r"^vit_\w+_rope_",
    r"^vit_pe_",
    r"sapiens2",
    r"^vit_(dlittle|dwee|dpwee|pwee)_",
)

NAME = re.compile(r"[a-z0-9][a-z0-9_.\-]{0,127}")  # how timm spells names: no '/', ':' or '@'
MAX_LIMIT = 500


@dataclass(frozen=True)
class CatalogEntry:
    """One pretrained model: its timm name, family and where timm's configuration keeps its weights."""

    name: str  # timm name with its pretrained tag, e.g. vit_small_patch16_224.augreg_in21k
    family: str
    repo: str  # Hugging Face repository (from timm's pretrained configuration)
    filename: str | None  # the configuration's weights file, if it names one

    @property
    def model_id(self) -> str:
        """The id answers and requests use for it."""
        return f"timm:{self.name}"

    def as_dict(self) -> dict[str, str]:
        return {"name": self.name, "id": self.model_id, "family": self.family}


@lru_cache(maxsize=1)
def entries() -> dict[str, CatalogEntry]:
    """Every pretrained timm model of a supported family whose weights are on the Hugging Face hub."""
    import timm
    from timm.models import get_arch_name, get_pretrained_cfg
    from timm.models._registry import _model_to_module  # timm's own name -> module table

    out: dict[str, CatalogEntry] = {}
    for name in timm.list_models(pretrained=True):
        family = FAMILIES.get(_model_to_module.get(get_arch_name(name), ""))
        if family is None or any(re.search(p, name) for p in UNSUPPORTED_PATTERNS):
            continue
        cfg = get_pretrained_cfg(name)
        if cfg is None or not cfg.hf_hub_id:  # weights elsewhere (a URL): not loaded on demand
            continue
        out[name] = CatalogEntry(name, family, cfg.hf_hub_id.split("@")[0], cfg.hf_hub_filename)
    return out


def lookup(name: str) -> CatalogEntry:
    """The entry of ``name`` (``timm:`` prefix allowed).

    Raises:
        UnknownModelError: not a pretrained timm model of a supported family.
    """
    bare = name.removeprefix("timm:")
    entry = entries().get(bare) if NAME.fullmatch(bare) else None
    if entry is None:
        shown = bare if NAME.fullmatch(bare) else "that name"
        raise UnknownModelError(
            f"{shown!s} is not a pretrained timm model of a supported family (search GET /api/v1/models/catalog?q=...)"
        )
    return entry


def search(query: str = "", limit: int = 50) -> tuple[int, list[CatalogEntry]]:
    """Entries whose name holds every word of ``query`` (case-insensitive): ``(matches, the first limit)``.

    An exact name comes first, then names that start with the query, then the rest by name.
    """
    words = query.lower().split()
    hits = [e for e in entries().values() if all(w in e.name for w in words)]
    q = query.strip().lower()
    hits.sort(key=lambda e: (e.name != q, not e.name.startswith(q), e.name))
    return len(hits), hits[: max(0, min(limit, MAX_LIMIT))]


@lru_cache(maxsize=256)
def parameter_count(entry: CatalogEntry) -> int:
    """The parameters of ``entry``'s model, built on the meta device (no weights, no memory; a
    second for the largest), so that a size cap is checked before anything is downloaded."""
    import timm
    import torch

    with torch.device("meta"):
        model = timm.create_model(entry.name.split(".")[0], pretrained=False)
    return sum(p.numel() for p in model.parameters())
