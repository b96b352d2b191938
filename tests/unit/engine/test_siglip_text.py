"""SigLIP's text side (issue 42): y is SigLIP's sigmoid logit, zero-shot its per-label sigmoid
(as open_clip's README scores SigLIP), every method for a phrase works on its attention-pooled
tower, and LeGrad's SigLIP variant (the MAP head's own map, with the authors' correction) equals
an independent computation on open_clip's own modules.

``open_clip:ViT-B-16-SigLIP`` with random weights; its tokenizer comes from the Hugging Face hub,
so a word-level stand-in read through open_clip's own ``HFTokenizer`` takes its place
(tests/helpers/clip_models.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("open_clip")
pytest.importorskip("transformers")  # open_clip's HFTokenizer reads SigLIP's (here a stand-in)

from headscope.engine.clip_text import TextError  # noqa: E402
from headscope.engine.relevance import MethodError, relevance  # noqa: E402
from headscope.engine.text_relevance import (  # noqa: E402
    LEGRAD_CORRECTION,
    LEGRAD_EMPTY_PROMPT,
    text_methods,
    zero_shot,
)
from helpers.clip_models import siglip_model  # noqa: E402

PHRASE = "a red car on a wet street"
LABELS = ["a dog", "a cat", "a red car", "the street", "a small photo"]


@pytest.fixture(scope="module")
def siglip(tmp_path_factory):
    return siglip_model(tmp_path_factory.mktemp("siglip-tokenizer"))


@pytest.fixture(scope="module")
def pixels():
    return torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(7))


@pytest.fixture(scope="module")
def rels(siglip, pixels):
    lm, _, _ = siglip
    return relevance(lm, pixels, f"text:{PHRASE}")


@pytest.fixture(scope="module")
def want(siglip, pixels) -> torch.Tensor:
    """open_clip's own SigLIP scores ``[1, 1 + labels]`` of the phrase and the labels:
    ``logit_scale.exp() * img @ txt.T + logit_bias`` from its forward."""
    _, ref, tokenizer = siglip
    with torch.no_grad():
        img, txt, scale, bias = ref(pixels, tokenizer([PHRASE, *LABELS]))
    return scale * img @ txt.T + bias


def test_image_tower_is_open_clips_timm_trunk(siglip, pixels):
    """The image tower is open_clip's timm trunk itself (attention-pooled, no CLS token)."""
    lm, ref, _ = siglip
    assert lm.prefix == [] and lm.output_kind == "embedding" and lm.num_layers == 12
    with torch.no_grad():
        got = lm.model.forward_head(lm.model.forward_features(pixels))
        torch.testing.assert_close(got, ref.encode_image(pixels), atol=2e-5, rtol=1e-5)


def test_y_is_the_sigmoid_logit_and_every_method_works(siglip, rels, want):
    lm, _, _ = siglip
    assert lm.text is not None and lm.text.kind == "siglip" and lm.prefix == []
    assert text_methods(lm) == ("chefer", "grad_attention", "rollout", "attention", "random", "legrad")
    assert [r.y for r in rels] == pytest.approx(want[:, 0].tolist(), rel=1e-5, abs=1e-5)
    for r in rels:
        assert r.rows == "mean" and set(r.maps) == set(text_methods(lm)) and not r.uniform
        for m in r.maps.values():
            assert m.shape == (14, 14) and torch.isfinite(m).all() and float(m.sum()) == pytest.approx(1.0, abs=1e-5)
        words = [t["token"] for t in r.text_tokens]  # padding and the end token are not words
        assert words == PHRASE.split() and sum(t["relevance"] for t in r.text_tokens) == pytest.approx(1.0)


def test_zero_shot_is_the_sigmoid_per_label_as_open_clip_scores_it(siglip, pixels, want):
    lm, _, _ = siglip
    z = zero_shot(lm, pixels, LABELS)
    logits = want[0, 1:]
    assert z["rule"] == "sigmoid"
    torch.testing.assert_close(torch.tensor(z["logits"]), logits, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(torch.tensor(z["probabilities"]), torch.sigmoid(logits), rtol=1e-4, atol=1e-7)
    assert sum(z["probabilities"]) != pytest.approx(1.0)  # not a softmax over the labels


def legrad_siglip_reference(ref, tokenizer, pixels, phrase, layer_index=-2) -> torch.Tensor:
    """LeGrad's SigLIP map, from open_clip's own modules: each of the last blocks' outputs through
    timm's own ``AttentionPoolLatent``; the gradient with respect to its softmax from the chain rule
    through its output ``o = p @ v`` (``ds/dp = ds/do @ v^T``, ``o`` read by a pre-hook on its
    ``proj``), so nothing of Headscope's forward is reused. ``[B, N]`` after the authors'
    correction and min-max."""
    trunk = ref.visual.trunk
    pool = trunk.attn_pool
    assert pool.pos_embed is None  # v below is the kv projection of the tokens alone
    blocks = list(trunk.blocks)
    outs: list[torch.Tensor] = []
    hooks = [b.register_forward_hook(lambda m, a, o: outs.append(o)) for b in blocks[len(blocks) + layer_index :]]
    with torch.no_grad():
        ref.encode_image(pixels)
        text = ref.encode_text(tokenizer([phrase]), normalize=True)  # 1, D
        empty = ref.encode_text(tokenizer([LEGRAD_EMPTY_PROMPT]), normalize=True)
    for h in hooks:
        h.remove()
    acc = {"text": 0.0, "empty": 0.0}
    for f in outs:
        f = f.detach().requires_grad_(True)
        seen: list[torch.Tensor] = []
        hook = pool.proj.register_forward_pre_hook(lambda m, a, seen=seen: seen.append(a[0]))
        with torch.enable_grad():
            e = F.normalize(pool(f), dim=-1)  # B, D
        hook.remove()
        B, N, C = f.shape
        H = pool.num_heads
        v = pool.kv(f).reshape(B, N, 2, H, C // H)[:, :, 1].transpose(1, 2)  # B, H, N, d
        for key, u in (("text", text), ("empty", empty)):
            g_o = torch.autograd.grad((e @ u.T).sum(), seen[0], retain_graph=True)[0]  # B, 1, C
            g_p = g_o.reshape(B, 1, H, C // H).transpose(1, 2) @ v.transpose(-2, -1)  # B, H, 1, N
            acc[key] = acc[key] + g_p.clamp(min=0).mean(1)[:, 0]

    def min_max(x):
        lo, hi = x.min(1, keepdim=True)[0], x.max(1, keepdim=True)[0]
        return (x - lo) / (hi - lo)

    out = acc["text"].detach().clone()
    out[min_max(acc["empty"].detach()) > LEGRAD_CORRECTION] = 0
    return min_max(out)


def test_legrad_equals_the_authors_siglip_variant(siglip, pixels, rels):
    lm, ref, tokenizer = siglip
    want = legrad_siglip_reference(ref, tokenizer, pixels, PHRASE)
    for b, r in enumerate(rels):
        got = r.maps["legrad"].flatten()
        assert (want[b] == 0).any()  # the correction zeroed some patches: the comparison covers it
        torch.testing.assert_close(got, (want[b] / want[b].sum()).float(), rtol=1e-4, atol=1e-6)


def test_siglip_phrase_errors(siglip, pixels):
    lm, _, _ = siglip
    with pytest.raises(TextError, match="tokens; this model reads at most 64"):
        relevance(lm, pixels[:1], "text:" + " ".join(["dog"] * 70))
    with pytest.raises(MethodError, match="not offered for a phrase"):
        relevance(lm, pixels[:1], "text:a dog", methods="attnlrp")
