"""Relevance for a phrase (text:PHRASE) equals independent computations on open_clip's own
modules: Chefer's CLIP notebook `interpret`, LeGrad's compute_legrad_clip; zero-shot equals
open_clip's own softmax; bad phrases and models without a text tower are refused."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("open_clip")

from headscope.engine.clip_text import MAX_PHRASE_CHARS, TextError  # noqa: E402
from headscope.engine.faithfulness import faithfulness  # noqa: E402
from headscope.engine.relevance import MethodError, parse_target, relevance  # noqa: E402
from headscope.engine.text_relevance import TextTarget, zero_shot  # noqa: E402
from helpers.clip_models import shared_model, shared_reference  # noqa: E402
from helpers.clip_reference import interpret, legrad  # noqa: E402

PHRASE = "a photo of a red car"


@pytest.fixture(scope="module")
def lm():
    return shared_model()


@pytest.fixture(scope="module")
def ref():
    return shared_reference()


@pytest.fixture(scope="module")
def pixels():
    return torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(5))


@pytest.fixture(scope="module")
def rel(lm, pixels):
    return relevance(lm, pixels, f"text:{PHRASE}")[0]


def _norm(v: torch.Tensor) -> torch.Tensor:
    return (v / v.sum()).float()


def test_target_and_y(lm, ref, pixels, rel):
    t = parse_target(f"  TEXT:{PHRASE} ", lm)
    assert isinstance(t, TextTarget) and str(t) == f"text:{PHRASE}" and t.phrase == PHRASE
    tok = lm.text.tokenize([PHRASE])
    with torch.no_grad():
        img, txt, scale = ref(pixels, tok)
    want = float(scale * (img @ txt.T)[0, 0])  # open_clip's own logits_per_image
    assert rel.y == pytest.approx(want, rel=1e-5, abs=1e-5)
    assert rel.class_index is None and rel.rows == "cls"
    assert set(rel.maps) == {"chefer", "grad_attention", "rollout", "attention", "random", "legrad"}
    for m in rel.maps.values():
        assert m.shape == (7, 7) and float(m.sum()) == pytest.approx(1.0, abs=1e-5)


def test_chefer_equals_interpret(lm, ref, pixels, rel):
    """GAE over every layer = interpret(start_layer=0); grad_attention = interpret's default (last layer)."""
    tok = lm.text.tokenize([PHRASE])
    R_text, all_layers = interpret(ref, pixels, tok, start_layer=0, start_layer_text=0)
    torch.testing.assert_close(rel.maps["chefer"].flatten(), _norm(all_layers), atol=1e-6, rtol=1e-4)
    _, last = interpret(ref, pixels, tok)
    torch.testing.assert_close(rel.maps["grad_attention"].flatten(), _norm(last), atol=1e-6, rtol=1e-4)
    # the text's tokens: R_text's end-of-text row over the words (the notebook's 1:eot)
    eot = int(tok[0].argmax())
    want = _norm(R_text[eot, 1:eot])
    got = torch.tensor([t["relevance"] for t in rel.text_tokens])
    assert [t["token"] for t in rel.text_tokens] == PHRASE.split()
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-4)


def test_legrad_equals_reference(lm, ref, pixels, rel):
    want = legrad(ref, pixels, lm.text.tokenize([PHRASE]))
    torch.testing.assert_close(rel.maps["legrad"].flatten(), _norm(want), atol=1e-6, rtol=1e-4)


def test_batch_equals_one_at_a_time(lm, pixels, rel):
    """The second image of a batch gets the maps it gets alone (``rel``: these pixels alone)."""
    two = torch.cat([pixels.flip(-1), pixels])
    both = relevance(lm, two, f"text:{PHRASE}", "chefer,legrad")
    second = rel
    for m in ("chefer", "legrad"):
        torch.testing.assert_close(both[1].maps[m], second.maps[m], atol=1e-6, rtol=1e-4)
    assert [t["token"] for t in both[1].text_tokens] == [t["token"] for t in second.text_tokens]
    got = [t["relevance"] for t in both[1].text_tokens]
    assert got == pytest.approx([t["relevance"] for t in second.text_tokens], rel=1e-4, abs=1e-6)


def test_zero_shot_equals_open_clip(lm, ref, pixels):
    labels = ["a dog", "a cat", "a red car"]
    got = zero_shot(lm, pixels, labels)
    tok = lm.text.tokenize(labels)
    with torch.no_grad():
        img, txt, scale = ref(pixels, tok)  # normalised features
        want = (scale * img @ txt.T).softmax(-1)[0]
    assert got["rule"] == "softmax"
    torch.testing.assert_close(torch.tensor(got["probabilities"]), want, atol=1e-6, rtol=1e-5)


def test_faithfulness_for_a_phrase(lm, pixels, rel):
    res = faithfulness(lm, pixels[0], {m: rel.maps[m] for m in ("chefer", "legrad")}, f"text:{PHRASE}", (0, 0.5))
    assert res.target == f"text:{PHRASE}" and res.y == pytest.approx(rel.y, rel=1e-4, abs=1e-4)
    assert set(res.methods) == {"chefer", "legrad"}


@pytest.mark.parametrize(
    "spec, match",
    [
        ("text:", "empty"),
        ("text:   ", "empty"),
        ("text:" + "a" * (MAX_PHRASE_CHARS + 1), "at most"),
        ("text:caf\ufffd", "UTF-8"),
        ("text:a \udcff cat", "UTF-8"),  # bytes that are not UTF-8, as os.fsdecode gives them (was taken)
        ("text:a\x00b", "control"),
        ("text:" + "a " * 100, "tokens"),
    ],
)
def test_bad_phrases(lm, spec, match):
    with pytest.raises(TextError, match=match):
        parse_target(spec, lm)


def test_text_target_needs_a_text_tower():
    from headscope.zoo.loaders import wrap_module
    from helpers.models import make

    vit = wrap_module(make("test_vit", {}), "plain")
    with pytest.raises(TextError, match="no text tower"):
        parse_target("text:a dog", vit)


def test_legrad_needs_a_phrase(lm):
    from headscope.engine.relevance import Target
    from headscope.engine.text_relevance import parse_target_methods

    with pytest.raises(MethodError, match="phrase"):
        parse_target_methods("chefer,legrad", Target("embedding"), lm)
    assert parse_target_methods("legrad,chefer", parse_target("text:a", lm), lm) == ("legrad", "chefer")
    with pytest.raises(MethodError, match="unknown") as unknown:
        parse_target_methods("legrad,nope", parse_target("text:a", lm), lm)
    # the methods a phrase takes are named: legrad, not the LRP rules it refuses
    offered = str(unknown.value).split("use one of ")[1]
    assert "legrad" in offered and "chefer2021" not in offered and "attnlrp" not in offered, offered
    with pytest.raises(MethodError, match="chefer2021") as image:
        parse_target_methods("nope", Target("embedding"), lm)
    assert "legrad" not in str(image.value).split("use one of ")[1]
