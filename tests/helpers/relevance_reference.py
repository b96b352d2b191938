"""An independent, differentiable forward of each ViT family, and the relevance maps and
perturbation curves of issue #27 computed from it the plain way, for the exactness tests.

Nothing here runs timm's forward or Headscope's capture: the patch embedding, every block
(attention with RoPE or a relative position bias, LayerScale, GELU or SwiGLU MLPs), the final
norm and the heads (CLS token, distillation token, mean pooling, SigLIP's attention pool) are
written out from the modules' weights with ``torch.nn.functional``, with ``einsum`` where timm
uses ``@``. Only position tables are read as the model holds them (EVA's RoPE sin/cos table from
``model.rope.get_embed``, BEiT's relative position index). The maps follow the issue's
definitions literally (``R = R + cam_l @ R`` as N x N products, the rollout as a product of
row-normalised matrices), the curves zero patches with a loop over patch slices.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from headscope.zoo import loaders
from headscope.zoo.ids import ModelSpec

TINY = dict(embed_dim=64, num_heads=4)

# name, timm architecture, create kwargs, classes (0: an embedding model), input (H, W)
FAMILIES = [
    ("vit", "vit_small_patch16_224", dict(TINY, depth=3, img_size=64), 10, (64, 64)),
    ("deit_distilled", "deit_tiny_distilled_patch16_224", dict(TINY, depth=2, img_size=64), 10, (64, 64)),
    ("dinov2", "vit_small_patch14_dinov2", dict(TINY, depth=3, img_size=56), 0, (56, 56)),
    ("dinov2_reg", "vit_small_patch14_reg4_dinov2", dict(TINY, depth=2, img_size=56), 10, (56, 56)),
    ("flexivit", "flexivit_small", dict(TINY, depth=2, img_size=64), 10, (64, 64)),
    ("siglip", "vit_base_patch16_siglip_224", dict(TINY, depth=2, img_size=64), 0, (64, 64)),
    ("eva02", "eva02_tiny_patch14_224", dict(TINY, depth=2, img_size=56), 10, (56, 56)),
    ("beit", "beit_base_patch16_224", dict(TINY, depth=2, img_size=64), 10, (64, 64)),
]


QKV_GAIN, HEAD_GAIN = 3.0, 100.0


def load_family(arch: str, kwargs: dict, classes: int):
    """A LoadedModel of random weights where every parameter matters (LayerScale, biases and
    bias tables start at or near 0), with a classifier head of ``classes`` classes."""
    lm = loaders.load_random(ModelSpec.parse(f"random:{arch}"), **kwargs)
    model = lm.model
    torch.manual_seed(1)
    if classes:
        model.reset_classifier(classes)  # type: ignore[operator]
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "relative_position_bias_table" in n:
                p.add_(torch.randn_like(p))
            elif "gamma" in n or "lambda" in n:  # LayerScale: about 1, not 1e-5
                p.copy_(1 + torch.randn_like(p) * 0.2)
            elif p.ndim == 1 and "bias" in n:
                p.add_(torch.randn_like(p) * 0.2)
            elif p.ndim == 1 and "norm" in n:
                # LayerNorm gains far from uniform: with gains of 1 an embedding target
                # <LN(t), e0> is blind to every change of t (LN removes the radial direction)
                p.copy_(1 + torch.randn_like(p))
            elif n.endswith("attn.proj.weight") or n.endswith("qkv.weight"):
                p.mul_(QKV_GAIN)  # sharp maps whose heads carry the output
            elif n.startswith("head"):
                p.mul_(HEAD_GAIN)  # logits of tens of units: the gradient terms of R weigh
    model.eval().requires_grad_(False)
    return lm


def load_vit():
    """FAMILIES' plain ViT (vit_small, 3 blocks, 4 heads, qkv x3, 10 classes) by
    :func:`load_family`, and its input size ``(H, W)``."""
    _, arch, kwargs, classes, hw = next(f for f in FAMILIES if f[0] == "vit")
    return load_family(arch, kwargs, classes), hw


def layer_norm(mod: nn.Module, x: torch.Tensor) -> torch.Tensor:
    if isinstance(mod, nn.Identity):
        return x
    assert isinstance(mod, nn.LayerNorm), type(mod)
    return F.layer_norm(x, mod.normalized_shape, mod.weight, mod.bias, mod.eps)


def _identity(*mods) -> None:
    for m in mods:
        assert m is None or isinstance(m, nn.Identity), f"the reference does not model {type(m).__name__}"


def embed(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Patch embedding, prefix tokens and absolute positions: the tokens entering block 0."""
    pe = model.patch_embed
    _identity(getattr(pe, "norm", None), getattr(model, "norm_pre", None))
    w = pe.proj.weight
    t = F.conv2d(x, w, pe.proj.bias, stride=tuple(w.shape[-2:]))  # B, D, gh, gw
    t = t.flatten(2).transpose(1, 2)  # B, P, D
    B = t.shape[0]
    prefix = [
        tok.expand(B, -1, -1)
        for tok in (
            getattr(model, "cls_token", None),
            getattr(model, "dist_token", None),
            getattr(model, "reg_token", None),
        )
        if tok is not None
    ]
    pos = getattr(model, "pos_embed", None)
    if getattr(model, "no_embed_class", False):
        t = torch.cat([*prefix, t + pos], 1) if pos is not None else torch.cat([*prefix, t], 1)
    else:
        t = torch.cat([*prefix, t], 1)
        if pos is not None:
            assert pos.shape[1] == t.shape[1], "the reference runs at the model's own grid"
            t = t + pos
    return t


def _rotate(x: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
    """RoPE, interleaved pairs: (x0, x1) -> (x0 cos - x1 sin, x1 cos + x0 sin)."""
    sin, cos = emb.chunk(2, -1)
    x0, x1 = x[..., 0::2], x[..., 1::2]
    rot = torch.stack([-x1, x0], -1).flatten(-2)
    return x * cos + rot * sin


def _qkv(a: nn.Module, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    bias = a.qkv.bias
    if getattr(a, "q_bias", None) is not None:  # EVA, BEiT: no key bias
        bias = torch.cat([a.q_bias, torch.zeros_like(a.q_bias), a.v_bias])
    qkv = F.linear(h, a.qkv.weight, bias)
    B, N, _ = qkv.shape
    H = a.num_heads
    q, k, v = qkv.view(B, N, 3, H, -1).unbind(2)  # B, N, H, d each
    return q, k, v


def block(model: nn.Module, blk: nn.Module, x: torch.Tensor, maps: list[torch.Tensor], rope=None) -> torch.Tensor:
    """One block, written out; appends its softmax maps ``[B, H, N, N]`` to ``maps``."""
    a = blk.attn
    _identity(getattr(a, "q_norm", None), getattr(a, "k_norm", None), getattr(a, "norm", None))
    assert getattr(a, "gate", None) is None
    h = layer_norm(blk.norm1, x)
    q, k, v = _qkv(a, h)
    d = q.shape[-1]
    assert math.isclose(float(a.scale), d**-0.5, rel_tol=1e-6)
    if rope is not None:  # EVA: on patch tokens only
        n = a.num_prefix_tokens
        q = torch.cat([q[:, :n], _rotate(q[:, n:].transpose(1, 2), rope).transpose(1, 2)], 1)
        k = torch.cat([k[:, :n], _rotate(k[:, n:].transpose(1, 2), rope).transpose(1, 2)], 1)
    scores = torch.einsum("bnhd,bmhd->bhnm", q, k) / math.sqrt(d)
    table = getattr(a, "relative_position_bias_table", None)
    if table is not None:  # BEiT
        N = scores.shape[-1]
        scores = scores + table[a.relative_position_index.reshape(-1)].reshape(N, N, -1).permute(2, 0, 1)
    A = scores.softmax(-1)
    maps.append(A)
    o = torch.einsum("bhnm,bmhd->bnhd", A, v).flatten(2)  # B, N, H * d
    o = F.linear(o, a.proj.weight, a.proj.bias)
    o = _scale(blk, o, "ls1", "gamma_1")
    x = x + o
    h = layer_norm(blk.norm2, x)
    mlp = blk.mlp
    _identity(getattr(mlp, "norm", None))
    u = F.linear(h, mlp.fc1.weight, mlp.fc1.bias)
    if type(mlp).__name__ == "GluMlp":
        assert not mlp.gate_last
        u1, u2 = u.chunk(2, -1)
        u = F.silu(u1) * u2
    else:
        assert isinstance(mlp.act, nn.GELU) and mlp.act.approximate == "none"
        u = F.gelu(u)
    m = F.linear(u, mlp.fc2.weight, mlp.fc2.bias)
    return x + _scale(blk, m, "ls2", "gamma_2")


def _scale(blk: nn.Module, x: torch.Tensor, ls: str, gamma: str) -> torch.Tensor:
    mod = getattr(blk, ls, None)
    if mod is not None and not isinstance(mod, nn.Identity):
        return x * mod.gamma
    g = getattr(blk, gamma, None)
    return x * g if g is not None else x


def _attention_pool(p: nn.Module, z: torch.Tensor) -> torch.Tensor:
    """SigLIP's attention pool (a latent query attends to every token, then an MLP), written out."""
    _identity(p.q_norm, p.k_norm)
    assert p.pos_embed is None and p.pool == "token"
    B, N, D = z.shape
    H = p.num_heads
    q = F.linear(p.latent.expand(B, -1, -1), p.q.weight, p.q.bias).view(B, -1, H, D // H)  # B, Lq, H, d
    k, v = F.linear(z, p.kv.weight, p.kv.bias).view(B, N, 2, H, D // H).unbind(2)
    A = torch.einsum("blhd,bnhd->bhln", q, k).div(math.sqrt(D // H)).softmax(-1)
    o = torch.einsum("bhln,bnhd->blhd", A, v).flatten(2)
    o = F.linear(o, p.proj.weight, p.proj.bias)
    h = layer_norm(p.norm, o)
    o = o + F.linear(F.gelu(F.linear(h, p.mlp.fc1.weight, p.mlp.fc1.bias)), p.mlp.fc2.weight, p.mlp.fc2.bias)
    return o[:, 0]


def head(model: nn.Module, z: torch.Tensor) -> torch.Tensor:
    """Logits ``[B, C]`` or the pooled embedding ``[B, D]`` from the final tokens."""
    if getattr(model, "dist_token", None) is not None:  # DeiT distilled: the mean of two heads
        a = F.linear(z[:, 0], model.head.weight, model.head.bias)
        b = F.linear(z[:, 1], model.head_dist.weight, model.head_dist.bias)
        return (a + b) / 2
    pool = model.global_pool
    if getattr(model, "attn_pool", None) is not None:
        e = _attention_pool(model.attn_pool, z)
    elif pool == "token":
        e = z[:, 0]
    elif pool == "avg":
        e = z[:, model.num_prefix_tokens :].mean(1)
    else:
        raise AssertionError(f"pool {pool!r}")
    e = layer_norm(model.fc_norm, e)
    if isinstance(model.head, nn.Identity):
        return e
    return F.linear(e, model.head.weight, model.head.bias)


def forward(model: nn.Module, x: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
    """``(maps, z, out)``: every block's softmax maps, the final normed tokens, the output."""
    assert getattr(model, "rel_pos_bias", None) is None  # BEiT's shared bias: not modelled
    t = embed(model, x)
    rope = None
    if getattr(model, "rope", None) is not None:
        gh, gw = x.shape[-2] // model.patch_embed.patch_size[0], x.shape[-1] // model.patch_embed.patch_size[1]
        rope = model.rope.get_embed(shape=(gh, gw))  # the model's own sin/cos table
    maps: list[torch.Tensor] = []
    for blk in model.blocks:
        t = block(model, blk, t, maps, rope)
    z = layer_norm(model.norm, t)
    return maps, z, head(model, z)


def normalise(v: torch.Tensor, prefix: int) -> torch.Tensor:
    p = v[prefix:]
    return p / p.sum()


def rollout_rows(maps: list[torch.Tensor], b: int) -> torch.Tensor:
    """Abnar & Zuidema's rollout of image ``b``, heads fused by the mean: ``[N, N]``."""
    N = maps[0].shape[-1]
    eye = torch.eye(N, dtype=maps[0].dtype)
    R = eye
    for A in maps:
        a = 0.5 * A[b].mean(0) + 0.5 * eye
        R = (a / a.sum(-1, keepdim=True)) @ R
    return R


def relevance_maps(
    maps: list[torch.Tensor],
    grads: list[torch.Tensor],
    z: torch.Tensor,
    gz: torch.Tensor,
    b: int,
    prefix: int,
    cls: int | None,
) -> dict[str, torch.Tensor]:
    """The issue's maps of image ``b`` over patch tokens, each summing to 1: ``{method: [P]}``."""
    cams = [(g[b] * A[b]).clamp(min=0).mean(0) for A, g in zip(maps, grads)]  # N, N each
    w = (z[b] * gz[b]).sum(-1).abs()  # N
    N = w.shape[0]
    R = torch.eye(N, dtype=w.dtype)
    for cam in cams:
        R = R + cam @ R
    last = maps[-1][b].mean(0)  # N, N
    roll = rollout_rows(maps, b)
    return {
        "chefer": normalise(w @ R, prefix),
        "grad_attention": normalise(w @ cams[-1], prefix),
        "attention": normalise(last[cls] if cls is not None else last.mean(0), prefix),
        "rollout": normalise(roll[cls] if cls is not None else roll.mean(0), prefix),
    }


def differentiate(
    run: Callable[[torch.Tensor], tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]],
    x: torch.Tensor,
    target: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
):
    """``(maps, grads, z, gz, out, y)`` of one forward and one backward of ``run``."""
    x = x.clone().requires_grad_(True)
    with torch.enable_grad():
        maps, z, out = run(x)
        y = target(out, out.detach())
        *grads, gz = torch.autograd.grad(y.sum(), [*maps, z])
    return [m.detach() for m in maps], grads, z.detach(), gz, out.detach(), y.detach()


def zero_patches(x: torch.Tensor, patches: list[int], grid: tuple[int, int], patch: tuple[int, int]) -> torch.Tensor:
    """A copy of one picture ``[3, H, W]`` with the listed patches set to 0, slice by slice."""
    out = x.clone()
    for p in patches:
        r, c = divmod(p, grid[1])
        out[:, r * patch[0] : (r + 1) * patch[0], c * patch[1] : (c + 1) * patch[1]] = 0
    return out


def curves(
    run_output: Callable[[torch.Tensor], torch.Tensor],
    x: torch.Tensor,
    relevance: torch.Tensor,
    target: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    fractions: list[float],
    grid: tuple[int, int],
    patch: tuple[int, int],
    score: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
) -> dict[str, list[float]]:
    """Positive and negative perturbation curves of one picture, one forward per point.

    The orders are written with Python's ``sorted`` on ``(value, index)`` keys: ties take the
    lower patch index first in both directions. ``score``: what the curve divides (default: the
    target itself; for a class, :func:`probability_of` it).
    """
    target = score or target
    P = relevance.numel()
    vals = relevance.flatten().tolist()
    orders = {
        "positive": sorted(range(P), key=lambda i: (-vals[i], i)),
        "negative": sorted(range(P), key=lambda i: (vals[i], i)),
    }
    with torch.no_grad():
        ref = run_output(x[None])
        y0 = float(target(ref, ref)[0])
        out: dict[str, list[float]] = {}
        for direction, order in orders.items():
            ys = []
            for f in fractions:
                k = int(math.floor(f * P + 1e-9))
                if k == 0:
                    ys.append(1.0)
                    continue
                xp = zero_patches(x, order[:k], grid, patch)
                ys.append(float(target(run_output(xp[None]), ref)[0]) / y0)
            out[direction] = ys
    return out


def trapezoid(fractions: list[float], ys: list[float]) -> float:
    xs, vs = ([0.0] + fractions, [1.0] + ys) if fractions[0] != 0 else (fractions, ys)
    return sum((xs[i + 1] - xs[i]) * (vs[i] + vs[i + 1]) / 2 for i in range(len(xs) - 1))


# -- targets, written out ------------------------------------------------------------------
def mean_of_map(out: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    return out.reshape(out.shape[0], -1).mean(1)


def box_mean(x0: int, y0: int, x1: int, y1: int):
    def f(out: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
        return out[:, y0:y1, x0:x1].reshape(out.shape[0], -1).mean(1)

    return f


def top_logit(out: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    idx = ref.argmax(-1)
    if idx.numel() == 1:
        idx = idx.expand(out.shape[0])
    return out[torch.arange(out.shape[0]), idx]


def class_logit(n: int):
    return lambda out, ref: out[:, n]


def embedding_ratio(out: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    e0 = ref.expand_as(out)
    return (out * e0).sum(-1) / (e0 * e0).sum(-1)


def probability_of(class_of: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | int):
    """The softmax probability of a class: ``class_of`` an index, or ``top_logit`` (the
    unperturbed top class) written out with ``exp`` over the logits."""

    def f(out: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
        n = out.shape[0]
        idx = torch.full((n,), class_of) if isinstance(class_of, int) else ref.argmax(-1).expand(n)
        e = torch.exp(out.double() - out.double().max(-1, keepdim=True).values)
        return e[torch.arange(out.shape[0]), idx] / e.sum(-1)  # float64: small probabilities stay > 0

    return f
