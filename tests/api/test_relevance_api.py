"""GET …/relevance, …/faithfulness and …/faithfulness/progress against a real server.

The answers are compared with the engine's functions (app/engine/relevance.py, faithfulness.py:
exact against independent references in tests/unit/engine/) run in this process on the same
prepared pixels. One server for the module: the default model, a classifier of random weights
(targets ``top`` and ``class:N``) and a Swin model (refused), so no other server is needed.
Requests are kept light (few fractions) where the defaults are not what a test is about.
"""

from __future__ import annotations

import io
import json
import re
from functools import partial

import httpx
import numpy as np
import pytest
from safetensors.numpy import load as st_load

from helpers import api
from helpers.api import API, assert_error, fresh_photo
from helpers.models import write_classifier
from helpers.server import HTTP_TIMEOUT, ROOT, Server
from helpers.swin_reference import SWIN_V1
from helpers.waiting import wait_until

T = 300  # generous: these tests must pass on a loaded machine
post = partial(api.post_json, timeout=T)
get = partial(api.get, timeout=T)
CLF = "local:test_vit@why_head.safetensors"  # the id the server lists the classifier under
BOX = "box:40,30,200,150"


@pytest.fixture(scope="module")
def clf_spec(tmp_path_factory) -> str:
    return write_classifier(tmp_path_factory.mktemp("why") / "why_head.safetensors")


@pytest.fixture(scope="module")
def why(clf_spec):
    srv = Server({"HEADSCOPE_EXTRA_MODELS": json.dumps([clf_spec, SWIN_V1]), "HEADSCOPE_MAX_WAIT_MS": "20"})
    yield srv.url
    srv.stop_cleanly()


@pytest.fixture(scope="module")
def lm():
    from headscope.zoo.loaders import load_embedded

    return load_embedded(ROOT / "models")


@pytest.fixture(scope="module")
def clf_lm(clf_spec):
    from headscope.zoo.registry import Registry

    return Registry([clf_spec], ROOT / "models").get()


def pixels(lm, data: bytes):
    """The picture as the server prepares it (the one preparation path, the server's settings)."""
    from headscope.config import Settings
    from headscope.serving.pictures import Pictures

    return Pictures.for_model(lm, Settings()).prepare(data).pixels


def rel(base: str, image_id: str, **params) -> dict:
    r = get(base, f"{API}/{image_id}/relevance", **params)
    assert r.status_code == 200, r.text
    return r.json()


def faith(base: str, image_id: str, **params) -> dict:
    """GET …/faithfulness; under heavy load a 504 (the test goes on, cached): ask again."""
    for _ in range(20):
        r = get(base, f"{API}/{image_id}/faithfulness", **params)
        if r.status_code == 200:
            return r.json()
        assert_error(r, 504, "timeout")
    raise AssertionError("the faithfulness test never finished")


def grid_of(body: dict) -> np.ndarray:
    return np.asarray(body["relevance"], np.float32)


def tensor_of(body: dict):
    import torch

    return torch.from_numpy(grid_of(body))


@pytest.fixture(scope="module")
def cat(samples) -> bytes:
    return fresh_photo(samples["cat"], 1)


@pytest.fixture(scope="module")
def cat_id(why, cat) -> str:
    return post(why, cat, "cat.png", layers="-1")["image_id"]


def test_every_method_equals_the_engine_and_one_computation_answers_them_all(why, lm, cat, cat_id):
    from headscope.engine.relevance import LRP_METHODS, METHODS, relevance

    x = pixels(lm, cat)
    for target in ("", BOX):
        # the LRP methods (a forward and backward each) for the whole output only: the server's time
        methods = METHODS if not target else tuple(m for m in METHODS if m not in LRP_METHODS)
        want = relevance(lm, x[None], target or None, methods)[0]
        for i, method in enumerate(methods):
            body = rel(why, cat_id, method=method, target=target)
            got = grid_of(body)
            assert body["method"] == method and body["target"] == str(want.target) == (target or "output")
            assert body["grid"] == list(want.grid) == list(got.shape) == body["shape"] == [16, 24]
            assert body["input_size"] == [224, 336] and body["rows"] == "cls" and body["kind"] == "saliency"
            np.testing.assert_allclose(got, want.maps[method].numpy(), rtol=1e-4, atol=1e-7)
            assert body["y"] == pytest.approx(want.y, rel=1e-5)
            assert body["seed"] == (0 if method == "random" else None)
            if method == "attnlrp":  # signed, divided by |sum|
                assert abs(got.sum()) == pytest.approx(1.0, abs=1e-5)
            else:
                assert got.sum() == pytest.approx(1.0, abs=1e-5) and got.min() >= 0
            if method in LRP_METHODS:  # a forward under its rules of its own, when asked for
                assert rel(why, cat_id, method=method, target=target)["cached"] is True
                continue
            # one forward and backward gave every other method: the first request computed, the others read
            assert body["cached"] is (i > 0), (target, method)
    chefer, attention = grid_of(rel(why, cat_id, method="chefer")), grid_of(rel(why, cat_id, method="attention"))
    assert np.abs(chefer - attention).max() > 10 * np.abs(chefer).max() * 1e-4  # the methods differ


def test_equivalent_requests_share_one_computation(why, samples):
    image_id = post(why, fresh_photo(samples["coffee"], 2), "coffee.png", layers="-1")["image_id"]
    assert rel(why, image_id, target="box:10,20,100,120")["cached"] is False
    for spelling in ("BOX: 10, 20, 100, 120", "box:10,20,100,120"):
        body = rel(why, image_id, target=spelling, method="rollout")
        assert body["cached"] is True and body["target"] == "box:10,20,100,120"
    assert rel(why, image_id)["cached"] is False  # another target: computed
    assert rel(why, image_id, target="output", method="grad_attention")["cached"] is True  # the default, spelt


def test_the_random_map_follows_its_seed(why, cat_id):
    from headscope.engine.relevance import random_map

    zero = rel(why, cat_id, method="random")
    seven = rel(why, cat_id, method="random", seed=7)
    assert seven["seed"] == 7 and seven["cached"] is True  # drawn from the seed: no forward
    np.testing.assert_array_equal(grid_of(seven), random_map(16 * 24, 7).reshape(16, 24).numpy())
    np.testing.assert_array_equal(grid_of(zero), random_map(16 * 24, 0).reshape(16, 24).numpy())
    assert rel(why, cat_id, method="chefer", seed=7)["seed"] is None  # no seed in a deterministic map


def test_the_three_formats_carry_the_same_map(why, cat_id):
    body = rel(why, cat_id, method="chefer", target=BOX)
    want = grid_of(body)
    r = get(why, f"{API}/{cat_id}/relevance", method="chefer", target=BOX, format="npy")
    assert r.status_code == 200 and r.headers["content-type"] == "application/octet-stream"
    assert r.headers["content-disposition"] == (
        f'attachment; filename="relevance-{cat_id[:12]}-dinov2-s14-focus-chefer-box-40_30_200_150.npy"'
    )
    np.testing.assert_array_equal(np.load(io.BytesIO(r.content)), want)
    meta = json.loads(r.headers["x-headscope-meta"])
    assert (meta["method"], meta["target"], meta["shape"], meta["y"]) == ("chefer", BOX, [16, 24], body["y"])
    r = get(why, f"{API}/{cat_id}/relevance", method="chefer", target=BOX, format="safetensors")
    assert r.status_code == 200 and r.headers["content-disposition"].endswith('.safetensors"')
    np.testing.assert_array_equal(st_load(r.content)["relevance"], want)
    n = int.from_bytes(r.content[:8], "little")
    inside = json.loads(json.loads(r.content[8 : 8 + n])["__metadata__"]["headscope"])
    assert inside["target"] == BOX and inside["grid"] == [16, 24] and inside["image_id"] == cat_id


def test_ablate_composes_with_the_maps_and_the_test(why, lm, cat, cat_id):
    from headscope.engine.faithfulness import faithfulness
    from headscope.engine.relevance import relevance

    x = pixels(lm, cat)
    body = rel(why, cat_id, method="chefer", target=BOX, ablate="3:2, 0:1")
    assert body["ablated"] == [[0, 1], [3, 2]] and body["ablate"] == "0:1,3:2" and body["cached"] is False
    want = relevance(lm, x[None], BOX, ["chefer"], ablate=((0, 1), (3, 2)))[0]
    np.testing.assert_allclose(grid_of(body), want.maps["chefer"].numpy(), rtol=1e-4, atol=1e-7)
    plain = grid_of(rel(why, cat_id, method="chefer", target=BOX))
    assert np.abs(grid_of(body) - plain).max() > 1e-4  # the removed heads change the map
    assert rel(why, cat_id, method="attention", target=BOX, ablate="0:1,3:2")["cached"] is True
    test = faith(why, cat_id, methods="chefer", target=BOX, fractions="0,0.5", ablate="0:1,3:2")
    assert test["ablated"] == [[0, 1], [3, 2]]
    res = faithfulness(lm, x, {"chefer": tensor_of(body)}, BOX, [0, 0.5], ablate=((0, 1), (3, 2)))
    np.testing.assert_allclose(test["methods"]["chefer"]["positive"], res.methods["chefer"].positive, rtol=1e-4)
    np.testing.assert_allclose(test["methods"]["chefer"]["negative"], res.methods["chefer"].negative, rtol=1e-4)


@pytest.mark.thorough
def test_faithfulness_equals_the_engine_in_the_requested_order(why, lm, cat, cat_id):
    from headscope.engine.faithfulness import faithfulness

    x = pixels(lm, cat)
    methods = ["attention", "chefer", "random"]
    body = faith(why, cat_id, methods=",".join(methods), target=BOX, fractions="0,0.3,0.6")
    assert list(body["methods"]) == methods and list(body["method_text"]) == methods
    assert body["fractions"] == [0, 0.3, 0.6] and body["target"] == BOX and body["cached"] is False
    assert body["num_patches"] == 384 and body["grid"] == [16, 24] and body["seed"] == 0
    # the server's own maps (relevance answers, checked against the engine above) ranked the patches
    maps = {m: tensor_of(rel(why, cat_id, method=m, target=BOX)) for m in methods}
    want = faithfulness(lm, x, maps, BOX, [0, 0.3, 0.6])
    assert body["forwards"] == want.forwards and body["y"] == pytest.approx(want.y, rel=1e-5)
    for m in methods:
        got, ref = body["methods"][m], want.methods[m]
        np.testing.assert_allclose(got["positive"], ref.positive, rtol=1e-4)
        np.testing.assert_allclose(got["negative"], ref.negative, rtol=1e-4)
        assert got["auc_positive"] == pytest.approx(ref.auc_positive, rel=1e-4)
        assert got["auc_negative"] == pytest.approx(ref.auc_negative, rel=1e-4)
        assert got["removed"] == [0, 115, 230] and got["positive"][0] == 1.0
    # the same test spelt otherwise (order, duplicates, digits): one computation, the request's order
    again = faith(
        why, cat_id, methods="random,chefer,attention,chefer", target="box: 40,30,200,150", fractions="0.0,0.30,0.6"
    )
    assert again["cached"] is True and list(again["methods"]) == ["random", "chefer", "attention"]
    assert again["methods"]["chefer"] == body["methods"]["chefer"]
    # the seed is part of the test only where the random map is
    assert faith(why, cat_id, methods="chefer,attention", target=BOX, fractions="0,0.3", seed=5)["cached"] is False
    assert faith(why, cat_id, methods="chefer,attention", target=BOX, fractions="0,0.3", seed=9)["cached"] is True
    assert faith(why, cat_id, methods="chefer,random", target=BOX, fractions="0,0.3", seed=5)["cached"] is False
    assert faith(why, cat_id, methods="chefer,random", target=BOX, fractions="0,0.3", seed=9)["cached"] is False


def test_progress_and_wait(why, samples, pace):
    image_id = post(why, fresh_photo(samples["rocket"], 3), "rocket.png", layers="-1")["image_id"]
    q = dict(methods="chefer,random", target="box:0,0,100,100", fractions="0,0.2,0.4,0.6")
    progress = f"{API}/{image_id}/faithfulness/progress"
    assert get(why, progress, **q).json()["state"] == "idle"
    r = get(why, f"{API}/{image_id}/faithfulness", wait=0, **q)
    assert r.status_code == 202 and r.headers["retry-after"] == "1", r.text
    assert r.json()["task"] == "faithfulness" and r.json()["state"] == "running"
    seen: list[float] = []

    def done() -> dict | None:
        p = get(why, progress, **q).json()
        if p["state"] == "done":
            return p
        assert p["state"] == "running" and p["task"] == "faithfulness"
        seen.append(p["fraction"])
        return None

    p = wait_until(done, pace.s(60), "the faithfulness test to finish")
    assert p["state"] == "done", p
    assert seen == sorted(seen)
    r = get(why, f"{API}/{image_id}/faithfulness", wait=0, **q)
    assert r.status_code == 200 and r.json()["cached"] is True
    assert list(r.json()["methods"]) == ["chefer", "random"] and len(r.json()["fractions"]) == 4


def test_every_bad_parameter_is_a_4xx_in_the_one_error_shape(why, cat_id):
    unknown = "0123456789abcdef01234567"
    for path in ("relevance", "faithfulness", "faithfulness/progress"):
        assert_error(get(why, f"{API}/{unknown}/{path}"), 404, "image_not_found")
        assert_error(get(why, f"{API}/not-hex/{path}"), 422, "invalid_image_id")
        assert_error(get(why, f"{API}/{cat_id}/{path}", colour="red"), 422, "invalid_parameter")
        assert_error(get(why, f"{API}/{cat_id}/{path}", model="nope"), 404, "unknown_model")
        assert_error(get(why, f"{API}/{cat_id}/{path}", seed=-1), 422, "invalid_parameter")
        assert_error(get(why, f"{API}/{cat_id}/{path}", ablate="12:0"), 422, "bad_ablate")
        for target in (
            "top",
            "class:3",
            "embedding",
            "box:1,2",
            "box:5,5,5,9",
            "box:0,0,337,10",
            "nonsense",
            "x" * 5000,
        ):
            if target == "box:0,0,337,10" and path.endswith("progress"):
                continue  # progress checks a box's spelling only: it does not decode the picture
            r = get(why, f"{API}/{cat_id}/{path}", target=target)
            assert_error(r, 422, "bad_target")  # a long one too: the engine's bound (the field has no max_length)
        assert "output, box:X0,Y0,X1,Y1" in get(why, f"{API}/{cat_id}/{path}", target="top").json()["error"]["message"]
    rel_path = f"{API}/{cat_id}/relevance"
    for method in ("magic", "chefer,random", " x", "lrp"):  # the engine's code and words, as in Python and methods=
        assert_error(get(why, rel_path, method=method), 422, "bad_method")
    assert rel(why, cat_id, method="")["method"] == "chefer"  # blank: the default, as every blank parameter
    assert rel(why, cat_id, method="Chefer")["method"] == "chefer"  # any case, as in Python
    assert_error(get(why, rel_path, format="xml"), 422, "invalid_parameter")
    assert_error(get(why, rel_path, methods="chefer"), 422, "invalid_parameter")  # that is …/faithfulness's
    for path in ("faithfulness", "faithfulness/progress"):
        test_path = f"{API}/{cat_id}/{path}"
        for methods in ("magic", ",", "chefer,,random"):  # a blank one is the default, as every blank parameter
            assert_error(get(why, test_path, methods=methods), 422, "bad_method")
        for fractions in ("0.5,0.2", "0,0.5,0.5", "1", "0,1.5", "-0.1", "nan", "abc", ",".join(["0.1"] * 3)):
            assert_error(get(why, test_path, fractions=fractions), 422, "bad_fractions")
        assert_error(get(why, test_path, fractions=",".join(f"{i / 100:g}" for i in range(51))), 422, "bad_fractions")
        assert_error(get(why, test_path, method="chefer"), 422, "invalid_parameter")  # that is …/relevance's
    assert_error(get(why, f"{API}/{cat_id}/faithfulness", wait=-1), 422, "invalid_parameter")
    assert_error(get(why, f"{API}/{cat_id}/faithfulness", wait=4000), 422, "invalid_parameter")
    assert_error(get(why, f"{API}/{cat_id}/faithfulness/progress", wait=1), 422, "invalid_parameter")
    assert rel(why, cat_id)["target"] == "output"  # and the server goes on serving


def test_a_classifier_explains_its_top_class_or_any_class(why, clf_lm, samples):
    from headscope.engine.faithfulness import faithfulness
    from headscope.engine.relevance import relevance

    data = fresh_photo(samples["astronaut"], 4)
    image_id = post(why, data, "astronaut.png", model=CLF, layers="-1")["image_id"]
    x = pixels(clf_lm, data)
    want = relevance(clf_lm, x[None], None, ["chefer"])[0]
    body = rel(why, image_id, model=CLF)
    assert body["kind"] == "classes" and body["target"] == "top" and body["class_index"] == want.class_index
    assert body["class_label"] and body["class_label"] != f"class {want.class_index}"  # ImageNet's name
    np.testing.assert_allclose(grid_of(body), want.maps["chefer"].numpy(), rtol=1e-4, atol=1e-7)
    assert body["y"] == pytest.approx(want.y, rel=1e-5)
    five = rel(why, image_id, model=CLF, target="class:5")
    assert five["target"] == "class:5" and five["class_index"] == 5 and five["cached"] is False
    assert five["y"] == pytest.approx(relevance(clf_lm, x[None], "class:5", ["random"])[0].y, rel=1e-5)
    r = get(why, f"{API}/{image_id}/relevance", model=CLF, target="output")
    assert_error(r, 422, "bad_target")
    assert "top, class:N" in r.json()["error"]["message"]
    assert_error(get(why, f"{API}/{image_id}/relevance", model=CLF, target="class:1000"), 422, "bad_target")
    test = faith(why, image_id, model=CLF, methods="chefer,random", target="class:5", fractions="0,0.5")
    res = faithfulness(clf_lm, x, {"chefer": tensor_of(five)}, "class:5", [0, 0.5])
    assert test["class_index"] == 5
    np.testing.assert_allclose(test["methods"]["chefer"]["positive"], res.methods["chefer"].positive, rtol=1e-4)


def test_windowed_models_are_refused_with_the_reason(why, samples):
    image_id = post(why, fresh_photo(samples["cat"], 5), "cat.png", model=SWIN_V1, layers="0", query="patch:0,0")[
        "image_id"
    ]
    for path in ("relevance", "faithfulness", "faithfulness/progress"):
        r = get(why, f"{API}/{image_id}/{path}", model=SWIN_V1)
        assert_error(r, 422, "relevance_unsupported")
        assert "windowed" in r.json()["error"]["message"] and "Swin" in r.json()["error"]["message"]
    from headscope.engine.relevance import METHODS

    for method in METHODS:  # every method, the LRP ones included (issue #40)
        assert_error(
            get(why, f"{API}/{image_id}/relevance", model=SWIN_V1, method=method), 422, "relevance_unsupported"
        )
        r = get(why, f"{API}/{image_id}/faithfulness", model=SWIN_V1, methods=method)
        assert_error(r, 422, "relevance_unsupported")
    # zero-shot: the missing text tower is the reason (it answered relevance_unsupported)
    r = get(why, f"{API}/{image_id}/zero-shot", model=SWIN_V1, labels="a cat")
    assert_error(r, 422, "bad_text")
    assert "has no text tower" in r.json()["error"]["message"]
    # a POST with the default layers=all (four stages): refused, and the refusal names the kept picture
    r = httpx.post(
        why + API,
        files={"image": ("cat.png", fresh_photo(samples["cat"], 6), "application/octet-stream")},
        data={"model": SWIN_V1},
        timeout=HTTP_TIMEOUT,
    )
    assert_error(r, 422, "layers_span_stages")
    kept = re.search(r"the picture is kept as image ([0-9a-f]{24})", r.json()["error"]["message"])
    assert kept, r.json()
    again = get(why, f"{API}/{kept.group(1)}", model=SWIN_V1, layers="2-3", query="patch:0,0")
    assert again.status_code == 200, again.text


def test_the_papers_protocol_is_a_named_choice(why, clf_lm, samples):
    """protocol=paper equals the engine's paper protocol; it is its own cache entry; a saliency
    model refuses it (422 bad_protocol: it scores top-1 hits), an unknown protocol is 422."""
    from headscope.engine.faithfulness import faithfulness

    data = fresh_photo(samples["cat"], 41)
    image_id = post(why, data, "cat.png", model=CLF, layers="-1")["image_id"]
    x = pixels(clf_lm, data)
    maps = {"chefer": tensor_of(rel(why, image_id, model=CLF))}
    live = faith(why, image_id, model=CLF, methods="chefer", fractions="0,0.3,0.6")
    paper = faith(why, image_id, model=CLF, methods="chefer", fractions="0,0.3,0.6", protocol="paper")
    assert live["protocol"] == "live" and live["score"] == "probability"
    assert paper["protocol"] == "paper" and paper["score"] == "top1" and paper["score0"] == 1.0
    want = faithfulness(clf_lm, x, maps, "top", [0, 0.3, 0.6], protocol="paper")
    got = paper["methods"]["chefer"]
    assert got["positive"] == want.methods["chefer"].positive and set(got["positive"]) <= {0.0, 1.0}
    assert got["auc_positive"] == pytest.approx(want.methods["chefer"].auc_positive)
    assert got["removed"] == [0, int(0.3 * x.shape[-2] * x.shape[-1]), int(0.6 * x.shape[-2] * x.shape[-1])]
    saliency_id = post(why, fresh_photo(samples["cat"], 42), "cat.png", layers="-1")["image_id"]
    r = get(why, f"{API}/{saliency_id}/faithfulness", protocol="paper")
    assert_error(r, 422, "bad_protocol")
    assert "class target" in r.json()["error"]["message"]
    # parsed by the engine, as the Python API parses it: any other spelling is bad_protocol (before,
    # the query's Literal answered invalid_parameter), empty is the default
    for other in ("ours", "Paper", "papr", " paper"):
        r = get(why, f"{API}/{image_id}/faithfulness", model=CLF, protocol=other)
        assert_error(r, 422, "bad_protocol")
        assert "use live (the default) or paper" in r.json()["error"]["message"]
        progress = get(why, f"{API}/{image_id}/faithfulness/progress", model=CLF, protocol=other)
        assert_error(progress, 422, "bad_protocol")
    empty = faith(why, image_id, model=CLF, methods="chefer", fractions="0,0.3,0.6", protocol="")
    assert empty["protocol"] == "live" and empty["cached"] is True  # the default's cached answer


def test_chefer2021_takes_a_start_layer_of_its_own(why, clf_lm, samples):
    """start_layer: the engine's map for that start, echoed and said in method_text, its own cache
    entry (maps and test); outside 0..L-1 or without chefer2021: 422 bad_start_layer. Before, the
    API had no such parameter (invalid_parameter) and the engine answered 6 or 100 with
    autograd's error and wrapped -1."""
    from headscope.engine.relevance import relevance

    data = fresh_photo(samples["astronaut"], 44)
    image_id = post(why, data, "astronaut.png", model=CLF, layers="-1")["image_id"]
    x = pixels(clf_lm, data)
    L = clf_lm.num_layers
    zero = rel(why, image_id, model=CLF, method="chefer2021", start_layer=0)
    want = relevance(clf_lm, x[None], None, ["chefer2021"], chefer2021_start=0)[0].maps["chefer2021"]
    np.testing.assert_allclose(grid_of(zero), want.numpy(), rtol=1e-4, atol=1e-6)
    assert zero["start_layer"] == 0 and "rolled out from layer 0 (start_layer=0" in zero["method_text"]
    default = rel(why, image_id, model=CLF, method="chefer2021")
    assert default["start_layer"] == 1 and default["cached"] is False  # not start 0's cached maps
    assert not np.array_equal(grid_of(default), grid_of(zero))
    assert rel(why, image_id, model=CLF, method="chefer2021", start_layer=1)["cached"] is True  # the default's
    assert rel(why, image_id, model=CLF, method="chefer2021", start_layer=0)["cached"] is True
    assert rel(why, image_id, model=CLF)["start_layer"] is None
    path = f"{API}/{image_id}/relevance"
    for bad in (L, 100, -1, -100):
        r = get(why, path, model=CLF, method="chefer2021", start_layer=bad)
        assert_error(r, 422, "bad_start_layer")
        assert f"0..{L - 1}" in r.json()["error"]["message"]
    assert_error(get(why, path, model=CLF, method="chefer", start_layer=0), 422, "bad_start_layer")
    assert_error(get(why, path, model=CLF, method="chefer2021", start_layer="one"), 422, "invalid_parameter")
    test0 = faith(why, image_id, model=CLF, methods="chefer2021,random", fractions="0,0.5", start_layer=0)
    test1 = faith(why, image_id, model=CLF, methods="chefer2021,random", fractions="0,0.5")
    assert (test0["start_layer"], test1["start_layer"], test1["cached"]) == (0, 1, False)
    assert "from layer 0" in test0["method_text"]["chefer2021"] and "from layer 1" in test1["method_text"]["chefer2021"]
    again = faith(why, image_id, model=CLF, methods="random,chefer2021", fractions="0,0.5", start_layer=0)
    assert again["cached"] is True and again["start_layer"] == 0 and list(again["methods"]) == ["random", "chefer2021"]
    assert "from layer 0" in again["method_text"]["chefer2021"]
    for path in ("faithfulness", "faithfulness/progress"):
        test_path = f"{API}/{image_id}/{path}"
        assert_error(get(why, test_path, model=CLF, methods="chefer,random", start_layer=1), 422, "bad_start_layer")
        assert_error(get(why, test_path, model=CLF, methods="chefer2021", start_layer=L), 422, "bad_start_layer")


def test_the_lrp_methods_are_served_and_tested_on_demand(why, clf_lm, samples):
    """method=chefer2021 and method=attnlrp equal the engine's maps (each its own forward under
    its rules, computed only when asked for), and the faithfulness test takes them by name."""
    from headscope.engine.relevance import relevance

    data = fresh_photo(samples["astronaut"], 43)
    image_id = post(why, data, "astronaut.png", model=CLF, layers="-1")["image_id"]
    x = pixels(clf_lm, data)
    want = relevance(clf_lm, x[None], None, ["chefer2021", "attnlrp"])[0]
    for method in ("chefer2021", "attnlrp"):
        body = rel(why, image_id, model=CLF, method=method)
        assert body["method"] == method and "Achtibat" in body["method_text"] or "CVPR 2021" in body["method_text"]
        np.testing.assert_allclose(grid_of(body), want.maps[method].numpy(), rtol=1e-4, atol=1e-6)
    test = faith(why, image_id, model=CLF, methods="chefer2021,attnlrp,random", fractions="0,0.5")
    assert list(test["methods"]) == ["chefer2021", "attnlrp", "random"]
