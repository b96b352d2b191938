"""The pretrained models a page may load on demand: timm's own list, cut to the supported
families, and open_clip's pretrained ViTs (CLIP, SigLIP; with the ``clip`` extra).

A request names a model, never a place: the name is looked up here, and only timm's (or
open_clip's) own pretrained configuration says which Hugging Face repository and file hold its
weights. A name that is not in this list (a URL, a path, another family) is refused before
anything is fetched.
"""

from __future__ import annotations

import os
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
# open_clip's ARCH/PRETRAINED: one '/', no ':' or '@'
OPEN_CLIP_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}/[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}")
OPEN_CLIP_PREFIX = "open_clip:"
MAX_LIMIT = 500

# What the catalogue answers in place of open_clip's models when the clip extra is missing.
NO_OPEN_CLIP_NOTE = (
    "open_clip models (CLIP, SigLIP) are not listed: this server lacks the clip extra "
    "(pip install 'headscope[clip]', which installs open_clip_torch)"
)


@dataclass(frozen=True)
class CatalogEntry:
    """One pretrained model: its timm name, family and where timm's configuration keeps its weights."""

    name: str  # timm name with its pretrained tag, e.g. vit_small_patch16_224.augreg_in21k (open_clip: ARCH/TAG)
    family: str
    repo: str  # Hugging Face repository (from timm's or open_clip's pretrained configuration)
    filename: str | None  # the configuration's weights file, if it names one
    source: str = "timm"  # or "open_clip"

    @property
    def model_id(self) -> str:
        """The id answers and requests use for it."""
        return f"{OPEN_CLIP_PREFIX}{self.name}" if self.source == "open_clip" else f"timm:{self.name}"

    def as_dict(self) -> dict[str, str]:
        return {"name": self.name, "id": self.model_id, "family": self.family}


@lru_cache(maxsize=1)
def entries() -> dict[str, CatalogEntry]:
    """Every pretrained timm model of a supported family whose weights are on the Hugging Face hub."""
    import timm
    from timm.models import get_pretrained_cfg

    out: dict[str, CatalogEntry] = {}
    for name in timm.list_models(pretrained=True):
        family = _family(name)
        if family is None or any(re.search(p, name) for p in UNSUPPORTED_PATTERNS):
            continue
        cfg = get_pretrained_cfg(name)
        if cfg is None or not cfg.hf_hub_id:  # weights elsewhere (a URL): not loaded on demand
            continue
        out[name] = CatalogEntry(name, family, cfg.hf_hub_id.split("@")[0], cfg.hf_hub_filename)
    return out


def hub_weights(name: str) -> CatalogEntry | None:
    """Where timm reads the pretrained weights of ``name`` on the Hugging Face hub (a bare
    architecture takes its default tag), for any timm model, not just the catalogue's.

    None where only timm knows: weights at a URL or in a file, a pinned revision, or timm told by
    ``TIMM_USE_OLD_CACHE`` to look in torch's cache first.
    """
    from timm.models import get_pretrained_cfg

    try:
        cfg = get_pretrained_cfg(name)
    except Exception:  # a tag timm does not know: its own build says so
        return None
    if cfg is None or not cfg.hf_hub_id or "@" in cfg.hf_hub_id or cfg.file or cfg.state_dict:
        return None
    if cfg.source not in (None, "", "timm", "hf-hub") or os.environ.get("TIMM_USE_OLD_CACHE"):
        return None
    return CatalogEntry(name, _family(name) or "", cfg.hf_hub_id, cfg.hf_hub_filename)


def _family(name: str) -> str | None:
    """The family the picker shows for timm's ``name``, from the module that defines it; None
    for a module Headscope does not capture."""
    from timm.models import get_arch_name
    from timm.models._registry import _model_to_module  # timm's own name -> module table

    return FAMILIES.get(_model_to_module.get(get_arch_name(name), ""))


def _open_clip_vit(arch: str) -> bool:
    """Whether open_clip's ``arch`` has a ViT image tower Headscope captures and a text tower it
    writes out (its configuration alone: nothing is built). Left out: CoCa (attentional pooling),
    Hugging Face text encoders (their configuration comes from the hub), CLIPA's mean pooling,
    timm trunks other than ViTs, and RoPE towers (Perception Encoder)."""
    import open_clip

    cfg = open_clip.get_model_config(arch) or {}
    vision, text = cfg.get("vision_cfg", {}), cfg.get("text_cfg", {})
    if "multimodal_cfg" in cfg or "hf_model_name" in text:
        return False
    trunk = vision.get("timm_model_name")
    if trunk is not None:
        from timm.models._registry import _model_to_module

        # MobileCLIP's B towers are hybrids (a convolutional stem feeds the tokens): loaders refuse them.
        hybrid = _model_to_module.get(str(trunk)) == "vision_transformer_hybrid"
        return (
            str(trunk).startswith("vit_")
            and not hybrid
            and not any(re.search(p, str(trunk)) for p in UNSUPPORTED_PATTERNS)
        )
    plain = vision.get("pool_type", "tok") == "tok" and not vision.get("attentional_pool", False)
    return isinstance(vision.get("layers"), int) and plain and vision.get("no_ln_pre") is not True


@lru_cache(maxsize=1)
def open_clip_entries() -> dict[str, CatalogEntry] | None:
    """open_clip's pretrained ViTs (``ARCH/TAG`` -> entry) whose weights are on the Hugging Face hub;
    None without the clip extra."""
    try:
        import open_clip
        from open_clip.pretrained import get_pretrained_cfg
    except ImportError:
        return None
    out: dict[str, CatalogEntry] = {}
    vit: dict[str, bool] = {}
    for arch, tag in open_clip.list_pretrained():
        if not vit.setdefault(arch, _open_clip_vit(arch)):
            continue
        hub = str(get_pretrained_cfg(arch, tag).get("hf_hub") or "")
        if not hub:  # weights at a URL of their own: not loaded on demand
            continue
        repo_id, file = _split_hub(hub)
        family = "siglip" if "siglip" in arch.lower() else "clip"
        out[f"{arch}/{tag}"] = CatalogEntry(f"{arch}/{tag}", family, repo_id, file or None, "open_clip")
    return out


def _split_hub(hub: str) -> tuple[str, str]:
    """open_clip's ``org/repo/file`` (or ``org/repo/``, its default file) -> ``(org/repo, file)``."""
    org, _, rest = hub.partition("/")
    repo, _, file = rest.partition("/")
    return f"{org}/{repo}", file


def _lookup_open_clip(name: str) -> CatalogEntry:
    oc = open_clip_entries()
    if oc is None:
        raise UnknownModelError(NO_OPEN_CLIP_NOTE.replace("are not listed: this server lacks", "need"))
    entry = oc.get(name) if OPEN_CLIP_NAME.fullmatch(name) else None
    if entry is None:
        shown = name if OPEN_CLIP_NAME.fullmatch(name) else "that name"
        raise UnknownModelError(
            f"{shown!s} is not a pretrained open_clip ViT on the Hugging Face hub "
            "(search GET /api/v1/models/catalog?q=...)"
        )
    return entry


def lookup(name: str) -> CatalogEntry:
    """The entry of ``name`` (``timm:`` prefix allowed; open_clip's ``ARCH/TAG``, ``open_clip:``
    prefix allowed).

    Raises:
        UnknownModelError: not a pretrained timm model of a supported family, nor an open_clip ViT.
    """
    if name.startswith(OPEN_CLIP_PREFIX) or ("/" in name and ":" not in name):
        return _lookup_open_clip(name.removeprefix(OPEN_CLIP_PREFIX))
    bare = name.removeprefix("timm:")
    entry = entries().get(bare) if NAME.fullmatch(bare) else None
    if entry is None:
        shown = bare if NAME.fullmatch(bare) else "that name"
        raise UnknownModelError(
            f"{shown!s} is not a pretrained timm model of a supported family (search GET /api/v1/models/catalog?q=...)"
        )
    return entry


def search(query: str = "", limit: int = 50) -> tuple[int, list[CatalogEntry]]:
    """Entries whose id holds every word of ``query`` (case-insensitive): ``(matches, the first limit)``.

    An exact name comes first, then names that start with the query, then the rest by name
    (timm's before open_clip's).
    """
    words = query.lower().split()
    every = [*entries().values(), *(open_clip_entries() or {}).values()]
    hits = [e for e in every if all(w in e.model_id.lower() for w in words)]  # open_clip: finds "open_clip", "clip"
    q = query.strip().lower()
    # ties: timm's names first (as before open_clip's joined), then open_clip's
    hits.sort(key=lambda e: (e.name.lower() != q, not e.name.lower().startswith(q), e.source != "timm", e.name))
    return len(hits), hits[: max(0, min(limit, MAX_LIMIT))]


@lru_cache(maxsize=256)
def parameter_count(entry: CatalogEntry) -> int:
    """The parameters of ``entry``'s model, built on the meta device (no weights, no memory; a
    second for the largest), so that a size cap is checked before anything is downloaded."""
    import torch

    with torch.device("meta"):
        if entry.source == "open_clip":  # both towers: what the server holds in memory
            import open_clip

            model = open_clip.create_model(entry.name.split("/")[0], pretrained=None, device="meta")
        else:
            import timm

            model = timm.create_model(entry.name.split(".")[0], pretrained=False)
    return sum(p.numel() for p in model.parameters())
