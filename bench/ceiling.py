"""The machine's ceiling for an exact fp32 forward: the model's matrix products and nothing else.

Every exact forward of the model, fused or not, hooked or not, has to do these products: the
patch embedding, each block's linear layers, and ``q k^T`` and ``attn v`` in every head. Timing
them alone (same shapes, same weights, same BLAS, no layer norm, GELU, softmax, bias or residual)
gives an optimistic bound on how fast any fp32 forward can run on this machine. Its paired ratio
to the bare forward says how much room is left; its ratio to a peer's says how far ahead of that
peer an exact fp32 capture could possibly be.
"""

from __future__ import annotations

import torch
import torch.nn as nn


class MatmulsOnly:
    """``fn(x)``: the model's matrix products for a batch shaped like ``x``, on random inputs.

    Args:
        model: a timm ViT (``patch_embed.proj`` convolution, ``blocks[i].attn`` with
            ``num_heads``, and ``nn.Linear`` layers inside the blocks).
        num_tokens: tokens per image (prefix + patches) for the input size benchmarked.
    """

    def __init__(self, model: nn.Module, num_tokens: int):
        self.model = model
        self.N = num_tokens
        self._plans: dict[int, list] = {}

    def flops_per_image(self) -> float:
        """Multiply-adds x 2 of one image's products."""
        ((B, plan),) = self._plans.items() if self._plans else ((1, self._plan(1)),)
        return sum(2 * a.numel() * b.shape[-1] for a, b, _ in plan) / B

    def _plan(self, B: int) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """``(a, b, out)`` triples with preallocated operands: ``out = a @ b`` (batched if 3-d)."""
        if B in self._plans:
            return self._plans[B]
        m = self.model
        dev = next(m.parameters()).device
        g = torch.Generator(device="cpu").manual_seed(0)

        def rand(*shape):
            return torch.randn(*shape, generator=g).to(dev)

        N = self.N
        plan = []
        attn_bufs: dict[tuple, tuple] = {}  # shared by the blocks: only the shapes matter
        conv = m.patch_embed.proj  # D, 3, p, p
        D, cin, ph, pw = conv.weight.shape
        P = N - getattr(m, "num_prefix_tokens", 1)
        w = conv.weight.detach().reshape(D, cin * ph * pw)
        plan.append((rand(B * P, cin * ph * pw), w.t(), torch.empty(B * P, D, device=dev)))
        for blk in m.blocks:
            for lin in (mod for mod in blk.modules() if isinstance(mod, nn.Linear)):
                w = lin.weight.detach()  # out, in
                plan.append((rand(B * N, w.shape[1]), w.t(), torch.empty(B * N, w.shape[0], device=dev)))
            H = blk.attn.num_heads
            d = blk.attn.head_dim if hasattr(blk.attn, "head_dim") else D // H
            if (H, d) not in attn_bufs:
                attn_bufs[H, d] = (
                    rand(B * H, N, d),
                    rand(B * H, d, N),
                    rand(B * H, N, d),
                    torch.empty(B * H, N, N, device=dev),
                )
            q, kT, v, probs = attn_bufs[H, d]
            plan.append((q, kT, probs))  # B*H, N, N
            plan.append((probs, v, torch.empty(B * H, N, d, device=dev)))  # B*H, N, d
        self._plans = {B: plan}  # one batch size at a time: the buffers are large at B=8
        return plan

    def __call__(self, x: torch.Tensor) -> None:
        with torch.inference_mode():
            for a, b, out in self._plan(x.shape[0]):
                if a.dim() == 3:
                    torch.bmm(a, b, out=out)
                else:
                    torch.mm(a, b, out=out)
