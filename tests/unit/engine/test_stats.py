"""Each statistic pinned on hand-made attention with known answers."""

from __future__ import annotations

import math

import pytest
import torch

from headscope.engine.layout import TokenLayout
from headscope.engine.stats import (
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


# -- the vectorised statistics against a straightforward reference ----------------------------
# The reference is the per-layer, per-head-pair loop the engine used before it was vectorised:
# every map from ImageAttention.rows(), -sum p log p entropies, a JS loop over head pairs, and a
# float64 SVD per layer for the ranks.


def _ref_entropy(rows: torch.Tensor) -> torch.Tensor:
    n = rows.shape[-1]
    return -(rows * rows.clamp_min(1e-12).log()).sum(-1) / math.log(n)


def _ref_distance(A: torch.Tensor, layout: TokenLayout) -> torch.Tensor:
    npf = layout.num_prefix
    gh, gw = layout.grid
    ph, pw = layout.patch_size
    c = torch.tensor([[(r + 0.5) * ph, (q + 0.5) * pw] for r in range(gh) for q in range(gw)])
    dist = torch.cdist(c, c)
    a = A[:, npf:, npf:]
    return ((a * dist).sum(-1) / a.sum(-1).clamp_min(1e-12)).mean(-1)


def _ref_js(A: torch.Tensor) -> torch.Tensor:
    H = A.shape[0]
    out = torch.ones(H, H)
    logp = A.clamp_min(1e-12).log()
    for i in range(H):
        for j in range(i + 1, H):
            m = 0.5 * (A[i] + A[j])
            logm = m.clamp_min(1e-12).log()
            js = 0.5 * (A[i] * (logp[i] - logm)).sum(-1) + 0.5 * (A[j] * (logp[j] - logm)).sum(-1)
            out[i, j] = out[j, i] = 1 - (js.clamp_min(0) / math.log(2)).mean()
    return out


def _ref_ranks(x: torch.Tensor) -> tuple[int, float]:
    s = torch.linalg.svdvals(x.double())
    tol = max(x.shape) * torch.finfo(torch.float32).eps * s.max()
    p = s / s.sum()
    return int((s > tol).sum()), float(torch.exp(-(p * p.clamp_min(1e-12).log()).sum()))


def effective_rank_rtol(x: torch.Tensor) -> float:
    """How far two correct float64 computations of the effective rank of ``x`` may differ, relative.

    The app takes the singular values as square roots of the eigenvalues of the float64 Gram
    matrix (app/engine/stats.py, layers spread over threads in app/engine/gram.py); the reference
    takes an SVD. Neither is exact, and the threads' summation order moves the last digits, so
    the test allows what float64 can promise for this matrix and no more:

    * the Gram matrix of float32 entries, summed over ``k = max(M, D)`` products in float64: each
      entry within ``k eps |x_i| |x_j|``, so ``||dG||_2 <= k eps ||X||_F^2``; the symmetric
      eigensolver is backward stable, within ``n eps ||G||_2`` (``n = min(M, D)``); by Weyl every
      eigenvalue moves at most ``dlam = eps (k sum s^2 + n s_max^2)``;
    * a singular value ``s = sqrt(lam)`` then moves ``min(dlam / s, sqrt(dlam))``, and one under the
      app's noise floor (``k eps s_max^2``, set to 0) up to ``sqrt(floor + dlam)``; the reference
      SVD adds ``n eps s_max``;
    * the effective rank is ``exp(H)``, ``H = -sum p log p`` with ``p = s / sum s``: to first
      order ``|dH| <= sum (1 + |log p_i|) |ds_i| / S + (1 + H) sum |ds_i| / S``, ``p_i`` taken no
      smaller than ``|ds_i| / S`` (the modulus of continuity of ``p log p`` near 0), and
      ``|d exp(H)| / exp(H) = |dH|``.

    Well-conditioned head outputs get about 1e-9 (observed differences: 1e-13); matrices whose
    smallest singular values sit at float32 noise (1e-6 of the largest, as in the register model)
    get up to 1e-6, because those values themselves are noise. A wrong rank (float32 Gram
    eigenvalues, a dropped or squared singular value, another base of the logarithm) is off by
    far more.
    """
    eps = torch.finfo(torch.float64).eps
    s = torch.linalg.svdvals(x.double())
    n, k = min(x.shape), max(x.shape)
    dlam = eps * (k * (s * s).sum() + n * s[0] ** 2)
    floor = k * eps * s[0] ** 2
    ds_gram = torch.where(
        s * s > floor + dlam, torch.minimum(dlam / s.clamp_min(1e-300), dlam.sqrt()), (floor + dlam).sqrt()
    )
    ds = ds_gram + n * eps * s[0]
    total = s.sum()
    p = s / total
    entropy = -(p * p.clamp_min(1e-300).log()).sum()
    q = torch.maximum(p, ds / total)
    return float(((1 + q.log().abs()) * ds / total).sum() + ds.sum() / total * (1 + entropy))


def reference_stats(att, layout: TokenLayout, mass: float) -> dict:
    npf, cls = layout.num_prefix, layout.cls_index
    norms = att.last_norms[npf:]
    med = norms.median()
    mad = (norms - med).abs().median().clamp_min(1e-6)
    arts = ((norms > med + 6 * 1.4826 * mad).nonzero().flatten() + npf).tolist()
    out: dict[str, list] = {k: [] for k in ("entropy", "entropy_cls", "distance_px", "prefix_mass", "artifact_mass")}
    out.update(similarity=[], cls_cosine=[], mass_patches=[], rank_num=[], rank_eff=[], rank_eff_rtol=[])
    for layer in range(att.num_layers):
        A = att.rows(layer).cpu()  # H, N, N
        out["entropy"].append(_ref_entropy(A).mean(-1))
        out["distance_px"].append(_ref_distance(A, layout))
        out["prefix_mass"].append(A[:, :, :npf].sum(-1).mean(-1) if npf else torch.zeros(A.shape[0]))
        out["artifact_mass"].append(A[:, :, arts].sum(-1).mean(-1) if arts else torch.zeros(A.shape[0]))
        out["similarity"].append(_ref_js(A))
        if cls is not None:
            row = A[:, cls]
            out["entropy_cls"].append(_ref_entropy(row))
            v = row / row.norm(dim=-1, keepdim=True)
            out["cls_cosine"].append(v @ v.T)
            srt = row[:, npf:].sort(-1, descending=True).values
            frac = srt.cumsum(-1) / srt.sum(-1, keepdim=True)
            out["mass_patches"].append((frac < mass - 1e-7).sum(-1) + 1)
        n, e = _ref_ranks(att.head_out[layer].cpu().float())
        out["rank_num"].append(n)
        out["rank_eff"].append(e)
        out["rank_eff_rtol"].append(effective_rank_rtol(att.head_out[layer].cpu().float()))
    res = {k: torch.stack(v) if v and isinstance(v[0], torch.Tensor) else v for k, v in out.items()}
    res["artifacts"] = arts
    return res


TINY_FAMILIES = [
    ("test_vit", dict(), (64, 96)),  # qk capture, CLS
    ("vit_small_patch14_reg4_dinov2", dict(depth=2, embed_dim=64, num_heads=4, img_size=56), (56, 70)),  # registers
    ("vit_base_patch16_siglip_224", dict(depth=2, embed_dim=64, num_heads=4, img_size=64), (64, 64)),  # no CLS
    ("eva02_tiny_patch14_224", dict(depth=2, img_size=56), (56, 56)),  # maps captured (RoPE)
]


def _capture(name, kwargs, hw, materialise=False, seed=0):
    import timm

    from headscope.engine.block_capture import AttentionCapture
    from headscope.zoo.loaders import prefix_kinds

    torch.manual_seed(seed)
    try:
        model = timm.create_model(name, pretrained=False, num_classes=0, dynamic_img_size=True, **kwargs).eval()
    except TypeError:
        model = timm.create_model(name, pretrained=False, num_classes=0, **kwargs).eval()
    cap = AttentionCapture(model)
    x = torch.randn(2, 3, *hw)
    with torch.inference_mode(), cap.capturing(materialise=materialise):
        model.forward_features(x)
    ps = model.patch_embed.patch_size
    ps = (ps, ps) if isinstance(ps, int) else tuple(ps)
    layout = TokenLayout(prefix_kinds(model), (hw[0] // ps[0], hw[1] // ps[1]), ps)
    return cap.results(), layout


@pytest.mark.parametrize("materialise", [False, True], ids=["qk", "maps"])
@pytest.mark.parametrize("name,kwargs,hw", TINY_FAMILIES, ids=[f[0] for f in TINY_FAMILIES])
def test_vectorised_stats_equal_the_reference(name, kwargs, hw, materialise):
    from headscope.engine.stats import compute_stats

    atts, layout = _capture(name, kwargs, hw, materialise)
    for att in atts:  # batch-mates: views of one batch's tensors
        ref = reference_stats(att, layout, 0.6)
        got = compute_stats(att, layout, 0.6)
        for k in ("entropy", "distance_px", "prefix_mass", "artifact_mass", "similarity"):
            torch.testing.assert_close(getattr(got, k), ref[k], atol=2e-6, rtol=1e-5, msg=k)
        if layout.cls_index is None:
            assert got.entropy_cls is None and got.cls_cosine is None and got.mass_patches is None
        else:
            torch.testing.assert_close(got.entropy_cls, ref["entropy_cls"], atol=2e-6, rtol=1e-5)
            torch.testing.assert_close(got.cls_cosine, ref["cls_cosine"], atol=2e-6, rtol=1e-5)
            assert torch.equal(got.mass_patches, ref["mass_patches"])
        assert got.rank_numerical.tolist() == ref["rank_num"]
        # Per layer, within what float64 can promise for that layer's matrix (effective_rank_rtol).
        for layer, (g, r, rtol) in enumerate(zip(got.rank_effective.tolist(), ref["rank_eff"], ref["rank_eff_rtol"])):
            assert abs(g - r) <= rtol * r, f"layer {layer}: effective rank {g!r} != {r!r} (rtol {rtol:.1e})"
        assert got.artifacts == ref["artifacts"]
        # The JSON answer carries the same numbers.
        js = compute_stats(att, layout).as_dict(hw)
        assert js["entropy"] == got.entropy.tolist() and js["rank"]["numerical"] == ref["rank_num"]


@pytest.mark.parametrize("name,kwargs,hw", TINY_FAMILIES, ids=[f[0] for f in TINY_FAMILIES])
def test_batched_stats_equal_the_reference_image_by_image(name, kwargs, hw, monkeypatch):
    """compute_stats_batch (the survey's: one layer of every image at once, on the forward's own
    batch tensors) gives each image the reference values; a batch with maps takes that path."""
    from headscope.engine import stats

    atts, layout = _capture(name, kwargs, hw, True)
    assert len(atts) > 1
    if all(p is not None for p in atts[0].probs):  # every family here keeps its maps when asked
        assert stats._batch_of([a.probs[0] for a in atts]) is not None, "not seen as one batch tensor"
        # The batched path must not fall back to image-by-image computation.
        monkeypatch.setattr(stats, "compute_stats", lambda *a, **k: pytest.fail("fell back to compute_stats"))
    got = stats.compute_stats_batch(atts, layout, 0.6)
    monkeypatch.undo()
    for att, st in zip(atts, got):
        ref = reference_stats(att, layout, 0.6)
        for k in ("entropy", "distance_px", "prefix_mass", "artifact_mass", "similarity"):
            torch.testing.assert_close(getattr(st, k), ref[k], atol=2e-6, rtol=1e-5, msg=k)
        if layout.cls_index is not None:
            torch.testing.assert_close(st.entropy_cls, ref["entropy_cls"], atol=2e-6, rtol=1e-5)
            assert torch.equal(st.mass_patches, ref["mass_patches"])
        assert st.rank_numerical.tolist() == ref["rank_num"] and st.artifacts == ref["artifacts"]
    # Maps that are not one batch tensor (copies) go image by image, with the same values.
    apart = [stats._batch_of([a.probs[0].clone() for a in atts])]
    assert apart == [None]


def test_chunked_layers_give_the_same_stats():
    from headscope.engine.stats import compute_stats

    atts, layout = _capture("vit_small_patch16_224", dict(depth=5, embed_dim=64, num_heads=4, img_size=64), (64, 80))
    whole = compute_stats(atts[0], layout)
    N = atts[0].num_tokens
    per_layer = compute_stats(atts[0], layout, chunk_bytes=(2 * 4 + 3) * N * N * 4)  # one layer a chunk
    for k in ("entropy", "entropy_cls", "distance_px", "prefix_mass", "artifact_mass", "similarity", "cls_cosine"):
        torch.testing.assert_close(getattr(per_layer, k), getattr(whole, k), atol=1e-6, rtol=1e-6, msg=k)


def test_only_what_is_asked_for_is_computed():
    from headscope.engine.stats import compute_stats

    atts, layout = _capture("test_vit", {}, (64, 64))
    st = compute_stats(atts[0], layout, similarity=False, with_ranks=False)
    assert st.similarity is None and st.rank_numerical is None and st.rank_effective is None
    assert st.entropy.shape == (atts[0].num_layers, atts[0].num_heads)


def test_gram_singular_values_match_an_svd_down_to_tiny_ones():
    from headscope.engine.stats import singular_values

    torch.manual_seed(1)
    # Singular values spread over 9 decades, as real head outputs have (layer 0 of the default
    # model holds values a 1e-6 fraction of the largest).
    u, _ = torch.linalg.qr(torch.randn(200, 120, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(120, 120, dtype=torch.float64))
    s = torch.logspace(0, -9, 120, dtype=torch.float64)
    x = (u * s) @ v.T
    got = singular_values(x).flip(-1)
    ref = torch.linalg.svdvals(x)
    # Relative error ~ eps64 * (s_max / s)^2: 1e-8 at the numerical-rank threshold of a float32
    # matrix of this size (200 * eps32 = 2.4e-5 of the largest); values under the noise floor
    # (sqrt(200 * eps64) = 2e-7 of the largest) come out as 0.
    above = ref > 1e-5
    torch.testing.assert_close(got[above], ref[above], rtol=1e-7, atol=0)
    mid = (ref > 1e-6) & ~above
    torch.testing.assert_close(got[mid], ref[mid], rtol=1e-5, atol=0)
    assert (got[ref < 1e-7] == 0).all()
