"""Each statistic pinned on hand-made attention with known answers."""

from __future__ import annotations

import math

import pytest
import torch

from app.engine.layout import TokenLayout
from app.engine.stats import (
    artifact_tokens,
    cosine_similarity,
    js_similarity,
    mass_threshold_count,
    mass_threshold_mask,
    mean_attention_distance,
    normalized_entropy,
    ranks,
)

LAYOUT = TokenLayout(["cls"], (3, 3), (16, 16))  # N = 10


def test_entropy_uniform_is_one_and_one_hot_is_zero():
    n = 10
    assert normalized_entropy(torch.full((n,), 1 / n)).item() == pytest.approx(1.0, abs=1e-6)
    assert normalized_entropy(torch.eye(n)[3]).item() == pytest.approx(0.0, abs=1e-6)
    half = torch.tensor([0.5, 0.5, 0, 0])
    assert normalized_entropy(half).item() == pytest.approx(math.log(2) / math.log(4), abs=1e-6)


def test_distance_of_a_diagonal_map_is_zero_and_neighbours_are_one_patch():
    eye = torch.eye(10)
    assert mean_attention_distance(eye, LAYOUT).item() == pytest.approx(0.0, abs=1e-6)
    # Every patch attends only to the patch on its right (wrapping rows to the left neighbour).
    a = torch.zeros(10, 10)
    for p in range(9):
        r, c = divmod(p, 3)
        a[1 + p, 1 + r * 3 + (c + 1 if c < 2 else c - 1)] = 1
    assert mean_attention_distance(a, LAYOUT).item() == pytest.approx(16.0, abs=1e-5)
    # Attention to the CLS token has no position: rows are renormalised over patches.
    b = eye.clone()
    b[1:, 0] = 1
    b = b / b.sum(-1, keepdim=True)
    assert mean_attention_distance(b, LAYOUT).item() == pytest.approx(0.0, abs=1e-6)


def test_identical_heads_have_similarity_one_and_disjoint_zero():
    rows = torch.softmax(torch.randn(1, 5, 10), -1)
    sim = js_similarity(torch.cat([rows, rows]))
    assert torch.allclose(sim, torch.ones(2, 2), atol=1e-6)
    disjoint = torch.stack([torch.eye(10)[:5], torch.eye(10)[5:]])
    assert js_similarity(disjoint)[0, 1].item() == pytest.approx(0.0, abs=1e-6)
    assert cosine_similarity(torch.stack([rows[0, 0], rows[0, 0]]))[0, 1].item() == pytest.approx(1.0, abs=1e-6)


def test_duplicated_heads_lose_rank():
    torch.manual_seed(0)
    a = torch.randn(50, 8)
    full_num, full_eff = ranks(torch.cat([a, torch.randn(50, 8)], 1))
    dup_num, dup_eff = ranks(torch.cat([a, a], 1))  # head 2 copies head 1
    assert full_num == 16 and dup_num == 8
    assert dup_eff < full_eff
    assert ranks(torch.ones(5, 4))[1] == pytest.approx(1.0, abs=1e-6)  # rank one: effective rank 1


def test_mass_threshold():
    row = torch.tensor([0.5, 0.3, 0.1, 0.1])
    assert mass_threshold_count(row, 0.5).item() == 1
    assert mass_threshold_count(row, 0.6).item() == 2
    assert mass_threshold_count(row, 0.8).item() == 2
    assert mass_threshold_count(row, 0.9).item() == 3
    assert mass_threshold_mask(row, 0.6).tolist() == [True, True, False, False]
    assert mass_threshold_count(torch.full((8,), 1 / 8), 0.5).item() == 4


def test_artifact_tokens_are_norm_outliers():
    norms = torch.cat([torch.tensor([100.0]), torch.full((20,), 10.0) + torch.linspace(0, 1, 20)])
    norms[7] = 80.0
    idx, thr = artifact_tokens(norms, num_prefix=1)
    assert idx == [7] and 10 < thr < 80  # the CLS token (index 0) is not a patch: never flagged
