"""``Scope.relevance(img, target="text:...")`` and ``Scope.zero_shot`` on a random-weight open_clip
model equal open_clip's own scores and Chefer's CLIP ``interpret`` (tests/helpers/clip_reference.py)
on the picture as the server prepares it."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("open_clip")

import headscope  # noqa: E402
from headscope.engine.relevance import MethodError  # noqa: E402
from helpers.clip_models import MODEL_ID, shared_reference  # noqa: E402
from helpers.clip_reference import interpret  # noqa: E402
from helpers.server import SAMPLES  # noqa: E402


@pytest.fixture(scope="module")
def scope():
    return headscope.load(MODEL_ID, device="cpu")


@pytest.fixture(scope="module")
def picture():
    return SAMPLES / "cat.png"


@pytest.fixture(scope="module")
def pixels(scope, picture):
    from headscope.config import Settings
    from headscope.serving.pictures import Pictures

    return Pictures.for_model(scope.lm, Settings()).prepare(picture.read_bytes()).pixels[None]


def test_relevance_for_a_phrase(scope, picture, pixels):
    ref = shared_reference()
    res = scope.relevance(picture, target="text:a cat on a sofa")
    assert res["target"] == "text:a cat on a sofa" and res["method"] == "chefer"
    assert [t["token"] for t in res["text_tokens"]] == ["a", "cat", "on", "a", "sofa"]
    _, want = interpret(ref, pixels, scope.lm.text.tokenize(["a cat on a sofa"]), start_layer=0)
    torch.testing.assert_close(torch.as_tensor(res["relevance"]).flatten(), want / want.sum(), atol=1e-6, rtol=1e-4)
    lg = scope.relevance(picture, method="legrad", target="text:a cat")
    assert lg["method"] == "legrad" and float(torch.as_tensor(lg["relevance"]).sum()) == pytest.approx(1.0)
    with pytest.raises(MethodError, match="phrase"):
        scope.relevance(picture, method="legrad")


def test_zero_shot(scope, picture, pixels):
    ref = shared_reference()
    labels = ["a dog", "a cat", "a red car"]
    res = scope.zero_shot(picture, labels)
    with torch.no_grad():
        img, txt, scale = ref(pixels, scope.lm.text.tokenize(labels))
        want = (scale * img @ txt.T).softmax(-1)[0]
    got = torch.zeros(3)
    for row in res["labels"]:
        got[row["index"]] = row["probability"]
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    assert [r["probability"] for r in res["labels"]] == sorted(got.tolist(), reverse=True)
    both = scope.zero_shot([picture, picture], "a dog, a cat", maps=True)
    assert len(both) == 2 and all(r["relevance"].shape == (7, 7) for r in both[0]["labels"])


def test_zero_shot_labels_that_cannot_be_read_are_clear_errors(scope, picture):
    from headscope.engine.clip_text import TextError

    with pytest.raises(TextError, match="no labels given"):
        scope.zero_shot(picture, [])
    with pytest.raises(TypeError, match="comma-separated string; got NoneType"):
        scope.zero_shot(picture, None)
    with pytest.raises(TypeError, match=r"labels\[1\]: a phrase is a str; got int"):
        scope.zero_shot(picture, ["a dog", 2])
    with pytest.raises(TextError, match="label 2 is empty"):
        scope.zero_shot(picture, ["a dog", " "])
    with pytest.raises(TextError, match="65 labels; at most 64"):
        scope.zero_shot(picture, [f"a {i}" for i in range(65)])
    with pytest.raises(MethodError, match="unknown"):  # a typo is refused without maps too
        scope.zero_shot(picture, ["a dog"], method="chefr")
    with pytest.raises(TextError, match="label 2: the phrase 'a a a"):  # too many tokens: named too
        scope.zero_shot(picture, ["a dog", "a " * 100])
    res = scope.zero_shot(picture, ("a dog", "a dog", "a cat"))  # any sequence; repeats once
    # each row's index is its place in the list given (a repeat at its first place)
    assert sorted((r["label"], r["index"]) for r in res["labels"]) == [("a cat", 2), ("a dog", 0)]


def test_zero_shot_says_its_precision_and_text_embeddings_are_kept_per_precision(scope, picture):
    """A bf16 Scope and an fp32 Scope sharing one model (one text tower, one embedding cache):
    the fp32 scores are those of fp32 text embeddings, whichever ran first."""
    labels = ["a photo of a cat", "a photo of a dog"]
    scope.lm.text._cache.clear()
    want = scope.zero_shot(picture, labels)  # fp32 first: its embeddings cached
    scope.lm.text._cache.clear()
    bf16 = headscope.load(scope.lm, precision="bf16").zero_shot(picture, labels)  # bf16 first now
    got = scope.zero_shot(picture, labels)
    assert want["precision"] == got["precision"] == "fp32" and bf16["precision"] == "bf16"
    assert [r["logit"] for r in got["labels"]] == [r["logit"] for r in want["labels"]]
    assert [r["logit"] for r in bf16["labels"]] != [r["logit"] for r in want["labels"]]
