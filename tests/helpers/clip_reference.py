"""Independent references for the phrase relevance tests, written on open_clip's own modules
(not Headscope's timm copy of the image tower, not its text forward):

* :func:`interpret`: Chefer et al.'s ``interpret`` of ``CLIP_explainability.ipynb``
  (Transformer-MM-Explainability): ``y = logits_per_image[i, i]`` (``exp(logit_scale)`` times the
  cosine), ``R = I; R += mean_h max(0, dy/dA * A) @ R`` from ``start_layer`` on, the image map is
  ``R[0, 1:]``; the text's ``R_text`` the same over the text blocks, read at the end-of-text row.
* :func:`legrad`: LeGrad's ``compute_legrad_clip`` (WalBouss/LeGrad, ``layer_index=-2``): for each
  of the last two blocks, ``ln_post(mean over tokens) @ proj`` normalised, its dot product with
  the normalised text embedding, the gradient on that block's attention map clamped at 0,
  averaged over heads and query rows, the CLS column dropped, summed, min-max normalised.

Attention maps come from each block's ``attention`` replaced by the same computation written out
as the original CLIP code's ``[N, B*H, d]`` layout with ``bmm`` (checked against PyTorch's own
``nn.MultiheadAttention`` in tests/unit/zoo): the maps in the autograd graph.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _patched(blocks, store: list):
    """Replace each open_clip block's ``attention`` with one written out in the sequence-first
    layout of the original CLIP code (``[N, B*H, d]`` heads, ``bmm``), keeping its softmax
    ``[B*H, N, N]`` (the tensor the output is computed from, so that it is in the graph)."""

    def make(blk):
        a = blk.attn

        def attention(q_x, k_x=None, v_x=None, attn_mask=None):
            x = q_x.transpose(0, 1)  # N, B, D
            N, B, D = x.shape
            H = a.num_heads
            q, k, v = F.linear(x, a.in_proj_weight, a.in_proj_bias).chunk(3, dim=-1)
            q, k, v = (t.contiguous().view(N, B * H, D // H).transpose(0, 1) for t in (q, k, v))
            w = torch.bmm(q * (D // H) ** -0.5, k.transpose(-1, -2))  # B*H, N, N
            if attn_mask is not None:
                w = w + attn_mask.to(w.dtype)
            w = w.softmax(dim=-1)
            store.append(w)
            out = torch.bmm(w, v).transpose(0, 1).reshape(N, B, D)
            return a.out_proj(out).transpose(0, 1)

        return attention

    for blk in blocks:
        blk.attention = make(blk)


def _unpatch(blocks):
    for blk in blocks:
        del blk.attention


def interpret(model, image: torch.Tensor, text: torch.Tensor, start_layer: int = -1, start_layer_text: int = -1):
    """``(text_relevance [T, T] rows, image_relevance [P])`` for one image and one tokenized phrase.

    Args:
        model: an open_clip CLIP model (its parameters are made to require grad, as in the notebook).
        image: ``[1, 3, H, W]``; text: ``[1, T]`` token ids.
        start_layer, start_layer_text: the notebook's parameters (-1: the last layer only).
    """
    model.requires_grad_(True)
    vis = list(model.visual.transformer.resblocks)
    txt = list(model.transformer.resblocks)
    a_img: list = []
    a_txt: list = []
    _patched(vis, a_img)
    _patched(txt, a_txt)
    try:
        img = F.normalize(model.encode_image(image), dim=-1)
        tx = F.normalize(model.encode_text(text), dim=-1)
        logits_per_image = model.logit_scale.exp() * img @ tx.T
        one_hot = logits_per_image[0, 0]
        # The notebook asks autograd for one layer's gradient at a time; one call for every
        # layer gives the same gradients with one backward instead of one per layer.
        grads = torch.autograd.grad(one_hot, [*a_img, *a_txt])
        out = []
        for attn, g_all, start in (
            (a_img, grads[: len(a_img)], start_layer),
            (a_txt, grads[len(a_img) :], start_layer_text),
        ):
            start = len(attn) - 1 if start == -1 else start
            N = attn[0].shape[-1]
            R = torch.eye(N)
            for i, (blk_attn, grad) in enumerate(zip(attn, g_all)):
                if i < start:
                    continue
                cam = (grad.detach() * blk_attn.detach()).clamp(min=0).mean(0)  # heads of the one image: N, N
                R = R + cam @ R
            out.append(R)
    finally:
        _unpatch(vis)
        _unpatch(txt)
        model.requires_grad_(False)
    R_img, R_text = out
    return R_text, R_img[0, 1:]


def legrad(model, image: torch.Tensor, text: torch.Tensor, layer_index: int = -2) -> torch.Tensor:
    """LeGrad's patch map ``[P]`` (min-max normalised) for one image and one tokenized phrase."""
    vis = list(model.visual.transformer.resblocks)
    start = len(vis) + layer_index if layer_index < 0 else layer_index
    attn: list = []
    feats: list = []
    _patched(vis, attn)
    hooks = [b.register_forward_hook(lambda m, a, o: feats.append(o)) for b in vis[start:]]
    try:
        with torch.no_grad():
            t = F.normalize(model.encode_text(text), dim=-1)
        x = image.clone().requires_grad_(True)
        model.encode_image(x)
    finally:
        for h in hooks:
            h.remove()
        _unpatch(vis)
    acc = 0
    for i, f in enumerate(feats):
        e = F.normalize(model.visual.ln_post(f.mean(dim=1)) @ model.visual.proj, dim=-1)
        sim = (t @ e.T).sum()
        g = torch.autograd.grad(sim, [attn[start + i]], retain_graph=True)[0].clamp(min=0)  # H, N, N (one image)
        acc = acc + g.mean(dim=0).mean(dim=0)[1:]
    return (acc - acc.min()) / (acc.max() - acc.min())
