"""The benchmark's fp32 ceiling times exactly the model's matrix products."""

import timm
import torch

from bench.ceiling import MatmulsOnly


def test_matmuls_only_counts_every_product_of_the_forward():
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=0).eval()
    D, L, H, p = 192, 12, 3, 16
    P = (224 // p) ** 2
    N = 1 + P
    d = D // H
    # patch embedding + per block: qkv, proj, fc1 (4D), fc2, and q k^T plus attn v in every head
    per_block = N * D * 3 * D + N * D * D + N * D * 4 * D + N * 4 * D * D + 2 * H * N * N * d
    want = 2 * (P * 3 * p * p * D + L * per_block)
    mm = MatmulsOnly(model, N)
    assert mm.flops_per_image() == want
    mm(torch.zeros(2, 3, 224, 224))  # runs at another batch size, with the products' shapes
    assert mm.flops_per_image() == want
