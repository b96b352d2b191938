"""Head fusion and rollout against direct computations on the full maps."""

from __future__ import annotations

import pytest
import torch

from headscope.engine.analysis import attention_tensor
from headscope.engine.block_capture import AttentionCapture
from headscope.engine.selection import Selection, SelectionError
from helpers.models import make


@pytest.fixture(scope="module")
def att():
    model = make("vit_small_patch16_224", dict(depth=4, embed_dim=64, num_heads=4, img_size=64))
    cap = AttentionCapture(model)
    with torch.no_grad(), cap.capturing():
        model.forward_features(torch.randn(1, 3, 64, 64))
    return cap.results()[0]


def full(att):
    return torch.stack([att.rows(layer) for layer in range(att.num_layers)])  # L, H, N, N


def test_slices(att):
    out = attention_tensor(att, Selection([3, 1], [2, 0], [0, 5]))
    torch.testing.assert_close(out, full(att)[[3, 1]][:, [2, 0]][:, :, [0, 5]])


def test_mean_and_max_over_selected_heads(att):
    f = full(att)
    mean = attention_tensor(att, Selection([0, 2], [1, 3], [0], "mean"))
    mx = attention_tensor(att, Selection([0, 2], [1, 3], [0], "max"))
    assert mean.shape == mx.shape == (2, 1, 1, att.num_tokens)
    torch.testing.assert_close(mean[:, 0], f[[0, 2]][:, [1, 3]][:, :, [0]].mean(1))
    torch.testing.assert_close(mx[:, 0], f[[0, 2]][:, [1, 3]][:, :, [0]].amax(1))


def test_rollout_is_abnar_zuidema(att):
    f = full(att)
    N = att.num_tokens
    R = torch.eye(N)
    want = []
    for layer in range(1, 4):
        A = 0.5 * f[layer].mean(0) + 0.5 * torch.eye(N)
        A = A / A.sum(-1, keepdim=True)
        R = A @ R
        want.append(R[[0]])
    out = attention_tensor(att, Selection([1, 2, 3], list(range(4)), [0], "rollout", rollout_start=1))
    assert out.shape == (3, 1, 1, N)
    torch.testing.assert_close(out[:, 0], torch.stack(want), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(out.sum(-1), torch.ones(3, 1, 1), atol=1e-5, rtol=0)


def test_rollout_fusion_and_discard(att):
    f = full(att)
    N = att.num_tokens
    A = f[0].amax(0)
    k = int(N * 0.5)
    A = A.scatter(-1, A.topk(k, -1, largest=False).indices, 0.0)
    A = 0.5 * A + 0.5 * torch.eye(N)
    A = A / A.sum(-1, keepdim=True)
    out = attention_tensor(att, Selection([0], [0, 1, 2, 3], None, "rollout", head_fusion="max", discard_ratio=0.5))
    torch.testing.assert_close(out[0, 0], A)


def test_rollout_layers_before_start_are_refused(att):
    with pytest.raises(SelectionError):
        attention_tensor(att, Selection([0], [0], [0], "rollout", rollout_start=2))
