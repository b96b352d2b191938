"""open_clip models (CLIP, SigLIP) as a :class:`LoadedModel`: the image tower as a timm ViT, the
text tower beside it (``lm.text``, :class:`app.engine.clip_text.TextTower`).

Ids: ``open_clip:ARCH/PRETRAINED`` (open_clip's pretrained weights, downloaded on first use like
a timm hub model: offline and not cached, the usual clear error) and ``open_clip:ARCH`` (random
weights, seeded: tests and offline use).

Why a timm ViT: every view of Headscope (maps, heads at a glance, statistics, inside a head,
ablation, relevance) reads timm's attention blocks (``qkv``, ``q_norm``/``k_norm``, ``proj``),
and the captures are checked against them. open_clip's own ViT (OpenAI CLIP, LAION) runs
``nn.MultiheadAttention`` in ``ResidualAttentionBlock``; its weights map one to one onto a timm
``VisionTransformer`` built with the same options (pre-norm, CLS token, LayerNorm eps, QuickGELU
or GELU, layer scale): ``in_proj`` is timm's fused ``qkv`` with the same q, k, v and head order,
``out_proj`` is ``proj``, ``ln_post`` the final norm, and ``visual.proj`` becomes the head (a
bias-free linear map). ``tests/unit/zoo/test_open_clip_models.py`` checks the image embedding
against ``encode_image`` and every layer's maps against open_clip's own block. SigLIP towers
are timm models already (open_clip's ``TimmModel``): their trunk is used as it is, with
open_clip's projection (if any) appended to its head. The head is kept with ``num_classes = 0``
so that the output kind is ``embedding`` (the image embedding ``encode_image`` returns).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import torch
import torch.nn as nn

from ..engine import text_relevance  # noqa: F401  (registers the text:PHRASE target kind)
from ..engine.capture_base import UnsupportedModelError
from ..engine.clip_text import TextError, TextTower
from .errors import HubUnreachableError, ModelLoadError, UnknownModelError, first_line
from .hub import hub_offline, hub_reachable
from .ids import ModelSpec
from .seeding import seeded

if TYPE_CHECKING:
    from .catalog import CatalogEntry

log = logging.getLogger(__name__)


def _random_init_said(record: logging.LogRecord) -> bool:
    """False for open_clip's "No pretrained weights loaded ... initialized randomly": said to the
    root logger whenever an architecture is built without weights, which Headscope does on
    purpose (the meta-device skeleton that checks a pretrained model before it loads, and
    ``open_clip:ARCH``), so that a pretrained model looked as if it had random weights."""
    return not str(record.msg).startswith("No pretrained weights loaded for model")


def _open_clip() -> Any:
    try:
        import open_clip
    except ImportError:
        raise ModelLoadError(
            "open_clip models need the clip extra: pip install 'headscope[clip]' (open_clip_torch)"
        ) from None
    root = logging.getLogger()
    if _random_init_said not in root.filters:
        root.addFilter(_random_init_said)
    return open_clip


def split_arch(arch: str) -> tuple[str, str | None]:
    """``ARCH/PRETRAINED`` -> ``(ARCH, PRETRAINED)``; ``ARCH`` -> ``(ARCH, None)``."""
    name, _, tag = arch.partition("/")
    return name, tag or None


def check_name(arch: str) -> tuple[str, str | None]:
    """The architecture and pretrained tag of an ``open_clip:`` id, checked against open_clip's lists.

    Raises:
        UnknownModelError: open_clip has no such architecture, or no such pretrained tag for it.
    """
    oc = _open_clip()
    name, tag = split_arch(arch)
    if name not in oc.list_models():
        raise UnknownModelError(f"open_clip has no architecture named {name!r} (open_clip.list_models())")
    if tag is not None and tag not in oc.list_pretrained_tags_by_model(name):
        tags = ", ".join(oc.list_pretrained_tags_by_model(name)) or "none"
        raise UnknownModelError(f"open_clip has no pretrained weights {tag!r} for {name} (it has: {tags})")
    return name, tag


def hub_entry(name: str, tag: str) -> CatalogEntry | None:
    """Where open_clip reads the weights ``tag`` of ``name`` on the Hugging Face hub, as a catalogue
    entry (what :func:`app.zoo.download.cached_weights` looks for); None for weights at a URL or in
    a file of their own (only open_clip knows)."""
    from open_clip.pretrained import get_pretrained_cfg

    from .catalog import CatalogEntry, _split_hub

    cfg = get_pretrained_cfg(name, tag) or {}
    hub = str(cfg.get("hf_hub") or "")
    if not hub or cfg.get("file"):
        return None
    repo, file = _split_hub(hub)
    return CatalogEntry(
        f"{name}/{tag}", "siglip" if "siglip" in name.lower() else "clip", repo, file or None, "open_clip"
    )


class _DropDownloadError(logging.Filter):
    """Drops open_clip's own ``Failed to download weights ...`` ERROR line (logged on the root
    logger just before it raises): the failure is reported once, in our words, by the caller."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno >= logging.ERROR and str(record.msg).startswith("Failed to download weights"))


@contextlib.contextmanager
def _quiet_download_errors() -> Iterator[None]:
    root, drop = logging.getLogger(), _DropDownloadError()
    root.addFilter(drop)
    try:
        yield
    finally:
        root.removeFilter(drop)


def _create(spec: ModelSpec) -> nn.Module:
    oc = _open_clip()
    name, tag = check_name(spec.arch)
    if tag is None:
        # under torch.device("meta") (loaders.skeleton) open_clip must not move it off the meta device
        meta = torch.get_default_device().type == "meta"
        with seeded():
            return oc.create_model(name, pretrained=None, **({"device": "meta"} if meta else {}))
    from .download import cached_weights, unreachable_message

    reachable = hub_reachable()
    entry = None if reachable else hub_entry(name, tag)
    if entry is not None and cached_weights(entry) is None:
        # Said at once, as for timm:NAME: no build, no attempt open_clip would log as an ERROR.
        raise HubUnreachableError(unreachable_message(entry, on_server=False))
    try:
        # Unreachable hub: the local cache only, and a failure in seconds instead of retries.
        with hub_offline(not reachable), _quiet_download_errors():
            return oc.create_model(name, pretrained=tag, require_pretrained=True)
    except Exception as e:
        raise ModelLoadError(
            f"could not get the pretrained weights {tag!r} of open_clip model {name} "
            f"({type(e).__name__}: {first_line(e)}). They come from the Hugging Face hub: run "
            f"`headscope fetch open_clip:{name}/{tag}` on a machine with internet (they land in the HF "
            f"cache, ~/.cache/huggingface, which you can copy over), or use open_clip:{name} (random weights)."
        ) from None


def _act_name(mlp: nn.Module) -> str:
    act = type(mlp.gelu).__name__
    if act == "QuickGELU":
        return "quick_gelu"
    if act == "GELU" and getattr(mlp.gelu, "approximate", "none") == "none":
        return "gelu"
    raise UnsupportedModelError(f"open_clip ViT with activation {act}: not supported")


def timm_vit_of(visual: Any) -> nn.Module:
    """open_clip's ``VisionTransformer`` as a timm ``VisionTransformer`` with the same weights.

    Raises:
        UnsupportedModelError: options timm's ViT does not have (attentional pooling, custom
            blocks, mean pooling, no pre-norm).
    """
    from timm.models.vision_transformer import VisionTransformer

    blocks = list(visual.transformer.resblocks)
    why = None
    if visual.attn_pool is not None:
        why = "attentional pooling (CoCa)"
    elif visual.pool_type != "tok":
        why = f"pool_type {visual.pool_type!r}"
    elif isinstance(visual.ln_pre, nn.Identity):
        why = "no ln_pre"
    elif any(type(b).__name__ != "ResidualAttentionBlock" or hasattr(b, "ln_1_kv") for b in blocks):
        why = "custom attention blocks"
    if why:
        raise UnsupportedModelError(f"open_clip ViT with {why}: not supported (plain CLIP ViTs and SigLIP are)")
    b0 = blocks[0]
    width, heads = int(visual.class_embedding.shape[0]), int(b0.attn.num_heads)
    ls = getattr(b0.ls_1, "gamma", None)
    vit = VisionTransformer(
        img_size=tuple(visual.image_size),
        patch_size=tuple(visual.patch_size),
        embed_dim=width,
        depth=len(blocks),
        num_heads=heads,
        mlp_ratio=b0.mlp.c_fc.out_features / width,
        qkv_bias=True,
        init_values=1.0 if ls is not None else None,
        class_token=True,
        global_pool="token",
        pre_norm=True,
        num_classes=0,
        norm_layer=partial(nn.LayerNorm, eps=b0.ln_1.eps),
        act_layer=_act_name(b0.mlp),
        weight_init="skip",  # every weight comes from open_clip next
    )
    sd = {
        "cls_token": visual.class_embedding[None, None],
        "pos_embed": visual.positional_embedding[None],
        "patch_embed.proj.weight": visual.conv1.weight,
        "norm_pre.weight": visual.ln_pre.weight,
        "norm_pre.bias": visual.ln_pre.bias,
        "norm.weight": visual.ln_post.weight,
        "norm.bias": visual.ln_post.bias,
    }
    names = {
        "ln_1": "norm1",
        "ln_2": "norm2",
        "attn.in_proj_weight": "attn.qkv.weight",
        "attn.in_proj_bias": "attn.qkv.bias",
        "attn.out_proj": "attn.proj",
        "mlp.c_fc": "mlp.fc1",
        "mlp.c_proj": "mlp.fc2",
        "ls_1": "ls1",
        "ls_2": "ls2",
    }
    for i, blk in enumerate(blocks):
        for k, v in blk.state_dict().items():
            for a, b in names.items():
                if k.startswith(a):
                    k = b + k[len(a) :]
                    break
            sd[f"blocks.{i}.{k}"] = v
    vit.load_state_dict(sd, strict=True)
    if visual.proj is not None:  # the projection into the joint space: the head, bias-free
        D, E = visual.proj.shape  # width, embedding
        head = nn.Linear(D, E, bias=False)
        head.weight.data.copy_(visual.proj.detach().T)
        vit.head = head  # num_classes stays 0: the output kind is `embedding`
    return vit


def _tower(clip: nn.Module) -> tuple[nn.Module, str]:
    """The image tower as a timm model, and the model's kind (``clip`` or ``siglip``)."""
    from open_clip.timm_model import TimmModel
    from open_clip.transformer import VisionTransformer as OpenClipViT

    visual: Any = clip.visual
    kind = "siglip" if getattr(clip, "logit_bias", None) is not None else "clip"
    if isinstance(visual, OpenClipViT):
        return timm_vit_of(visual), kind
    if isinstance(visual, TimmModel):
        trunk: Any = visual.trunk
        if len(visual.head) > 0:  # open_clip's projection after the trunk's head
            trunk.head = nn.Sequential(trunk.head, visual.head)
        trunk.num_classes = 0
        return trunk, kind
    raise UnsupportedModelError(f"open_clip image tower {type(visual).__name__}: only ViT towers are supported")


@dataclass
class OpenClipParts:
    """What :func:`app.zoo.loaders.build` makes a :class:`LoadedModel` of: the image tower as a
    timm model, what feeds it, and the text tower (None, with why, where it cannot be used)."""

    model: nn.Module
    input_size: tuple[int, int]
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    description: str
    text: TextTower | None
    text_note: str


def open_clip_parts(spec: ModelSpec) -> OpenClipParts:
    """An open_clip model taken apart: its image tower as a timm ViT, its text tower."""
    oc = _open_clip()
    clip = _create(spec)
    clip.eval().requires_grad_(False)
    name, tag = split_arch(spec.arch)
    vit, kind = _tower(clip)
    pre = oc.get_model_preprocess_cfg(clip)
    size = pre.get("size", 224)
    size = (size, size) if isinstance(size, int) else tuple(size)
    text: TextTower | None = None
    note = ""
    reachable = hub_reachable()
    try:
        with hub_offline(not reachable):  # a Hugging Face tokenizer (SigLIP): the cache only, offline
            tokenizer = oc.get_tokenizer(name)
        text = TextTower(clip, tokenizer, kind)
    except TextError as e:
        note = str(e)
    except OSError as e:  # a Hugging Face tokenizer (SigLIP) neither cached nor reachable
        note = (
            f"its tokenizer could not be loaded from the Hugging Face hub or its cache ({type(e).__name__}); "
            "load the model once on a machine with internet and copy ~/.cache/huggingface"
            if not reachable
            else f"the text tower could not be loaded ({type(e).__name__}: {first_line(e)})"
        )
    except Exception as e:
        note = f"the text tower could not be loaded ({type(e).__name__}: {first_line(e)})"
    if text is not None:
        clip.visual = nn.Identity()  # the timm copy serves the image; the text tower keeps the rest
    weights = f"pretrained {tag}" if tag else "random weights"
    label = "SigLIP" if kind == "siglip" else "CLIP"
    return OpenClipParts(
        vit, size, tuple(pre["mean"]), tuple(pre["std"]), f"open_clip {name} ({label}, {weights})", text, note
    )
