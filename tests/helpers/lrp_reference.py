"""An independent LRP of a timm ViT, built as the CVPR 2021 authors build theirs, for the
``chefer2021`` exactness test.

Chefer, Gur & Wolf's ``ViT_LRP.py`` gives each layer a module with a ``relprop`` (their
``layers_ours.py``): a forward hook keeps the layer's input, and ``relprop(R)`` returns the
input's relevance. The rules as they define them: ``Linear``, alpha-beta with alpha 1 (positive
inputs through positive weights and negative through negative, bias left out); ``LayerNorm``,
``GELU``, ``Softmax``, ``Dropout``: relevance passes unchanged; ``einsum``: each operand's ``x *
grad`` for ``R / Z``; ``Add``: each side's ``x * R / Z`` rescaled so the sides share ``sum R``
as ``|sum|``; ``Clone``: ``x * sum_i R_i / x``; ``IndexSelect``: ``x * grad`` for ``R / Z``.
The attention's ``relprop`` halves the relevance of each product's operands and keeps the
relevance and the gradient of its softmax map; ``transformer_attribution`` rolls out
``mean_h max(0, grad * cam)`` plus the identity from ``start_layer`` and reads the CLS row.

Everything here is written from those definitions (module by module, the model rebuilt from a
timm ``vit_*`` state dict with LayerNorm eps 1e-6, as timm has it): no Headscope code runs.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


def safe_divide(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    den = b.clamp(min=1e-9) + b.clamp(max=1e-9)
    den = den + den.eq(0).type(den.type()) * 1e-9
    return a / den * b.ne(0).type(b.type())


def _keep_input(module, inputs, output):
    if isinstance(inputs[0], (list, tuple)):
        module.X = [t.detach().requires_grad_(True) for t in inputs[0]]
    else:
        module.X = inputs[0].detach().requires_grad_(True)


class RelProp(nn.Module):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.register_forward_hook(_keep_input)

    def relprop(self, R: torch.Tensor) -> torch.Tensor:
        return R


class RelPropSimple(RelProp):
    def relprop(self, R):
        Z = self.forward(self.X)
        S = safe_divide(R, Z)
        C = torch.autograd.grad(Z, self.X, S, retain_graph=True)
        if isinstance(self.X, list):
            return [x * c for x, c in zip(self.X, C)]
        return self.X * C[0]


class Identity(RelProp):  # Dropout (p = 0), GELU, Softmax, LayerNorm share this rule
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


class Linear(RelProp):
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.weight, self.bias = weight, bias

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)

    def relprop(self, R):
        pw, nw = self.weight.clamp(min=0), self.weight.clamp(max=0)
        px, nx = self.X.clamp(min=0).detach().requires_grad_(True), self.X.clamp(max=0).detach().requires_grad_(True)
        Z1, Z2 = F.linear(px, pw), F.linear(nx, nw)
        S = safe_divide(R, Z1 + Z2)
        C1 = px * torch.autograd.grad(Z1, px, S)[0]
        C2 = nx * torch.autograd.grad(Z2, nx, S)[0]
        return C1 + C2  # alpha 1, beta 0: the inhibitors weigh nothing


class Add(RelPropSimple):
    def forward(self, inputs):
        return inputs[0] + inputs[1]

    def relprop(self, R):
        a, b = super().relprop(R)
        a_sum, b_sum = a.sum(), b.sum()
        a_fact = safe_divide(a_sum.abs(), a_sum.abs() + b_sum.abs()) * R.sum()
        b_fact = safe_divide(b_sum.abs(), a_sum.abs() + b_sum.abs()) * R.sum()
        return [a * safe_divide(a_fact, a.sum()), b * safe_divide(b_fact, b.sum())]


class Einsum(RelPropSimple):
    def __init__(self, equation: str):
        super().__init__()
        self.equation = equation

    def forward(self, operands):
        return torch.einsum(self.equation, *operands)


class Clone(RelProp):
    def forward(self, x, num: int = 2):
        self.num = num
        return [x for _ in range(num)]

    def relprop(self, Rs):
        Z = [self.X for _ in range(self.num)]
        S = [safe_divide(r, z) for r, z in zip(Rs, Z)]
        C = torch.autograd.grad(Z, self.X, S)[0]
        return self.X * C


class IndexSelect(RelProp):
    def forward(self, x):
        return x[:, :1]

    def relprop(self, R):
        Z = self.forward(self.X)
        C = torch.autograd.grad(Z, self.X, safe_divide(R, Z))[0]
        return self.X * C


def _ln(p: nn.LayerNorm) -> Identity:
    return Identity(lambda x: F.layer_norm(x, p.normalized_shape, p.weight, p.bias, 1e-6))


class Attention(nn.Module):
    def __init__(self, a: nn.Module):
        super().__init__()
        self.h = a.num_heads
        self.scale = a.scale
        self.qkv = Linear(a.qkv.weight, a.qkv.bias)
        self.proj = Linear(a.proj.weight, a.proj.bias)
        self.matmul1 = Einsum("bhid,bhjd->bhij")
        self.matmul2 = Einsum("bhij,bhjd->bhid")
        self.softmax = Identity(lambda t: t.softmax(-1))

    def forward(self, x):
        B, N, C = x.shape  # batch, tokens, width
        q, k, v = self.qkv(x).reshape(B, N, 3, self.h, C // self.h).permute(2, 0, 3, 1, 4)
        attn = self.softmax(self.matmul1([q, k]) * self.scale)
        self.attn = attn
        attn.register_hook(lambda g: setattr(self, "attn_grad", g))
        out = self.matmul2([attn, v]).transpose(1, 2).reshape(B, N, C)
        return self.proj(out)

    def relprop(self, R):
        R = self.proj.relprop(R)
        B, N, C = R.shape
        R = R.reshape(B, N, self.h, C // self.h).transpose(1, 2)  # b h n d
        cam1, cam_v = self.matmul2.relprop(R)
        cam1, cam_v = cam1 / 2, cam_v / 2
        self.attn_cam = cam1
        cam1 = self.softmax.relprop(cam1)
        cam_q, cam_k = self.matmul1.relprop(cam1)
        cam_q, cam_k = cam_q / 2, cam_k / 2
        qkv = torch.stack([cam_q, cam_k, cam_v])  # 3, b, h, n, d
        return self.qkv.relprop(qkv.permute(1, 3, 0, 2, 4).reshape(B, N, 3 * C))


class Block(nn.Module):
    def __init__(self, blk: nn.Module):
        super().__init__()
        for name in ("ls1", "ls2"):
            assert isinstance(getattr(blk, name, nn.Identity()), nn.Identity), "no LayerScale in the authors' ViT"
        self.norm1, self.norm2 = _ln(blk.norm1), _ln(blk.norm2)
        self.attn = Attention(blk.attn)
        self.fc1 = Linear(blk.mlp.fc1.weight, blk.mlp.fc1.bias)
        self.act = Identity(F.gelu)
        self.fc2 = Linear(blk.mlp.fc2.weight, blk.mlp.fc2.bias)
        self.add1, self.add2, self.clone1, self.clone2 = Add(), Add(), Clone(), Clone()

    def forward(self, x):
        x1, x2 = self.clone1(x, 2)
        x = self.add1([x1, self.attn(self.norm1(x2))])
        x1, x2 = self.clone2(x, 2)
        return self.add2([x1, self.fc2(self.act(self.fc1(self.norm2(x2))))])

    def relprop(self, R):
        cam1, cam2 = self.add2.relprop(R)
        cam2 = self.norm2.relprop(self.fc1.relprop(self.act.relprop(self.fc2.relprop(cam2))))
        R = self.clone2.relprop((cam1, cam2))
        cam1, cam2 = self.add1.relprop(R)
        cam2 = self.norm1.relprop(self.attn.relprop(cam2))
        return self.clone1.relprop((cam1, cam2))


class VisionTransformer(nn.Module):
    """The authors' LRP ViT with a timm ``vit_*`` model's weights (CLS token, linear head)."""

    def __init__(self, timm_vit: nn.Module):
        super().__init__()
        m = timm_vit
        self.patch = m.patch_embed.proj
        self.cls_token, self.pos_embed = m.cls_token, m.pos_embed
        self.blocks = nn.ModuleList(Block(b) for b in m.blocks)
        self.norm = _ln(m.norm)
        self.pool = IndexSelect()
        self.head = Linear(m.head.weight, m.head.bias)

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], 1) + self.pos_embed
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.pool(self.norm(x))[:, 0])

    def relprop(self, R):
        R = self.pool.relprop(self.norm.relprop(self.head.relprop(R)[:, None]))
        for blk in reversed(self.blocks):
            R = blk.relprop(R)
        return R


def transformer_attribution(model: VisionTransformer, x: torch.Tensor, index: int | None = None, start_layer: int = 0):
    """``LRP.generate_LRP(x, index, method="transformer_attribution", start_layer)`` for one
    picture ``[1, 3, H, W]``: the CLS row of the rollout over patches, ``[P]``."""
    with torch.enable_grad():
        out = model(x.clone().requires_grad_(True))
        index = int(out.argmax(-1)) if index is None else index
        one_hot = torch.zeros_like(out)
        one_hot[0, index] = 1
        (one_hot * out).sum().backward(retain_graph=True)
        model.relprop(one_hot)
    cams = []
    for blk in model.blocks:
        grad, cam = blk.attn.attn_grad[0], blk.attn.attn_cam[0]
        cams.append((grad * cam).clamp(min=0).mean(0).detach())
    N = cams[0].shape[-1]
    joint = cams[start_layer] + torch.eye(N)
    for cam in cams[start_layer + 1 :]:
        joint = (cam + torch.eye(N)) @ joint
    return joint[0, 1:]
