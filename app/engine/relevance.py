"""Relevance maps: which patches the model's output depends on, for one scalar of that output.

Raw attention is not an explanation of the output (Jain & Wallace 2019): it says where a head
looks, not what the output depends on. The maps here combine attention with gradients of a
**target** ``y``, one scalar of the model's own output, following Chefer, Gur & Wolf, "Generic
Attention-model Explainability for Interpreting Bi-Modal and Encoder-Decoder Transformers"
(ICCV 2021). The definitions (issue #27; docs/relevance.md has the maths and the sources):

Targets (:func:`parse_target`), by output kind:

* saliency (the default model's decoder): ``output`` = the mean of the output map;
  ``box:X0,Y0,X1,Y1`` = the mean over output-map rows ``Y0:Y1`` and columns ``X0:X1`` (pixels,
  end-exclusive). Means, not sums: Chefer's additive rule is not invariant to the scale of y.
* classes: ``class:N`` = the logit of class N (before the softmax); ``top`` = the logit of the
  unperturbed top-1 class.
* embedding: ``embedding`` = ``<e, e0> / |e0|^2`` with ``e0`` the unperturbed pooled embedding
  held constant (1 for the unperturbed picture; a cosine would have zero gradient at e = e0).

Maps (:data:`METHODS`), over the patch tokens only (prefix tokens and registers dropped), each
normalised to sum 1. With ``A_l`` layer l's softmax maps ``[H, N, N]`` and ``z`` the final normed
tokens (what ``forward_features`` returns and the output head reads):

* ``cam_l = mean_h max(0, dy/dA_l * A_l)``; readout ``w_i = |sum_c z_ic dy/dz_ic|``;
* ``chefer``: ``R = I``; ``R = R + cam_l @ R`` for l = 0 .. L-1; map = ``w @ R``;
* ``grad_attention``: map = ``w @ cam_{L-1}``;
* ``rollout``: the attention rollout Headscope serves (:func:`app.engine.analysis.rollout`, its
  defaults), the CLS row;
* ``attention``: the mean over heads of the last layer's CLS row;
* ``random``: a seeded random map, the baseline every other method has to beat.

For models without a CLS token (SigLIP) ``rollout`` and ``attention`` take the mean over all
rows; :attr:`Relevance.rows` says which.

Everything comes from one forward that keeps the softmax maps in the autograd graph
(:func:`app.engine.forward.forward_maps`) and one backward to the maps and the final tokens,
for a batch of images at once (images do not interact, so ``d sum_b y_b / dA`` is each image's
own gradient). ``w @ R`` is computed as ``w (I + cam_{L-1}) ... (I + cam_0)``: L vector-matrix
products instead of L N x N matrix products, the same number.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .ablation import Ablation
from .analysis import rollout
from .block_capture import ImageAttention
from .device import where_float64
from .forward import forward_maps
from .model import LoadedModel
from .selection import MAX_SPEC, Selection, SelectionError

METHODS = ("chefer", "grad_attention", "rollout", "attention", "random", "chefer2021", "attnlrp")
DEFAULT_METHOD = "chefer"  # one map's method where none is named (REST, Python)
GRADIENT_METHODS = frozenset({"chefer", "grad_attention", "chefer2021"})
LRP_METHODS = frozenset({"chefer2021", "attnlrp"})
SIGNED_METHODS = frozenset({"attnlrp"})  # maps with negative patches: divided by |sum|, not clipped
# The CVPR 2021 rule's first layer, as the authors' evaluation (generate_visualizations.py) calls
# generate_LRP(..., start_layer=1): layer 0's map is left out of the product.
CHEFER2021_START_LAYER = 1
# The one method that takes a start layer (``start_layer`` in the Python API and the REST API).
START_LAYER_METHOD = "chefer2021"


def _chefer2021_text(start_layer: int) -> str:
    """``chefer2021``'s one line, with the first layer of its product (the start actually used)."""
    whose = (
        "the authors' evaluation's"
        if start_layer == CHEFER2021_START_LAYER
        else f"the authors' evaluation uses {CHEFER2021_START_LAYER}"
    )
    return (
        "Chefer, Gur & Wolf, CVPR 2021 (transformer attribution): LRP relevance of each attention map "
        "(alpha-beta rules) times its gradient, positive part, mean over heads, rolled out from layer "
        f"{start_layer} (start_layer={start_layer}, {whose}; R = prod_l (I + cam_l) over layers {start_layer}..L-1), "
        "read out by each final token's relevance"
    )


METHOD_TEXT = {
    "chefer": "Chefer et al. 2021: R = I; R += mean_h max(0, dy/dA_l * A_l) @ R over the layers; "
    "the readout |z . dy/dz| of each final token times R",
    "grad_attention": "the last layer's mean_h max(0, dy/dA * A), read out by |z . dy/dz| (Chefer et al. 2021's "
    "one-layer ablation)",
    "rollout": "attention rollout (Abnar & Zuidema 2020): prod_l rownorm(0.5 A_l + 0.5 I), heads fused by the mean",
    "attention": "the last layer's raw attention, mean over heads",
    "random": "a seeded random map: the baseline",
    "chefer2021": _chefer2021_text(CHEFER2021_START_LAYER),
    "attnlrp": "AttnLRP (Achtibat et al., ICML 2024): one backward pass with LRP rules for softmax, the attention "
    "products, LayerNorm and the non-linearities; gradient x input per patch (signed: negative patches speak "
    "against the target)",
    "legrad": "LeGrad (Bousselham et al. 2024): the last two blocks' mean_queries mean_h max(0, ds_l/dA_l), s_l the "
    "phrase's cosine with block l's pooled, normed, projected tokens; for SigLIP, block l's tokens through the "
    "attention-pooling head, the gradient taken at that head's attention, and "
    "the patches where the map of 'a photo of a' is above 0.8 zeroed (the authors' correction); min-max "
    "normalised (phrases only)",
}

# Output kind -> the targets it takes (spelled as a user writes them) and its default.
TARGETS = {
    "saliency": ("output", "box:X0,Y0,X1,Y1"),
    "classes": ("top", "class:N"),
    "embedding": ("embedding",),
}
DEFAULT_TARGETS = {"saliency": "output", "classes": "top", "embedding": "embedding"}

# Target kinds defined in their own modules, by the prefix of their spelling: ``text`` ->
# (parse(spec, lm) -> Target, maps(lm, pixels, target, methods, **kw) -> list[Relevance]).
# app.engine.text_relevance registers ``text:PHRASE`` when imported.
TARGET_KINDS: dict[str, tuple[Callable[..., Any], Callable[..., Any]]] = {}

_BOX = re.compile(r"box:([0-9]{1,6}),([0-9]{1,6}),([0-9]{1,6}),([0-9]{1,6})")
_CLASS = re.compile(r"class:([0-9]{1,7})")


class TargetError(SelectionError):
    """A malformed target, or one of the wrong kind for the model (answered as 422)."""

    code = "bad_target"


class MethodError(SelectionError):
    """An unknown relevance method (answered as 422)."""

    code = "bad_method"


class StartLayerError(SelectionError):
    """A ``start_layer`` that is not a layer of the model, not an integer, or given without
    ``chefer2021``, the one method that takes it (answered as 422)."""

    code = "bad_start_layer"


class RelevanceUnsupportedError(SelectionError):
    """Relevance asked of a model it is not defined for: windowed models (answered as 422)."""

    code = "relevance_unsupported"


WINDOWED = (
    "relevance maps are defined for global self-attention over one token grid (vit, deit, dinov2, "
    "eva, beit, siglip, flexivit); a windowed model (Swin) attends within shifted windows on "
    "per-stage grids joined by patch merging, so there is no N x N map per layer to propagate "
    "through and no CLS token to read out"
)


def method_text(method: str, start_layer: int | None = None) -> str:
    """A method's definition in one line (:data:`METHOD_TEXT`); ``chefer2021``'s names the first
    layer of its product, ``start_layer`` (None: :data:`CHEFER2021_START_LAYER`)."""
    if method == START_LAYER_METHOD and start_layer is not None:
        return _chefer2021_text(start_layer)
    return METHOD_TEXT[method]


def check_start_layer(start_layer: Any, num_layers: int) -> int:
    """``start_layer`` as the first layer of ``chefer2021``'s product: an integer in ``0..L-1``.

    Negative values are refused, not counted from the end: the product's start is a layer index
    as the authors' ``start_layer`` is, and a wrapped -1 would silently be the last layer.

    Raises:
        StartLayerError: not an integer (a bool is not one), or outside ``0..num_layers-1``.
    """
    value: int | None = None
    if not isinstance(start_layer, bool):  # True is an int to Python, not a layer to a user
        try:
            value = operator.index(start_layer)  # int and numpy's integers; not a float or a string
        except TypeError:
            value = None
    if value is None:
        raise StartLayerError(
            f"start_layer is an integer layer index 0..{num_layers - 1} (the first layer of chefer2021's product; "
            f"default {CHEFER2021_START_LAYER}); got {type(start_layer).__name__} {str(start_layer)[:40]}"
        )
    if not 0 <= value < num_layers:
        raise StartLayerError(
            f"start_layer {value} is not a layer of this {num_layers}-layer model: use 0..{num_layers - 1} "
            f"(the first layer of chefer2021's product; default {CHEFER2021_START_LAYER}, the authors' evaluation's; "
            "negative values are not counted from the end)"
        )
    return value


def resolve_start_layer(start_layer: Any, methods: Iterable[str], num_layers: int) -> int | None:
    """The ``chefer2021`` start layer a request asks for, checked: None when ``chefer2021`` is not
    among ``methods``, else ``start_layer`` (None: :data:`CHEFER2021_START_LAYER`).

    Raises:
        StartLayerError: ``start_layer`` given without ``chefer2021`` (no other method has a start
            layer: silently ignoring it would answer a question that was not asked), or not a
            layer of the model (:func:`check_start_layer`).
    """
    methods = tuple(methods)
    if START_LAYER_METHOD not in methods:
        if start_layer is not None:
            raise StartLayerError(
                f"start_layer is the first layer of chefer2021's product and only chefer2021 takes it; the methods "
                f"asked for are {', '.join(methods)}: leave start_layer out, or add chefer2021"
            )
        return None
    return check_start_layer(CHEFER2021_START_LAYER if start_layer is None else start_layer, num_layers)


def refuse_windowed_relevance(lm: LoadedModel) -> None:
    """Raise :class:`RelevanceUnsupportedError` for a windowed model."""
    if lm.stages is not None:
        raise RelevanceUnsupportedError(f"{lm.id}: {WINDOWED}")


@dataclass(frozen=True)
class Target:
    """One scalar of the model's output (hashable: part of a cache key; ``str()`` spells it).

    ``kind``: ``output``, ``box``, ``class``, ``top`` or ``embedding``; ``box``: ``(X0, Y0,
    X1, Y1)`` in output-map pixels, end-exclusive; ``index``: the class of ``class:N``.
    """

    kind: str
    box: tuple[int, int, int, int] | None = None
    index: int | None = None

    def __str__(self) -> str:
        if self.kind == "box":
            assert self.box is not None
            return "box:" + ",".join(map(str, self.box))
        if self.kind == "class":
            return f"class:{self.index}"
        return self.kind

    def value(self, out: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
        """The target of each output: ``[B]``.

        Args:
            out: ``[B, ...]`` outputs (saliency ``[B, H, W]``, logits ``[B, C]``, embedding
                ``[B, D]``).
            ref: the unperturbed outputs, ``[B, ...]`` or ``[1, ...]``, detached: which class is
                ``top`` and what ``e0`` is. Pass ``out.detach()`` for the unperturbed picture.
        """
        if self.kind == "output":
            return out.flatten(1).mean(1)
        if self.kind == "box":
            assert self.box is not None
            x0, y0, x1, y1 = self.box
            return out[:, y0:y1, x0:x1].flatten(1).mean(1)
        if self.kind == "class":
            return out[:, self.index]
        if self.kind == "top":
            top = ref.argmax(-1, keepdim=True).expand(out.shape[0], 1)  # B, 1
            return out.gather(-1, top)[:, 0]
        e0 = ref.expand_as(out)  # B, D
        return (out * e0).sum(-1) / (e0 * e0).sum(-1)

    def score(self, out: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
        """What the perturbation test's curve divides: ``[B]``, positive for every input.

        Classes: the target class's softmax probability (a logit's sign is arbitrary: with a
        negative logit ``y / y0`` falls when the logit rises towards 0, which reads backwards).
        Saliency: :meth:`value` (a mean of a sigmoid map, in (0, 1)). Embedding: :meth:`value`
        (1 for the unperturbed picture).
        """
        if self.kind not in ("class", "top"):
            return self.value(out, ref)
        out = where_float64(out)  # MPS: on the host ([K, classes]: small)
        idx = torch.tensor(self.class_index(ref), device=out.device)
        if idx.numel() != out.shape[0]:
            idx = idx[:1].expand(out.shape[0])
        # float64: a confident model's other classes underflow float32 (a logit gap of 104 is 1e-45)
        return out.double().softmax(-1).gather(-1, idx[:, None])[:, 0]

    @property
    def score_name(self) -> str:
        """``probability`` (classes) or ``target`` (the value itself): what the curve measures."""
        return "probability" if self.kind in ("class", "top") else "target"

    def class_index(self, ref: torch.Tensor) -> list[int] | None:
        """The class y is the logit of, per image (``class`` and ``top``), else None."""
        if self.kind == "class":
            return [int(self.index or 0)] * ref.shape[0]
        if self.kind == "top":
            return ref.argmax(-1).tolist()
        return None


def _kinds_text(kind: str) -> str:
    return ", ".join(TARGETS[kind])


def parse_target(spec: str | None, lm: LoadedModel, output_hw: tuple[int, int] | None = None) -> Target:
    """Resolve a ``target`` against a model (and, for a box, the size of its output map).

    Args:
        spec: ``output``, ``box:X0,Y0,X1,Y1``, ``class:N``, ``top`` or ``embedding``; None or
            empty for the model's default (``output``, ``top`` or ``embedding`` by output kind).
        lm: the model (its output kind and class count).
        output_hw: ``(H, W)`` of the saliency map, i.e. of the model's input; None checks a box's
            syntax only (call :func:`check_target` once the input size is known).

    Raises:
        TargetError: malformed, of a kind the model does not produce, an empty box or one
            outside the map, or a class out of range. The message names the targets the model
            takes.
        RelevanceUnsupportedError: a windowed model.
        TypeError: ``spec`` is neither a string nor None.
    """
    if spec is not None and not isinstance(spec, str):
        raise TypeError(
            f"target is a string ('output', 'box:X0,Y0,X1,Y1', 'top', 'class:N' or 'embedding') or None (the "
            f"model's default); got {type(spec).__name__} {str(spec)[:40]} (a class index N is 'class:N')"
        )
    refuse_windowed_relevance(lm)
    head = (spec or "").lstrip().split(":", 1)[0].lower()
    if spec and ":" in spec and head in TARGET_KINDS:  # spelled as its own module reads it
        return TARGET_KINDS[head][0](spec, lm)
    kind = lm.output_kind
    if spec and len(spec) > 2 * MAX_SPEC:  # before the spaces go: a megabyte of them is not a target
        raise TargetError("target: specification too long")
    text = (spec or "").strip().lower().replace(" ", "")
    if len(text) > MAX_SPEC:
        raise TargetError("target: specification too long")
    if text in ("", "default"):
        text = DEFAULT_TARGETS[kind]
    takes = f"this model's output is {_OUTPUT_TEXT[kind]}; it takes target={_kinds_text(kind)}"
    reads_text = getattr(lm, "text", None) is not None  # a CLIP-style model: a phrase too
    if reads_text:
        takes += " or text:PHRASE (e.g. text:a dog)"
    head = text.split(":", 1)[0]
    if head in TARGET_KINDS and reads_text:  # "text" without its phrase
        raise TargetError(f"target {text[:40]!r}: write {head}:PHRASE, e.g. {head}:a dog; {takes}")
    if head not in ("output", "box", "class", "top", "embedding"):
        raise TargetError(f"target {text[:40]!r}: unknown; {takes}")
    wanted = {"output": "saliency", "box": "saliency", "class": "classes", "top": "classes", "embedding": "embedding"}
    if wanted[head] != kind:
        raise TargetError(f"target {text[:40]!r} is for {_OUTPUT_TEXT[wanted[head]]}; {takes}")
    if head == "box":
        m = _BOX.fullmatch(text)
        if not m:
            raise TargetError(
                f"target {text[:40]!r}: write box:X0,Y0,X1,Y1 with non-negative integer output-map pixels "
                "(columns X0:X1, rows Y0:Y1, end-exclusive)"
            )
        x0, y0, x1, y1 = (int(g) for g in m.groups())
        if x1 <= x0 or y1 <= y0:
            raise TargetError(f"target {text!r}: the box is empty (it needs X0 < X1 and Y0 < Y1)")
        target = Target("box", box=(x0, y0, x1, y1))
        if output_hw is not None:
            check_target(target, output_hw)
        return target
    if head == "class":
        m = _CLASS.fullmatch(text)
        n = int(getattr(lm.model, "num_classes", 0))
        if not m:
            raise TargetError(f"target {text[:40]!r}: write class:N with N in 0..{n - 1}")
        index = int(m.group(1))
        if index >= n:
            raise TargetError(f"target {text!r}: class {index} is out of range for {n} classes (valid: 0..{n - 1})")
        return Target("class", index=index)
    if ":" in text:
        raise TargetError(f"target {text[:40]!r}: {head} takes no argument; {takes}")
    return Target(head)


_OUTPUT_TEXT = {
    "saliency": "a saliency map",
    "classes": "class logits",
    "embedding": "an embedding (no decoder, no classifier head)",
}


def check_target(target: Target, output_hw: tuple[int, int]) -> None:
    """Raise :class:`TargetError` when a box reaches outside an ``(H, W)`` output map."""
    if target.box is None:
        return
    x0, y0, x1, y1 = target.box
    H, W = output_hw
    if x1 > W or y1 > H:
        raise TargetError(
            f"target {target}: the box reaches outside the {W} x {H} output map (columns 0..{W}, rows 0..{H}, "
            "end-exclusive)"
        )


def parse_methods(
    spec: str | Iterable[str] | None, default: tuple[str, ...] = METHODS, offered: tuple[str, ...] = METHODS
) -> tuple[str, ...]:
    """Relevance methods from ``chefer,attention,random`` (or a sequence); duplicates dropped.

    Args:
        offered: the methods the error names (a phrase's are not all of :data:`METHODS`).

    Raises:
        MethodError: an unknown or empty method.
    """
    if spec is None:
        return default
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    if isinstance(spec, str) and len(spec) > MAX_SPEC:
        raise MethodError("methods: specification too long")
    out: list[str] = []
    for raw in items:
        name = str(raw).strip().lower()
        if name not in METHODS:
            raise MethodError(f"method {name[:40]!r}: unknown; use one of {', '.join(offered)}")
        out.append(name)
    if not out:
        raise MethodError(f"no method given; use one of {', '.join(offered)}")
    return tuple(dict.fromkeys(out))


@dataclass
class Relevance:
    """One image's relevance maps for one target.

    ``maps``: method -> ``[rows, cols]`` on the patch grid, float32 on the host, summing to 1;
    ``y``: the target's value for this picture (float32 forward); ``class_index``: the class y is
    the logit of (classifiers); ``rows``: ``cls`` (rollout and attention read the CLS row) or
    ``mean`` (no CLS token: the mean over all rows); ``seed``: the random map's seed;
    ``uniform``: methods whose map was zero everywhere and is answered as the uniform map;
    ``start_layer``: the first layer of ``chefer2021``'s product where it was computed, else None.
    """

    target: Target
    y: float
    grid: tuple[int, int]
    maps: dict[str, torch.Tensor]
    class_index: int | None
    rows: str
    seed: int
    uniform: list[str] = field(default_factory=list)
    # a phrase (text:PHRASE): each of its tokens' relevance (app.engine.text_relevance)
    text_tokens: list[dict] | None = None
    start_layer: int | None = None

    def info(self) -> dict:
        """JSON-ready metadata (everything but the maps)."""
        return {
            "target": str(self.target),
            "y": self.y,
            "grid": list(self.grid),
            "class_index": self.class_index,
            "rows": self.rows,
            "seed": self.seed,
            "uniform": list(self.uniform),
            "methods": {m: method_text(m, self.start_layer) for m in self.maps},
            "text_tokens": self.text_tokens,
            "start_layer": self.start_layer,
        }


def random_map(num_patches: int, seed: int) -> torch.Tensor:
    """The seeded random map, ``[P]`` float32 on the host, summing to 1 (the same on every device)."""
    g = torch.Generator().manual_seed(seed)
    m = torch.rand(num_patches, generator=g, dtype=torch.float64)
    return (m / m.sum()).float()


def _patch_map(v: torch.Tensor, prefix: int) -> tuple[torch.Tensor, bool]:
    """``[N]`` token weights -> ``[P]`` patch weights summing to 1 (uniform if all zero)."""
    p = v[prefix:].double()
    s = float(p.sum())
    if not s > 0:
        return torch.full(p.shape, 1.0 / p.numel(), dtype=torch.float32), True
    return (p / s).float(), False


def gradient_maps(
    maps: list[torch.Tensor], grads: list[torch.Tensor], z: torch.Tensor, gz: torch.Tensor, methods: Iterable[str]
) -> dict[str, torch.Tensor]:
    """``chefer`` and ``grad_attention`` over all tokens, before dropping prefixes: ``[B, N]``.

    Args:
        maps: per layer ``[B, H, N, N]`` softmax maps ``A_l``.
        grads: per layer ``[B, H, N, N]``: ``dy/dA_l``.
        z: ``[B, N, D]`` final normed tokens; gz: ``dy/dz``.
        methods: which of the two to compute.
    """
    methods = set(methods)
    w = (z.float() * gz.float()).sum(-1).abs()  # B, N: readout
    out: dict[str, torch.Tensor] = {}
    if not methods & {"grad_attention", "chefer"}:  # neither asked (a phrase's LeGrad alone)
        return out
    cams = [(g.float() * a.float()).clamp_min(0).mean(1) for a, g in zip(maps, grads)]  # L x (B, N, N)
    if "grad_attention" in methods:
        out["grad_attention"] = torch.bmm(w.unsqueeze(1), cams[-1]).squeeze(1)  # B, N
    if "chefer" in methods:
        # w @ R with R = (I + cam_{L-1}) ... (I + cam_0): vector-matrix products, last layer first
        out["chefer"] = _rolled(w, reversed(cams))
    return out


def _rolled(w: torch.Tensor, last_first: Iterable[torch.Tensor]) -> torch.Tensor:
    """``w @ (I + cam_{L-1}) ... (I + cam_0)``, ``[B, N]``, the cams ``[B, N, N]`` given from the
    last layer down: ``v = v + v @ cam``, one ``baddbmm`` a layer (on a GPU each operator of a
    launch-bound pass is a kernel launch: ``v[:, None, :] @ cam`` and back cost nine a layer)."""
    v = w.unsqueeze(1)  # B, 1, N
    for cam in last_first:
        v = torch.baddbmm(v, v, cam)  # B, 1, N: v + v @ cam
    return v.squeeze(1)


def _signed_patch_map(v: torch.Tensor, prefix: int) -> tuple[torch.Tensor, bool]:
    """``[P]`` signed patch relevance divided by ``|sum|`` (sums to 1, or -1 where the target's total
    relevance is negative); the order, signs included, is kept."""
    p = v[prefix:].double() if prefix else v.double()
    s = abs(float(p.sum()))
    if not s > 0:
        return torch.full(p.shape, 1.0 / p.numel(), dtype=torch.float32), True
    return (p / s).float(), False


def chefer2021_maps(grads: list[torch.Tensor], lrp: list[torch.Tensor], readout: torch.Tensor) -> torch.Tensor:
    """The CVPR 2021 rule over all tokens: ``[B, N]``.

    Args:
        grads: per layer from the first of the product (the authors' ``start_layer``) to the
            last, ``[B, H, N, N]``: ``dy/dA_l``.
        lrp: the same layers' LRP relevance arriving at ``A_l``, ``[B, H, N, N]`` each.
        readout: ``[B, N]`` weights of the final tokens (the CLS token alone for a CLS classifier).
    """
    # one cam alive at a time: L of them at 518 px and batch 8 would be 720 MB
    cams = ((g.float() * r.float()).clamp(min=0).mean(1) for g, r in reversed(list(zip(grads, lrp))))  # B, N, N
    return _rolled(readout.float(), cams)


def _rules_forward(
    lm: LoadedModel,
    pixels: torch.Tensor,
    rules: str,
    ablate: Ablation,
    patch_weight: torch.Tensor | None = None,
    gradient_pass: bool = False,
):
    """One forward under :func:`app.engine.lrp.relevance_rules`: ``(x, features, output, mode)``,
    ``x`` the graph's leaf (a float copy of the pixels), or with ``patch_weight`` the patch
    embedding's output (``mode.patches``; ``x`` then has no gradient). ``gradient_pass``: see
    :class:`app.engine.lrp.RelevanceMode`. Call with autograd enabled."""
    from .ablation import head_masks, heads_masked
    from .lrp import relevance_rules
    from .output import head_output

    hw = (int(pixels.shape[-2]), int(pixels.shape[-1]))
    masks = head_masks(ablate, lm.num_heads, pixels.device)
    # float32: the weights' dtype (a module of another is refused at load, zoo.loaders.wrap_module)
    x = pixels.detach().clone().to(torch.float32).requires_grad_(patch_weight is None)
    with heads_masked(lm.model, masks), relevance_rules(lm.model, rules, patch_weight, gradient_pass) as mode:
        feats = lm.model.forward_features(x)  # type: ignore[operator]  # timm's
        out = head_output(lm, feats, hw, logits=True)
    return x, feats, out, mode


class PerPicture:
    """One :class:`Target` per picture of a batch (a survey's predicted region: a box each), as
    one target: each picture's value from its own target, so one forward and one backward serve
    the batch (``d sum_b y_b / d x_b`` is still each picture's own gradient)."""

    def __init__(self, targets: Sequence[Target]):
        self.targets = list(targets)
        self.kind = self.targets[0].kind

    def value(self, out: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
        """``[B]``: picture b's target of its own output (see :meth:`Target.value`)."""
        return torch.cat([t.value(out[b : b + 1], ref[b : b + 1]) for b, t in enumerate(self.targets)])

    def class_index(self, ref: torch.Tensor) -> list[int] | None:
        got = [t.class_index(ref[b : b + 1]) for b, t in enumerate(self.targets)]
        return None if all(g is None for g in got) else [g[0] if g else -1 for g in got]

    def at(self, b: int) -> Target:
        return self.targets[b]


def patch_conv(lm: LoadedModel, hw: tuple[int, int]) -> torch.nn.Conv2d | None:
    """The patch embedding's convolution when it cuts ``hw`` into exactly the token grid (kernel
    and stride one patch, no padding), else None.

    Then gradient x input summed over a patch's pixels and channels equals ``g . (e - b)`` at
    that convolution's output ``e`` (a linear map: ``sum x * W^T g = g . W x``), so AttnLRP's
    backward can stop there instead of running the convolution's backward to the pixels.
    """
    conv = getattr(getattr(lm.model, "patch_embed", None), "proj", None)
    if not isinstance(conv, torch.nn.Conv2d):
        return None
    patch = tuple(lm.patch_size)
    plain = (
        tuple(conv.kernel_size) == patch == tuple(conv.stride)
        and tuple(conv.padding) == (0, 0)
        and tuple(conv.dilation) == (1, 1)
        and conv.groups == 1
    )
    grid = lm.layout(hw).grid  # type: ignore[union-attr]
    whole = hw[0] % patch[0] == 0 and hw[1] % patch[1] == 0 and (hw[0] // patch[0], hw[1] // patch[1]) == grid
    return conv if plain and whole else None


def _attnlrp_forward(
    lm: LoadedModel, pixels: torch.Tensor, tgt: Target | PerPicture, ref: torch.Tensor | None, ablate: Ablation
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """AttnLRP: ``(patch relevance [B, P], y [B], the output as reference)``, one forward and
    one backward (``ref`` None: this forward's output is the unperturbed one).

    The relevance is gradient x input at the pixels summed over each patch: computed at the patch
    embedding's output where :func:`patch_conv` allows (the same number, without the backward
    through the embedding), else at the pixels.
    """
    hw = (int(pixels.shape[-2]), int(pixels.shape[-1]))
    grid = lm.layout(hw).grid  # type: ignore[union-attr]
    conv = patch_conv(lm, hw)
    with torch.inference_mode(False), torch.enable_grad():
        x, _, out, mode = _rules_forward(lm, pixels, "attnlrp", ablate, conv.weight if conv is not None else None)
        e = mode.patches  # B, D, rows, cols: the graph's leaf, or None (no patch convolution)
        if conv is not None and (e is None or tuple(e.shape[-2:]) != tuple(grid)):
            # the model did not run that convolution as expected (a resampled kernel): at the pixels
            x, _, out, mode = _rules_forward(lm, pixels, "attnlrp", ablate)
            e = None
        ref = out.detach() if ref is None else ref
        y = tgt.value(out, ref)  # B
        (g,) = torch.autograd.grad(y.sum(), e if e is not None else x)
    if e is None:
        return _pixels_to_patches((x.detach() * g).sum(1), grid, lm.patch_size), y.detach(), ref
    e = e.detach()
    if mode.patch_bias is not None:  # g . (e - b): the bias is no pixel's
        e = e - mode.patch_bias.detach()[None, :, None, None].to(e.dtype)
    return (g * e).sum(1).flatten(1), y.detach(), ref  # B, P (row-major, the tokens' order)


def _chefer2021_forward(
    lm: LoadedModel,
    pixels: torch.Tensor,
    tgt: Target | PerPicture,
    ref: torch.Tensor | None,
    ablate: Ablation,
    start_layer: int,
    gradients: bool,
) -> tuple[list[torch.Tensor] | None, list[torch.Tensor], torch.Tensor, torch.Tensor, torch.Tensor]:
    """The CVPR 2021 rule's passes over one forward under the rules: ``(dy/dA_l or None, LRP
    relevance at A_l, readout [B, N], y [B], the output as reference)``, the two lists for the
    layers from ``start_layer`` (``[B, H, N, N]`` each; none below is computed).

    The relevance starts from ``dy/d(output)`` (one-hot for a class, as the authors'). With
    ``gradients``, a first backward over the same graph (each rule answering its plain
    derivative) gives the maps' gradients, so no second forward is needed for them.
    """
    with torch.inference_mode(False), torch.enable_grad():
        _, feats, out, mode = _rules_forward(lm, pixels, "chefer2021", ablate, gradient_pass=gradients)
        ref = out.detach() if ref is None else ref
        maps = mode.maps[start_layer : lm.num_layers]
        out_leaf = out.detach().requires_grad_(True)
        y_leaf = tgt.value(out_leaf, ref)  # B
        (r_out,) = torch.autograd.grad(y_leaf.sum(), out_leaf)  # dy/d(output): where relevance starts
        g_maps = None
        if gradients:
            mode.gradient = True
            try:
                g_maps = list(torch.autograd.grad(out, maps, r_out, retain_graph=True))
            finally:
                mode.gradient = False
        *r_maps, r_z = torch.autograd.grad(out, [*maps, feats], r_out)
    g_maps = [g.detach() for g in g_maps] if g_maps is not None else None
    return g_maps, [r.detach() for r in r_maps], r_z.detach().sum(-1).abs(), y_leaf.detach(), ref


def _pixels_to_patches(r: torch.Tensor, grid: tuple[int, int], patch: tuple[int, int]) -> torch.Tensor:
    """``[B, H, W]`` pixel relevance summed over each patch: ``[B, rows * cols]`` (pixels beyond the
    last whole patch, which no token sees, left out)."""
    (gh, gw), (ph, pw) = grid, patch
    B = r.shape[0]
    return r[:, : gh * ph, : gw * pw].reshape(B, gh, ph, gw, pw).sum((2, 4)).reshape(B, gh * gw)


def _attention_row(att: ImageAttention, layer: int, cls: int | None) -> torch.Tensor:
    """Mean over heads of ``layer``'s CLS row, or of every row without a CLS token: ``[N]``."""
    if cls is not None:
        return att.rows(layer, queries=[cls]).mean(0)[0]  # N
    return att.rows(layer).mean((0, 1))  # N


def _rollout_row(att: ImageAttention, cls: int | None) -> torch.Tensor:
    """The served rollout (its defaults) to the last layer: the CLS row, or the mean row: ``[N]``."""
    L, H = att.num_layers, att.num_heads
    queries = [cls] if cls is not None else None
    sel = Selection(layers=[L - 1], heads=list(range(H)), queries=queries, aggregate="rollout")
    r = rollout(att, sel)[0, 0]  # queries, N
    return r.mean(0)


def relevance(
    lm: LoadedModel,
    pixels: torch.Tensor,
    target: Target | str | None | Sequence[Target | str] = None,
    methods: str | Iterable[str] | None = None,
    *,
    seed: int = 0,
    amp_dtype: torch.dtype | None = None,
    ablate: Ablation = (),
    chefer2021_start: int = CHEFER2021_START_LAYER,
) -> list[Relevance]:
    """Relevance maps of a batch of images for one target: one :class:`Relevance` per image.

    One forward (maps kept, with autograd when a gradient method is asked for) and one backward;
    ``chefer2021`` and ``attnlrp`` add a forward of their own under their rules (and skip the
    forward that keeps the maps when only they are asked): ``chefer2021`` two backwards over it
    (the maps' gradients, then their relevance), ``attnlrp`` one.

    Args:
        lm: the model (global attention blocks; windowed models are refused).
        pixels: ``[B, 3, H, W]`` normalised images on the model's device, all of one size.
        target: a :class:`Target` or its spelling (None: the model's default), or a list of
            them, one per picture (a box each: one forward and backward for the batch still).
        methods: a subset of :data:`METHODS` (None: all of them), as names or ``"a,b"``.
        seed: the ``random`` map's seed.
        amp_dtype: autocast dtype, or None for plain fp32.
        ablate: ``(layer, head)`` pairs removed before anything is computed.
        chefer2021_start: the first layer of the CVPR 2021 rule's product (the authors'
            ``start_layer``; 1 as their evaluation uses it), ``0..L-1``; checked only when
            ``chefer2021`` is among the methods (no other method reads it).

    Raises:
        TargetError, MethodError, RelevanceUnsupportedError, StartLayerError: bad arguments (422
            in the API).
    """
    refuse_windowed_relevance(lm)
    hw = (int(pixels.shape[-2]), int(pixels.shape[-1]))
    tgt: Target | PerPicture
    if isinstance(target, (list, tuple)):  # one target per picture
        if len(target) != pixels.shape[0]:
            raise ValueError(f"{len(target)} targets for {int(pixels.shape[0])} pictures: one per picture")
        each = [t if isinstance(t, Target) else parse_target(t, lm, hw) for t in target]
        if any(t.kind in TARGET_KINDS for t in each):
            raise TargetError("a phrase target is one target for the whole batch, not one per picture")
        for t in set(each):
            check_target(t, hw)
        tgt = each[0] if len(set(each)) == 1 else PerPicture(each)
    else:
        tgt = target if isinstance(target, Target) else parse_target(target, lm, hw)  # type: ignore[arg-type]
    if tgt.kind in TARGET_KINDS:  # a phrase: both towers (app.engine.text_relevance)
        return TARGET_KINDS[tgt.kind][1](lm, pixels, tgt, methods, seed=seed, amp_dtype=amp_dtype, ablate=ablate)
    names = parse_methods(methods)
    if "chefer2021" in names:  # before any forward: a bad start is the caller's error, not autograd's
        chefer2021_start = check_start_layer(chefer2021_start, lm.num_layers)
    if isinstance(tgt, Target):
        check_target(tgt, hw)
    layout = lm.layout(hw)
    prefix, grid = layout.num_prefix, layout.grid  # type: ignore[union-attr]  # global: a TokenLayout
    cls = layout.cls_index  # type: ignore[union-attr]
    dev = relevance_tensors(
        lm, pixels, tgt, names, amp_dtype=amp_dtype, ablate=ablate, chefer2021_start=chefer2021_start
    )
    start = chefer2021_start if "chefer2021" in names else None
    classes = tgt.class_index(dev.reference)
    return _results(names, dev.maps, tgt, dev.y, dev.captures, grid, prefix, cls, seed, classes, start)


@dataclass
class RelevanceTensors:
    """What :func:`relevance_tensors` computes, on the model's device: ``maps``: method -> ``[B, N]``
    (or ``[B, P]``) before normalisation; ``y``: the target's values ``[B]``; ``reference``: the
    output the target reads; ``captures``: each picture's attention (rollout and raw attention read
    them), else None."""

    maps: dict[str, torch.Tensor]
    y: torch.Tensor
    reference: torch.Tensor
    captures: list


def relevance_tensors(
    lm: LoadedModel,
    pixels: torch.Tensor,
    tgt: Target | PerPicture,
    names: tuple[str, ...],
    *,
    amp_dtype: torch.dtype | None = None,
    ablate: Ablation = (),
    chefer2021_start: int = CHEFER2021_START_LAYER,
) -> RelevanceTensors:
    """The device's part of :func:`relevance`: its forwards and backwards, with nothing read back
    to the host on purpose (``bench/graph_probe.py`` captures it as a CUDA graph and says where
    that fails, and what a replay would gain).

    Args:
        lm: the model (global attention).
        pixels: ``[B, 3, H, W]`` normalised images on the model's device.
        tgt: the target, checked (:func:`check_target`).
        names: methods of :data:`METHODS`, parsed (:func:`parse_methods`).
        amp_dtype, ablate, chefer2021_start: as :func:`relevance` takes them.

    Raises:
        StartLayerError: ``chefer2021`` asked for with a ``chefer2021_start`` that is not a layer of
            the model (its slice of the maps would be empty, or wrap round).
    """
    if "chefer2021" in names:
        chefer2021_start = check_start_layer(chefer2021_start, lm.num_layers)
    full: dict[str, torch.Tensor] = {}
    g_maps: list[torch.Tensor] = []
    B = int(pixels.shape[0])
    if set(names) & {"attnlrp", "chefer2021"} and not set(names) - {"attnlrp", "chefer2021", "random"}:
        # the LRP methods alone: their own forwards give the output too (no forward that keeps
        # the maps; chefer2021's gradients come from its own graph)
        y_lrp: torch.Tensor | None = None
        ref: torch.Tensor | None = None
        if "chefer2021" in names:
            g21, r_maps, readout, y_lrp, ref = _chefer2021_forward(
                lm, pixels, tgt, None, ablate, chefer2021_start, gradients=True
            )
            with torch.no_grad():
                full["chefer2021"] = chefer2021_maps(g21 or [], r_maps, readout)
            del g21, r_maps
        if "attnlrp" in names:
            full["attnlrp"], y_att, ref_att = _attnlrp_forward(lm, pixels, tgt, ref, ablate)
            y_lrp, ref = (y_lrp, ref) if y_lrp is not None else (y_att, ref_att)
        assert y_lrp is not None and ref is not None
        return RelevanceTensors(full, y_lrp, ref, [None] * B)
    grad = bool((GRADIENT_METHODS - {"chefer2021"}) & set(names))
    rows = bool({"rollout", "attention"} & set(names))  # the only methods that read the captures
    fwd = forward_maps(lm, pixels, grad=grad, amp_dtype=amp_dtype, ablate=ablate, captures=rows)
    ref = fwd.output.detach()
    # the caller may be in inference mode (a serving thread): the target joins the graph outside it
    with torch.inference_mode(False), torch.set_grad_enabled(grad):
        y = tgt.value(fwd.output, ref)  # B
        if grad:
            *g_maps, g_z = torch.autograd.grad(y.sum(), [*fwd.maps, fwd.features])
            with torch.no_grad():
                full = gradient_maps(
                    [a.detach() for a in fwd.maps], g_maps, fwd.features.detach(), g_z, GRADIENT_METHODS & set(names)
                )
            del g_z
    # the LRP methods: a forward of their own under the rules (fp32: the rules divide by activations)
    if "chefer2021" in names:
        # the maps' gradients: this forward's when it kept them, else from the rules' own graph
        g21, r_maps, readout, _, _ = _chefer2021_forward(
            lm, pixels, tgt, ref, ablate, chefer2021_start, gradients=not grad
        )
        with torch.no_grad():
            full["chefer2021"] = chefer2021_maps(g21 if g21 is not None else g_maps[chefer2021_start:], r_maps, readout)
        del g21, r_maps
    if "attnlrp" in names:
        full["attnlrp"] = _attnlrp_forward(lm, pixels, tgt, ref, ablate)[0]  # B, P: patches only
    del g_maps
    return RelevanceTensors(full, y.detach(), ref, fwd.captures if rows else [None] * B)


def _results(
    names: tuple[str, ...],
    full: dict[str, torch.Tensor],
    tgt: Target | PerPicture,
    y: torch.Tensor,
    captures: list,
    grid: tuple[int, int],
    prefix: int,
    cls: int | None,
    seed: int,
    classes: list[int] | None,
    start_layer: int | None = None,
) -> list[Relevance]:
    """One :class:`Relevance` per picture from the batch's maps (``full``: method -> ``[B, N]``),
    the captures (rollout and raw attention) and the target's values ``y`` ``[B]`` (``start_layer``:
    chefer2021's, where it was computed)."""
    values = y.float().cpu().tolist()
    # each method's maps of the batch leave the device in one copy, not one per picture
    host = {name: m.detach().cpu() for name, m in full.items()}
    out = []
    for b, att in enumerate(captures):
        maps: dict[str, torch.Tensor] = {}
        uniform: list[str] = []
        for name in names:
            if name in host:
                v = host[name][b]
            elif name == "rollout":
                v = _rollout_row(att, cls)
            elif name == "attention":
                v = _attention_row(att, att.num_layers - 1, cls)
            else:
                maps[name] = random_map(grid[0] * grid[1], seed).reshape(grid)
                continue
            if name in SIGNED_METHODS:  # already over patches
                m, flat = _signed_patch_map(v.detach().cpu(), 0)
            else:
                m, flat = _patch_map(v.detach().cpu(), prefix)
            maps[name] = m.reshape(grid)
            if flat:
                uniform.append(name)
        out.append(
            Relevance(
                target=tgt.at(b) if isinstance(tgt, PerPicture) else tgt,
                y=values[b],
                grid=grid,
                maps=maps,
                class_index=classes[b] if classes is not None else None,
                rows="cls" if cls is not None else "mean",
                seed=seed,
                uniform=uniform,
                start_layer=start_layer,
            )
        )
    return out
