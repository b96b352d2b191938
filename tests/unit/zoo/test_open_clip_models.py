"""open_clip models: ids, the image tower as a timm ViT (exact), the text tower, the offline refusal."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("open_clip")

from headscope.engine.forward import forward_capture  # noqa: E402
from headscope.zoo.errors import ModelLoadError, UnknownModelError  # noqa: E402
from headscope.zoo.ids import ModelSpec  # noqa: E402
from headscope.zoo.loaders import build, skeleton, wrap_module  # noqa: E402
from headscope.zoo.open_clip_models import timm_vit_of  # noqa: E402
from helpers.clip_models import ARCH, mha_maps, reference_model, shared_model, shared_reference  # noqa: E402


@pytest.fixture(scope="module")
def lm():
    return shared_model()


@pytest.fixture(scope="module")
def ref():
    return reference_model()


def test_ids():
    s = ModelSpec.parse("open_clip:ViT-B-32/openai")
    assert (s.id, s.source, s.arch) == ("open_clip:ViT-B-32/openai", "open_clip", "ViT-B-32/openai")
    assert ModelSpec.parse("clip=open_clip:ViT-S-32").id == "clip"
    for bad in ("open_clip:", "open_clip:a/b/c", "open_clip:/x"):
        with pytest.raises(UnknownModelError):
            ModelSpec.parse(bad)
    with pytest.raises(UnknownModelError, match="no architecture"):
        build(ModelSpec.parse("open_clip:NoSuchArch"), None)
    with pytest.raises(UnknownModelError, match="no pretrained weights"):
        build(ModelSpec.parse("open_clip:ViT-S-32/nosuchtag"), None)


def test_random_model_is_openclip_seed0(lm):
    info = lm.info()
    assert info["text"] and info["output"] == "embedding" and info["prefix_tokens"] == [{"index": 0, "kind": "cls"}]
    assert (lm.num_layers, lm.num_heads, lm.patch_size, lm.input_size) == (12, 6, (32, 32), (224, 224))
    base = shared_reference()
    x = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = base.encode_image(x)
        got = lm.model.forward_head(lm.model.forward_features(x))
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)


def test_image_tower_exact_against_multihead_attention(ref):
    """The converted tower's embedding equals encode_image, and the captured maps of every layer
    and head equal what nn.MultiheadAttention computes in open_clip's own blocks."""
    vit = timm_vit_of(ref.visual).eval().requires_grad_(False)
    tlm = wrap_module(vit, "clip-test")
    x = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(vit.forward_head(vit.forward_features(x)), ref.encode_image(x), atol=2e-5, rtol=1e-5)
    want = mha_maps(ref.visual, x)
    for materialise in (False, True):
        caps = forward_capture(tlm, x, materialise=materialise)
        for b, cap in enumerate(caps):
            for layer in range(tlm.num_layers):
                torch.testing.assert_close(cap.rows(layer), want[layer][b], atol=1e-6, rtol=1e-5)


def test_text_tower_equals_encode_text(lm, ref):
    import open_clip

    from headscope.engine.clip_text import TextTower

    tower = TextTower(ref, open_clip.get_tokenizer(ARCH), "clip")
    ids = tower.tokenize(["a dog", "a red car on a wet street", "x"])
    with torch.no_grad():
        torch.testing.assert_close(tower.forward(ids).embedding, ref.encode_text(ids), atol=2e-5, rtol=1e-5)
    # the loaded model's tower (unperturbed weights) against open_clip's own, and its cache
    base = shared_reference()
    with torch.no_grad():
        want = base.encode_text(ids)
    phrases = ["a dog", "a red car on a wet street", "x"]
    torch.testing.assert_close(lm.text.embeddings(phrases), want, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(lm.text.embeddings(["x"]), want[2:], atol=2e-5, rtol=1e-5)
    words = [w for _, w in lm.text.words(ids[1], lm.text.readout(ids)[1])]
    assert words == ["a", "red", "car", "on", "a", "wet", "street"]


def test_skeleton_needs_no_weights():
    sk = skeleton(ModelSpec.parse("open_clip:ViT-B-32/openai"), None)
    assert (sk.num_layers, sk.num_heads, sk.patch_size) == (12, 12, (32, 32))


def test_pretrained_offline_is_refused_clearly(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", "/nonexistent-headscope-hf-home")
    with pytest.raises(ModelLoadError) as e:
        build(ModelSpec.parse("open_clip:ViT-B-32/openai"), None)
    msg = str(e.value)
    assert "headscope fetch open_clip:ViT-B-32/openai" in msg
    assert "open_clip:ViT-B-32 (the same model with random weights)" in msg
    # `headscope serve` says it before loading anything: not cached, hub unreachable (not permanent)
    from headscope.zoo import preflight

    monkeypatch.setattr(preflight, "hub_reachable", lambda: False)
    why, permanent = preflight.preflight("open_clip:ViT-B-32/openai", None)
    assert not permanent and "open_clip:ViT-B-32 (the same model with random weights)" in why
    assert preflight.preflight("open_clip:ViT-B-32", None) is None  # random weights: nothing to fetch


def test_siglip_without_its_tokenizer_has_no_text_tower_and_says_why(monkeypatch):
    """SigLIP's tokenizer comes from the Hugging Face hub: offline (and not cached) the model still
    loads, without a text tower, and a text target is refused with why. The architecture on the
    meta device goes through the same parts (tests/unit/engine/test_siglip_text.py checks the
    built tower against open_clip's, and its text side with a stand-in tokenizer)."""
    import open_clip

    from headscope.engine.relevance import parse_target
    from headscope.engine.text_relevance import TextError

    def offline(name, **kw):
        raise OSError("We couldn't connect to 'https://huggingface.co' to load the files")

    from headscope.zoo import open_clip_models

    monkeypatch.setattr(open_clip, "get_tokenizer", offline)
    monkeypatch.setattr(open_clip_models, "hub_reachable", lambda: False)
    sk = skeleton(ModelSpec.parse("open_clip:ViT-B-16-SigLIP"), None)
    assert sk.prefix == [] and sk.output_kind == "embedding" and sk.num_layers == 12
    assert sk.text is None and "tokenizer could not be loaded from the Hugging Face hub" in sk.text_note
    # Why, in whole words (the hub's error was cut mid-URL), and no advice to use the model it is.
    with pytest.raises(TextError) as e:
        parse_target("text:a dog", sk)
    said = str(e.value)
    assert (
        said.startswith("open_clip:ViT-B-16-SigLIP has no text tower here: its tokenizer")
        and "~/.cache/huggingface" in said
    )
    assert "need a CLIP-style model" not in said and "https://" not in said
