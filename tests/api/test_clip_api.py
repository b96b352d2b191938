"""Phrases and zero-shot against a real server with a random-weight open_clip model.

The answers are compared with independent computations in this process on the same prepared
pixels: open_clip's own model for the scores and zero-shot probabilities, Chefer's CLIP
``interpret`` and LeGrad's rule written on open_clip's blocks for the maps (tests/helpers/
clip_reference.py). Bad input gets 422 in the one error shape and the server keeps serving.
"""

from __future__ import annotations

import json
from functools import partial

import httpx
import pytest
import torch

pytest.importorskip("open_clip")

from helpers import api  # noqa: E402
from helpers.api import API, assert_error, fresh_png  # noqa: E402
from helpers.clip_models import MODEL_ID, shared_model, shared_reference  # noqa: E402
from helpers.clip_reference import interpret, legrad  # noqa: E402
from helpers.server import Server  # noqa: E402

T = 300  # generous: these tests must pass on a loaded machine
get = partial(api.get, timeout=T)
PHRASE = "a red car"


@pytest.fixture(scope="module")
def server():
    srv = Server({"HEADSCOPE_EXTRA_MODELS": json.dumps([MODEL_ID]), "HEADSCOPE_MAX_WAIT_MS": "20"})
    yield srv.url
    srv.stop_cleanly()


@pytest.fixture(scope="module")
def picture() -> bytes:
    return fresh_png(seed=42, size=(160, 120))


@pytest.fixture(scope="module")
def image_id(server, picture) -> str:
    return api.post_json(server, picture, timeout=T, model=MODEL_ID, layers="-1", heads="0")["image_id"]


@pytest.fixture(scope="module")
def lm():
    return shared_model()


@pytest.fixture(scope="module")
def pixels(lm, picture):
    from headscope.config import Settings
    from headscope.serving.pictures import Pictures

    return Pictures.for_model(lm, Settings()).prepare(picture).pixels[None]


@pytest.fixture(scope="module")
def ref():
    return shared_reference()


def rel(server, image_id, **params) -> dict:
    r = get(server, f"{API}/{image_id}/relevance", model=MODEL_ID, **params)
    assert r.status_code == 200, r.text
    return r.json()


def _norm(v):
    return v / v.sum()


def test_model_is_listed_with_its_text_tower(server, image_id):
    models = {m["id"]: m for m in get(server, "/api/v1/models").json()["models"]}
    assert models[MODEL_ID]["text"] is True and models[MODEL_ID]["output"] == "embedding"


def test_phrase_relevance_equals_interpret_and_legrad(server, image_id, lm, pixels, ref):
    tok = lm.text.tokenize([PHRASE])
    R_text, want = interpret(ref, pixels, tok, start_layer=0, start_layer_text=0)
    body = rel(server, image_id, target=f"text:{PHRASE}", method="chefer")
    assert body["target"] == f"text:{PHRASE}" and body["kind"] == "embedding" and body["grid"] == [7, 7]
    torch.testing.assert_close(torch.tensor(body["relevance"]).flatten(), _norm(want), atol=1e-6, rtol=1e-4)
    with torch.no_grad():
        img, txt, scale = ref(pixels, tok)
    assert body["y"] == pytest.approx(float(scale * img[0] @ txt[0]), rel=1e-5, abs=1e-5)
    eot = int(tok[0].argmax())
    assert [t["token"] for t in body["text_tokens"]] == PHRASE.split()
    got = torch.tensor([t["relevance"] for t in body["text_tokens"]])
    torch.testing.assert_close(got, _norm(R_text[eot, 1:eot]), atol=1e-6, rtol=1e-4)
    lg = rel(server, image_id, target=f"text:{PHRASE}", method="legrad")
    assert lg["cached"] is True  # every method of the phrase came from one computation
    torch.testing.assert_close(
        torch.tensor(lg["relevance"]).flatten(), _norm(legrad(ref, pixels, tok)), atol=1e-6, rtol=1e-4
    )
    npy = get(server, f"{API}/{image_id}/relevance", model=MODEL_ID, target=f"text:{PHRASE}", format="npy")
    assert npy.status_code == 200 and "a_red_car" in npy.headers["content-disposition"]


def test_zero_shot_equals_open_clip(server, image_id, lm, pixels, ref):
    labels = ["a dog", "a cat", PHRASE]
    r = get(server, f"{API}/{image_id}/zero-shot", model=MODEL_ID, labels=",".join(labels))
    assert r.status_code == 200, r.text
    body = r.json()
    with torch.no_grad():
        img, txt, scale = ref(pixels, lm.text.tokenize(labels))
        want = (scale * img @ txt.T).softmax(-1)[0]
    assert body["rule"] == "softmax" and body["logit_bias"] is None
    probs = [row["probability"] for row in body["labels"]]
    assert probs == sorted(probs, reverse=True)
    got = torch.zeros(3)
    for row in body["labels"]:
        assert row["label"] == labels[row["index"]] and "relevance" not in row or row["relevance"] is None
        got[row["index"]] = row["probability"]
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    # maps on request: each label's map is the relevance endpoint's map for text:LABEL
    r = get(server, f"{API}/{image_id}/zero-shot", model=MODEL_ID, labels=" a dog ,a red car", maps="true")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["method"] == "chefer" and body["grid"] == [7, 7] and len(body["labels"]) == 2
    for row in body["labels"]:
        same = rel(server, image_id, target=f"text:{row['label']}", method="chefer")
        assert same["cached"] is True
        torch.testing.assert_close(torch.tensor(row["relevance"]), torch.tensor(same["relevance"]), atol=0, rtol=0)
        assert [t["token"] for t in row["text_tokens"]] == row["label"].split()


def test_faithfulness_for_a_phrase(server, image_id):
    params = dict(model=MODEL_ID, target=f"text:{PHRASE}", methods="legrad,chefer,random", fractions="0,0.5")
    r = get(server, f"{API}/{image_id}/faithfulness", **params)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["target"] == f"text:{PHRASE}" and list(body["methods"]) == ["legrad", "chefer", "random"]
    assert body["methods"]["chefer"]["positive"][0] == pytest.approx(1.0)


@pytest.mark.parametrize(
    "path, params, code",
    [
        ("relevance", {"target": "text:"}, "bad_text"),
        ("relevance", {"target": "text:   "}, "bad_text"),
        ("relevance", {"target": "text:" + "a" * 301}, "bad_text"),
        ("relevance", {"target": "text:" + "a " * 100}, "bad_text"),
        ("relevance", {"target": "text:" + "a" * 4100}, "bad_text"),  # was pydantic's max_length: invalid_parameter
        ("faithfulness", {"target": "text:" + "a" * 4100}, "bad_text"),
        ("relevance", {"target": "embedding", "method": "legrad"}, "bad_method"),
        ("relevance", {"target": "text:a dog", "method": "nope"}, "bad_method"),
        ("faithfulness", {"target": "text:a dog", "methods": "legrad,nope"}, "bad_method"),
        ("zero-shot", {"labels": ""}, "bad_text"),
        ("zero-shot", {"labels": "dog,,cat"}, "bad_text"),
        ("zero-shot", {"labels": ",".join(f"l{i}" for i in range(65))}, "bad_text"),
        ("zero-shot", {"labels": "dog", "maps": "true", "method": "nope"}, "bad_method"),
        ("zero-shot", {"labels": "dog", "method": "chefer2021"}, "bad_method"),  # without maps too, as in Python
        ("zero-shot", {}, None),
    ],
)
def test_bad_input_is_422(server, image_id, path, params, code):
    r = get(server, f"{API}/{image_id}/{path}", model=MODEL_ID, **params)
    assert_error(r, 422, code)


def test_a_repeated_label_counts_once(server, image_id):
    """65 copies of one label are one label (the parameter's description says so); 65 distinct are
    too many, counted as distinct."""
    r = get(server, f"{API}/{image_id}/zero-shot", model=MODEL_ID, labels=",".join(["a dog"] * 65))
    assert r.status_code == 200, r.text
    assert [x["label"] for x in r.json()["labels"]] == ["a dog"]
    r = get(
        server,
        f"{API}/{image_id}/zero-shot",
        model=MODEL_ID,
        labels=",".join(["a dog"] * 10 + [f"l{i}" for i in range(65)]),
    )
    assert_error(r, 422, "bad_text")
    assert r.json()["error"]["message"] == "66 labels; at most 64"


def test_index_is_the_place_in_the_requests_list_and_errors_name_the_label(server, image_id):
    """A repeat counts once, at its first place: "a dog" after two "a cat"s is index 2, as the
    schema says, so a client maps each row back to its own list. Errors name the label by its
    place (from 1), the one with too many tokens too; an empty label is not told to write text:."""
    r = get(server, f"{API}/{image_id}/zero-shot", model=MODEL_ID, labels="a cat,a cat,a dog")
    assert r.status_code == 200, r.text
    assert sorted((x["label"], x["index"]) for x in r.json()["labels"]) == [("a cat", 0), ("a dog", 2)]
    r = get(server, f"{API}/{image_id}/zero-shot", model=MODEL_ID, labels="a dog," + "a " * 100)
    assert_error(r, 422, "bad_text")
    assert r.json()["error"]["message"].startswith("label 2: the phrase 'a a a")
    r = get(server, f"{API}/{image_id}/zero-shot", model=MODEL_ID, labels="a cat,,a dog")
    assert_error(r, 422, "bad_text")
    assert r.json()["error"]["message"].startswith("label 2 is empty: write the labels as phrases between commas")
    # "text" without its phrase: told how to write one, on a model that takes one
    r = get(server, f"{API}/{image_id}/relevance", model=MODEL_ID, target="text")
    assert_error(r, 422, "bad_target")
    assert "write text:PHRASE, e.g. text:a dog" in r.json()["error"]["message"]
    r = get(server, f"{API}/{image_id}/relevance", model=MODEL_ID, target="box:0,0,8,8")
    assert_error(r, 422, "bad_target")
    assert r.json()["error"]["message"].endswith("it takes target=embedding or text:PHRASE (e.g. text:a dog)")


def test_non_utf8_and_no_text_tower_are_422(server, image_id):
    for path, query in (("relevance", "target=text:caf%FF"), ("zero-shot", "labels=dog,%C3%28")):
        r = httpx.get(f"{server}{API}/{image_id}/{path}?model={MODEL_ID}&{query}", timeout=T)
        assert_error(r, 422)
    # the default model (no text tower): its own upload, then a phrase
    other = api.post_json(server, fresh_png(seed=43), timeout=T, layers="-1", heads="0")["image_id"]
    for path, params in (("relevance", {"target": "text:a dog"}), ("zero-shot", {"labels": "dog,cat"})):
        r = get(server, f"{API}/{other}/{path}", **params)
        assert_error(r, 422, "bad_text")
        assert "no text tower" in r.json()["error"]["message"]
    assert get(server, "/readyz").status_code == 200
