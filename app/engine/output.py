"""The model's own output after the backbone, and how much an ablation changes it.

Three kinds, by what the model has after its blocks:

* ``saliency``: the default model's decoder (:class:`app.zoo.decoder.SaliencyDecoder`): where
  people look, ``[H, W]`` at the model's input size, 0..1. Change: mean |difference|.
* ``classes``: a classifier head (timm ``num_classes > 0``): log-probabilities over the classes,
  shown as the top 5 with ImageNet names (timm's ``ImageNetInfo``) and the whole probability
  vector. Change: the drop of the unablated top class's log-probability (KL divergence beside).
* ``embedding``: neither: the pooled embedding (timm's ``forward_head`` without a head). Change:
  the distance to the unablated embedding relative to its norm (the norms are shown beside).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import torch

from .model import LoadedModel

KINDS = ("saliency", "classes", "embedding")

# The output change each kind is measured by (importance ``metric``).
METRICS = {
    "saliency": "mean_abs_diff",
    "classes": "top1_logprob_drop",
    "embedding": "relative_l2",
}
METRIC_TEXT = {
    "mean_abs_diff": "mean over pixels of |saliency(ablated) - saliency|",
    "top1_logprob_drop": "log p(top class) - log p_ablated(top class), the top class of the unablated model",
    "relative_l2": "|embedding(ablated) - embedding| / |embedding|",
}


def timm_model(lm: LoadedModel) -> Any:
    """``lm.model`` as what it is, a timm model: ``forward_features``, ``forward_head``,
    ``blocks`` and ``embed_dim`` are timm's, unknown to ``nn.Module``'s type."""
    return lm.model


def head_output(lm: LoadedModel, feats: torch.Tensor, input_hw: tuple[int, int], logits: bool = False) -> torch.Tensor:
    """The model's output from its final features, in float32.

    Args:
        lm: the model.
        feats: ``[B, N, D]``, what ``forward_features`` returns (after the final norm).
        input_hw: ``(H, W)`` of the input in pixels.
        logits: classifiers: the logits (before the softmax) instead of log-probabilities.

    Returns:
        saliency ``[B, H, W]`` in 0..1; classes ``[B, C]`` log-probabilities (or logits);
        embedding ``[B, D]``.
    """
    kind = lm.output_kind
    if kind == "saliency":
        ph, pw = lm.patch_size
        grid = (input_hw[0] // ph, input_hw[1] // pw)
        assert lm.decoder is not None
        return lm.decoder(feats[:, len(lm.prefix) :], grid, input_hw).float()  # B, H, W
    out = timm_model(lm).forward_head(feats).float()  # B, C (logits) or B, D (pooled embedding)
    return torch.log_softmax(out, dim=-1) if kind == "classes" and not logits else out


def change(kind: str, base: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """The output change of each ablated output against the unablated one: ``[B]``.

    Args:
        kind: output kind.
        base: ``[1, ...]`` the unablated output.
        out: ``[B, ...]`` ablated outputs.
    """
    if kind == "saliency":
        return (out - base).abs().flatten(1).mean(1)
    if kind == "classes":
        top = int(base[0].argmax())
        return base[:, top] - out[:, top]
    return (out - base).norm(dim=-1) / base.norm(dim=-1).clamp_min(1e-12)


def kl_divergence(base: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """KL(p_base || p_out) in nats from log-probabilities ``[1, C]`` and ``[B, C]``: ``[B]``."""
    return (base.exp() * (base - out)).sum(-1)


@lru_cache(maxsize=8)
def _imagenet_info(subset: str):
    from timm.data import ImageNetInfo

    return ImageNetInfo(subset)


def class_names(model: torch.nn.Module) -> tuple[list[str], list[str]] | None:
    """``(labels, descriptions)`` for an ImageNet classifier (by its class count), else None.

    ``labels`` are the first name of each class (``goldfish``), ``descriptions`` timm's full text.
    """
    from timm.data import infer_imagenet_subset

    subset = infer_imagenet_subset(model)
    if subset is None:
        return None
    info = _imagenet_info(subset)
    desc = [info.index_to_description(i) for i in range(info.num_classes())]
    return [d.split(",")[0].strip() for d in desc], desc


def _class(i: int, logp: torch.Tensor, names) -> dict[str, Any]:
    return {
        "index": i,
        "label": names[0][i] if names else f"class {i}",
        "description": names[1][i] if names else None,
        "probability": float(logp[i].exp()),
    }


def describe(lm: LoadedModel, out: torch.Tensor, top: int = 5) -> Any:
    """One image's output as JSON-ready values (``output`` of the answer).

    Args:
        out: one image's output, on the host: saliency ``[H, W]``, classes ``[C]`` log-probabilities,
            embedding ``[D]``.
    """
    kind = lm.output_kind
    if kind == "saliency":
        return out.numpy()
    if kind == "classes":
        names = class_names(lm.model)
        probs = out.exp()
        k = min(top, out.numel())
        return {
            "top5": [_class(int(i), out, names) for i in probs.topk(k).indices],
            "probabilities": probs.numpy(),
        }
    return {"norm": float(out.norm()), "dim": out.numel(), "embedding": out.numpy()}


def describe_change(lm: LoadedModel, base: torch.Tensor, out: torch.Tensor) -> dict[str, Any]:
    """How an ablated output differs from the unablated one (``change`` of the answer)."""
    kind = lm.output_kind
    primary = float(change(kind, base[None], out[None])[0])
    if kind == "saliency":
        diff = (out - base).abs()
        return {"metric": METRICS[kind], "mean_abs_diff": primary, "max_abs_diff": float(diff.max())}
    if kind == "classes":
        names = class_names(lm.model)
        before, after = int(base.argmax()), int(out.argmax())
        return {
            "metric": METRICS[kind],
            "top1_logprob_drop": primary,
            "kl": float(kl_divergence(base[None], out[None])[0]),
            "top1_before": _class(before, base, names),
            "top1_after": _class(after, out, names),
            "top1_before_probability_after": float(out[before].exp()),
            "top1_changed": before != after,
        }
    return {
        "metric": METRICS[kind],
        "relative_l2": primary,
        "norm_before": float(base.norm()),
        "norm_after": float(out.norm()),
    }
