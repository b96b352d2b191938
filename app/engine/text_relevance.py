"""Relevance for a phrase: which patches make a CLIP-style model match an image to a text, and
which of the text's words matter (issue #42).

Target ``text:PHRASE`` (:class:`TextTarget`): ``y`` = the model's own image-text score of the
phrase, :meth:`app.engine.clip_text.TextTower.logits`: CLIP ``exp(logit_scale) * cos(e_img,
e_txt)`` (what ``logits_per_image`` holds); SigLIP the same plus its ``logit_bias`` (the logit of
its sigmoid).

The image maps are those of :mod:`app.engine.relevance` with this y (``chefer``,
``grad_attention``, ``rollout``, ``attention``, ``random``), plus **LeGrad** (Bousselham et al.
2024, the authors' OpenCLIP wrapper): for each of the last two blocks l (their default
``layer_index=-2``) the block's output tokens are averaged (the CLS token included), put through
the final norm and the projection, normalised, and scored against the normalised text embedding,
``s_l``; the map is ``sum_l mean_queries mean_heads max(0, ds_l/dA_l)`` over the patch columns,
min-max normalised (then, as every map here, divided by its sum). For towers that pool with an
attention head instead of a CLS token (SigLIP's MAP head, timm's ``AttentionPoolLatent``) it is
the authors' SigLIP variant: each of those blocks' output tokens (before the final norm, as their
code reads them) is put through the pooling head, whose own softmax ``[B, H, 1, N]`` takes the
gradient of ``s_l``; the map is ``sum_l mean_heads max(0, ds_l/dA_pool)``, and their correction
applies: the same map for the prompt ``a photo of a``, min-max normalised, zeroes the patches
where it is above 0.8 (``LEGRAD_EMPTY_PROMPT``, ``LEGRAD_CORRECTION``). The pooled token then goes
through ``fc_norm`` and ``head`` (identities on open_clip's SigLIP towers, which have no projection).

The text's own relevance per token is Chefer et al.'s bi-modal rule (ICCV 2021) on the text
tower, from the same backward: ``R = I; R += mean_h max(0, dy/dA_t * A_t) @ R`` over the text's
layers; the tokens' relevance is the row of the token the text embedding is read from (CLIP's
end-of-text token), over the phrase's own tokens, normalised to sum 1.

One forward of both towers and one backward give every map and the tokens' relevance; LeGrad
adds one backward per layer it reads (two), through the last blocks only.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from .ablation import Ablation
from .clip_text import TextError, check_phrase
from .forward import forward_maps
from .model import LoadedModel
from .relevance import (
    DEFAULT_METHOD,
    GRADIENT_METHODS,
    LRP_METHODS,
    METHODS,
    TARGET_KINDS,
    MethodError,
    Relevance,
    Target,
    _attention_row,
    _patch_map,
    _rollout_row,
    gradient_maps,
    parse_methods,
    random_map,
    refuse_windowed_relevance,
)

PREFIX = "text:"
TEXT_METHODS = ("legrad",)  # methods defined for a phrase only
LEGRAD_LAYER_INDEX = -2  # the authors' default: the last two blocks
LEGRAD_EMPTY_PROMPT = "a photo of a"  # the authors' SigLIP correction: patches any prompt lights up
LEGRAD_CORRECTION = 0.8  # ... above this (min-max normalised) are zeroed


@dataclass(frozen=True)
class TextTarget(Target):
    """``text:PHRASE``: the model's image-text score of the phrase (hashable: ``str()`` is the key).

    ``tower``: the model's :class:`~app.engine.clip_text.TextTower` (not part of the key).
    """

    phrase: str = ""
    tower: Any = field(default=None, compare=False, hash=False, repr=False)

    def __str__(self) -> str:
        return PREFIX + self.phrase

    def value(self, out: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
        """The score of each image embedding ``[B, D]`` against the phrase: ``[B]``."""
        emb = self.tower.embeddings([self.phrase]).to(out.device)  # 1, D
        return self.tower.logits(out, emb)[:, 0]

    def class_index(self, ref: torch.Tensor) -> list[int] | None:
        return None


def is_text(spec: object) -> bool:
    """Whether a target (or its spelling) is a phrase."""
    if isinstance(spec, TextTarget):
        return True
    return isinstance(spec, str) and spec.lstrip()[: len(PREFIX)].lower() == PREFIX


def require_text(lm: LoadedModel) -> Any:
    """The model's text tower, or :class:`TextError` (422) for a model without one."""
    if lm.text is None:
        if lm.text_note:  # a CLIP-style model whose text tower did not load: why, not another model
            raise TextError(f"{lm.id} has no text tower here: {lm.text_note}")
        raise TextError(
            f"{lm.id} has no text tower: text targets and zero-shot need a CLIP-style model "
            "(open_clip:ARCH or open_clip:ARCH/PRETRAINED)"
        )
    return lm.text


def parse_text_target(spec: str, lm: LoadedModel) -> TextTarget:
    """``text:PHRASE`` against a model: the phrase checked (empty, too long, not text, too many
    tokens: :class:`TextError`), the model checked for a text tower."""
    refuse_windowed_relevance(lm)
    tower = require_text(lm)
    phrase = check_phrase(spec.lstrip()[len(PREFIX) :])
    tower.check(phrase)
    return TextTarget("text", phrase=phrase, tower=tower)


def _attention_pool(lm: LoadedModel) -> Any:
    """The tower's attention-pooling head (SigLIP's MAP head), or None."""
    return getattr(lm.model, "attn_pool", None)


def has_legrad(lm: LoadedModel) -> bool:
    """Whether LeGrad is defined for the tower: a CLS token (CLIP) or an attention-pooling head (SigLIP)."""
    return "cls" in lm.prefix or _attention_pool(lm) is not None


def text_methods(lm: LoadedModel) -> tuple[str, ...]:
    """Every method a phrase's maps have on this model (LeGrad where there is a CLS token or an
    attention-pooling head; not the LRP rules, which are written for one tower)."""
    return tuple(m for m in METHODS if m not in LRP_METHODS) + (TEXT_METHODS if has_legrad(lm) else ())


def parse_target_methods(
    spec: str | Iterable[str] | None,
    target: Target | str | None,
    lm: LoadedModel,
    default: tuple[str, ...] | None = None,
) -> tuple[str, ...]:
    """Methods for ``target``: :func:`~app.engine.relevance.parse_methods`, plus ``legrad`` for a
    phrase on a model with a CLS token (in the order given; None: ``default`` or every method).

    Raises:
        MethodError: unknown, or ``legrad`` where it is not defined.
    """
    if isinstance(spec, str) and not spec.strip():
        spec = None  # blank is the default, as a blank REST parameter is
    if spec is None:
        return default if default is not None else (text_methods(lm) if is_text(target) else METHODS)
    if not isinstance(spec, str):
        given = type(spec).__name__
        spec = list(spec) if isinstance(spec, Iterable) else None  # once: a generator is read once
        if spec is None or not all(isinstance(s, str) for s in spec):
            raise MethodError(f"methods: names as text ('chefer,random') or a list of them, not {given}")
    items = [s.strip().lower() for s in (spec.split(",") if isinstance(spec, str) else spec)]
    for name in items:
        check_method(name, target, lm)
    rest = [n for n in items if n not in TEXT_METHODS]
    if rest or not items:
        # the usual errors (an unknown method, none at all), naming what this target takes
        parse_methods(rest, offered=text_methods(lm) if is_text(target) else METHODS)
    return tuple(dict.fromkeys(items))


def parse_method(spec: str, target: Target | str | None, lm: LoadedModel) -> str:
    """The one method of a map for ``target`` (``chefer``; any case), checked as
    :func:`parse_target_methods` checks a list: the same errors wherever it is asked (REST, Python).

    Raises:
        MethodError: unknown, not defined for the target, or more than one.
    """
    if spec is None:  # to the faithfulness test None means every method: here it names none
        offered = text_methods(lm) if is_text(target) else METHODS
        raise MethodError(f"method: name one method (got None); this target takes {', '.join(offered)}")
    if isinstance(spec, str) and not spec.strip():
        spec = DEFAULT_METHOD  # blank is the default, as a blank REST parameter is
    names = parse_target_methods(spec, target, lm)
    if len(names) != 1:
        raise MethodError(
            f"method: one method per map (got {str(spec)[:80]!r}); the faithfulness test compares several"
        )
    return names[0]


def check_method(method: str, target: Target | str | None, lm: LoadedModel) -> None:
    """Raise :class:`MethodError` for ``legrad`` without a phrase or on a model without a CLS token,
    and for an LRP method with a phrase."""
    if method in LRP_METHODS and is_text(target):
        raise MethodError(
            f"{method} is not offered for a phrase: its LRP rules cover the image tower alone; use chefer, "
            "grad_attention, rollout, attention, random or legrad"
        )
    if method not in TEXT_METHODS:
        return
    if not is_text(target):
        raise MethodError(f"{method} explains a phrase: use target=text:PHRASE on a CLIP-style model")
    if not has_legrad(lm):
        raise MethodError(
            f"{method} is implemented for image towers with a CLS token (CLIP) or an attention-pooling head "
            f"(SigLIP); {lm.id} pools its tokens otherwise"
        )


def _legrad(
    lm: LoadedModel, feats: list[torch.Tensor], maps: list[torch.Tensor], text: torch.Tensor, start: int
) -> torch.Tensor:
    """LeGrad's sum over layers ``start..L-1`` before min-max: ``[B, N]`` over all tokens."""
    m: Any = lm.model
    t = F.normalize(text.detach().float(), dim=-1)  # B, D
    acc = None
    for i, f in enumerate(feats):
        e = F.normalize(m.head(m.norm(f.mean(1))).float(), dim=-1)  # B, D
        s = (e * t).sum()
        g = torch.autograd.grad(s, maps[start + i], retain_graph=True)[0]  # B, H, N, N
        part = g.float().clamp_min(0).mean(1).mean(1)  # B, N: heads, then query rows
        acc = part if acc is None else acc + part
    assert acc is not None
    return acc


def _pool_with_map(pool: Any, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """timm's ``AttentionPoolLatent`` written out so that its softmax stays in the autograd graph:
    ``(pooled [B, D], maps [B, H, latent, N])``."""
    B, N, C = x.shape  # batch, tokens, width
    if pool.pos_embed is not None:
        x = x + pool.pos_embed.unsqueeze(0).to(x.dtype)
    H, d, Q = pool.num_heads, pool.head_dim, pool.latent_len
    q = pool.q(pool.latent.expand(B, -1, -1)).reshape(B, Q, H, d).transpose(1, 2)  # B, H, Q, d
    k, v = pool.kv(x).reshape(B, N, 2, H, d).permute(2, 0, 3, 1, 4).unbind(0)  # each B, H, N, d
    q, k = pool.q_norm(q), pool.k_norm(k)
    p = ((q * pool.scale) @ k.transpose(-2, -1)).softmax(-1)  # B, H, Q, N
    o = pool.proj((p @ v).transpose(1, 2).reshape(B, Q, C))  # B, Q, C
    if pool.mlp is not None:
        o = o + pool.mlp(pool.norm(o))
    if pool.pool == "token":
        o = o[:, 0]
    elif pool.pool == "avg":
        o = o.mean(1)
    return o, p


def _legrad_pooled(lm: LoadedModel, feats: list[torch.Tensor], text: torch.Tensor, tower: Any) -> torch.Tensor:
    """LeGrad's SigLIP variant before the last min-max: ``[B, N]`` over the tokens the head pools."""
    m: Any = lm.model
    t = F.normalize(text.detach().float(), dim=-1)  # B, D
    empty = F.normalize(tower.embeddings([LEGRAD_EMPTY_PROMPT]).to(t.device).float(), dim=-1)  # 1, D
    acc = acc_empty = None
    for f in feats:
        pooled, p = _pool_with_map(m.attn_pool, f.detach().requires_grad_(True))  # grads of the head only
        e = F.normalize(m.head(m.fc_norm(pooled)).float(), dim=-1)  # B, D
        g, g_empty = (
            torch.autograd.grad((e * u).sum(), p, retain_graph=True)[0].float().clamp_min(0).mean(1)[:, 0]  # B, N
            for u in (t, empty)
        )
        acc = g if acc is None else acc + g
        acc_empty = g_empty if acc_empty is None else acc_empty + g_empty
    assert acc is not None and acc_empty is not None
    lo, hi = acc_empty.amin(1, keepdim=True), acc_empty.amax(1, keepdim=True)
    flat = hi <= lo
    empty_map = (acc_empty - lo) / torch.where(flat, torch.ones_like(hi), hi - lo)
    return acc.masked_fill((empty_map > LEGRAD_CORRECTION) & ~flat, 0.0)


def _min_max(v: torch.Tensor) -> torch.Tensor:
    lo, hi = v.min(), v.max()
    return (v - lo) / (hi - lo) if hi > lo else torch.zeros_like(v)


def _text_tokens(tower: Any, ids: torch.Tensor, readout: int, maps, grads) -> list[dict]:
    """Chefer et al.'s bi-modal rule on the text tower for one phrase: ``[{token, relevance}]``."""
    T = ids.shape[0]
    R = torch.eye(T, dtype=torch.float32)
    for a, g in zip(maps, grads):
        cam = (g.float() * a.float()).clamp_min(0).mean(0)  # T, T
        R = R + cam @ R
    words = tower.words(ids, readout)
    row = R[readout, [i for i, _ in words]] if words else torch.zeros(0)
    s = float(row.sum())
    vals = (row / s).tolist() if s > 0 else [1.0 / max(1, len(words))] * len(words)
    return [{"token": w, "position": i, "relevance": v} for (i, w), v in zip(words, vals)]


def text_relevance(
    lm: LoadedModel,
    pixels: torch.Tensor,
    target: TextTarget | str,
    methods: str | Iterable[str] | None = None,
    *,
    seed: int = 0,
    amp_dtype: torch.dtype | None = None,
    ablate: Ablation = (),
) -> list[Relevance]:
    """Relevance maps of a batch of images for a phrase, and the phrase's tokens' relevance.

    One forward of the image tower keeping its maps, one forward of the text tower (per image,
    so each image's token relevance is its own) and one backward; LeGrad one more per layer.
    Arguments as :func:`app.engine.relevance.relevance`.
    """
    tgt = target if isinstance(target, TextTarget) else parse_text_target(target, lm)
    names = parse_target_methods(methods, tgt, lm)
    tower = require_text(lm)
    hw = (int(pixels.shape[-2]), int(pixels.shape[-1]))
    L = lm.num_layers
    legrad = "legrad" in names
    start = max(0, L + LEGRAD_LAYER_INDEX)
    feats: list[torch.Tensor] = []
    hooks = []
    if legrad:
        blocks: Any = lm.model.blocks
        hooks = [b.register_forward_hook(lambda m, a, o: feats.append(o)) for b in list(blocks)[start:]]
    try:
        fwd = forward_maps(lm, pixels, grad=True, amp_dtype=amp_dtype, ablate=ablate)
    finally:
        for h in hooks:
            h.remove()
    B = pixels.shape[0]
    full: dict[str, torch.Tensor] = {}
    with torch.inference_mode(False), torch.enable_grad():
        ids = tower.tokenize([tgt.phrase]).expand(B, -1)  # B, T: each image its own text graph
        tf = tower.forward(ids, grad=True)
        y = tower.logits(fwd.output, tf.embedding).diagonal()  # B
        grads = torch.autograd.grad(y.sum(), [*fwd.maps, fwd.features, *tf.maps], retain_graph=legrad)
        g_img, g_z, g_txt = grads[:L], grads[L], grads[L + 1 :]
        with torch.no_grad():
            full = gradient_maps(
                [a.detach() for a in fwd.maps], list(g_img), fwd.features.detach(), g_z, GRADIENT_METHODS & set(names)
            )
        if legrad and "cls" not in lm.prefix:  # SigLIP: the attention-pooling head's own map
            full["legrad"] = _legrad_pooled(lm, feats, tf.embedding, tower).detach()
        elif legrad:
            full["legrad"] = _legrad(lm, feats, fwd.maps, tf.embedding, start).detach()
        tokens = [
            _text_tokens(
                tower, ids[b].cpu(), tf.readout[b], [m[b].detach().cpu() for m in tf.maps], [g[b].cpu() for g in g_txt]
            )
            for b in range(B)
        ]
    layout: Any = lm.layout(hw)
    prefix, grid, cls = layout.num_prefix, layout.grid, layout.cls_index
    values = y.detach().float().cpu().tolist()
    out = []
    for b, att in enumerate(fwd.captures):
        maps: dict[str, torch.Tensor] = {}
        uniform: list[str] = []
        for name in names:
            if name == "random":
                maps[name] = random_map(grid[0] * grid[1], seed).reshape(grid)
                continue
            if name == "legrad":
                v = full[name][b].cpu()
                v = torch.cat([v[:prefix], _min_max(v[prefix:])])
            elif name in full:
                v = full[name][b]
            elif name == "rollout":
                v = _rollout_row(att, cls)
            else:
                v = _attention_row(att, att.num_layers - 1, cls)
            m, flat = _patch_map(v.detach().cpu(), prefix)
            maps[name] = m.reshape(grid)
            if flat:
                uniform.append(name)
        rel = Relevance(
            target=tgt,
            y=values[b],
            grid=grid,
            maps=maps,
            class_index=None,
            rows="cls" if cls is not None else "mean",
            seed=seed,
            uniform=uniform,
        )
        rel.text_tokens = tokens[b]
        out.append(rel)
    return out


def zero_shot(lm: LoadedModel, pixels: torch.Tensor, labels: list[str], amp_dtype: torch.dtype | None = None) -> dict:
    """Zero-shot classification of one image over ``labels``: the model's scores and probabilities.

    One forward of the image tower (no maps kept) and the labels' text embeddings (cached per
    model and phrase). CLIP: the softmax over the labels; SigLIP: each label's sigmoid.

    Returns:
        ``{"logits": [K], "probabilities": [K], "rule": "softmax" | "sigmoid"}`` (floats).
    """
    from .device import autocast
    from .output import head_output

    tower = require_text(lm)
    for lab in labels:
        tower.check(lab)
    hw = (int(pixels.shape[-2]), int(pixels.shape[-1]))
    with torch.inference_mode(), autocast(pixels.device.type, amp_dtype):
        feats = lm.model.forward_features(pixels)  # type: ignore[operator]
        img = head_output(lm, feats, hw).float()  # 1, D
        logits = tower.logits(img, tower.embeddings(labels).to(img.device))[0]  # K
        probs = tower.probabilities(logits)
    return {
        "logits": logits.cpu().tolist(),
        "probabilities": probs.cpu().tolist(),
        "rule": "sigmoid" if tower.kind == "siglip" else "softmax",
    }


TARGET_KINDS["text"] = (parse_text_target, text_relevance)

__all__ = ["TextError", "TextTarget", "is_text", "parse_text_target", "text_relevance", "zero_shot"]
