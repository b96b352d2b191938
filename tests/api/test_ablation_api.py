"""Model output, head ablation and head importance against the real server."""

from __future__ import annotations

import io
import json
import threading
from functools import partial

import httpx
import numpy as np
import pytest
from safetensors.numpy import load as st_load

from helpers import api
from helpers.api import API, assert_error
from helpers.models import write_classifier
from helpers.server import HTTP_TIMEOUT
from helpers.waiting import wait_until

# How long a long computation may run before a test calls it hung: long_get asks up to 20 times,
# each a request and a wait on its progress; only a broken server comes near it.
HANG_S = 40 * HTTP_TIMEOUT

T = 600  # generous: these tests must pass on a loaded machine
post = partial(api.post_json, timeout=T)  # a POST that must succeed: its JSON
get = partial(api.get, timeout=T)

BAD_ABLATE = ["x", "3", "12:0", "0:6", "-13:0", "0:1,0:1", "0:1,", "1:2:3"]


def long_get(base, image_id: str, what: str, **params) -> dict:
    """GET …/importance or …/pruning. Under heavy load the request can time out (504) while the
    computation goes on and is cached: then wait on …/progress and ask again."""
    for _ in range(20):
        r = get(base, f"{API}/{image_id}/{what}", **params)
        if r.status_code == 200:
            return r.json()
        assert_error(r, 504, "timeout")
        wait_until(
            lambda: get(base, f"{API}/{image_id}/{what}/progress", **params).json()["state"] != "running",
            HANG_S,
            f"{what} to finish",
        )
    raise AssertionError(f"{what} never finished")


@pytest.fixture(scope="module")
def cat_id(base_url, samples):
    return post(base_url, samples["cat"].read_bytes(), "cat.png")["image_id"]


def saliency(base, image_id, **params) -> tuple[dict, np.ndarray]:
    r = get(base, f"{API}/{image_id}/output", **params)
    assert r.status_code == 200, r.text
    body = r.json()
    return body, np.asarray(body["output"], np.float32)


def test_the_default_model_outputs_saliency_at_its_input_size(base_url, cat_id):
    body, sal = saliency(base_url, cat_id)
    assert body["kind"] == "saliency" and body["model"] == "dinov2-s14-focus"
    assert body["input_size"] == [224, 336] and body["image_size"] == [300, 451]
    assert sal.shape == (224, 336) and sal.min() >= 0 and sal.max() <= 1 and sal.max() - sal.min() > 0.5
    assert body["ablated"] == [] and body["change"] is None and body["metric"] == "mean_abs_diff"
    models = httpx.get(base_url + "/api/v1/models").json()["models"]
    assert models[0]["output"] == "saliency"


def test_ablated_output_and_its_change(base_url, cat_id):
    _, base = saliency(base_url, cat_id)
    body, sal = saliency(base_url, cat_id, ablate="11:0, 3:2")
    assert body["ablated"] == [[3, 2], [11, 0]] and body["ablate"] == "3:2,11:0"
    ch = body["change"]
    assert ch["metric"] == "mean_abs_diff"
    assert ch["mean_abs_diff"] == pytest.approx(float(np.abs(sal - base).mean()), rel=1e-4)
    assert ch["max_abs_diff"] == pytest.approx(float(np.abs(sal - base).max()), rel=1e-4)
    assert ch["mean_abs_diff"] > 1e-3
    # the same set in another order is the same cache entry
    again, sal2 = saliency(base_url, cat_id, ablate="3:2,11:0")
    assert again["cached"] is True
    np.testing.assert_array_equal(sal2, sal)


def test_output_as_npy_and_safetensors(base_url, cat_id):
    _, base = saliency(base_url, cat_id)
    _, ablated = saliency(base_url, cat_id, ablate="0:0")
    r = get(base_url, f"{API}/{cat_id}/output", format="npy", ablate="0:0")
    assert r.status_code == 200 and r.headers["content-type"] == "application/octet-stream"
    np.testing.assert_array_equal(np.load(io.BytesIO(r.content)), ablated)
    meta = json.loads(r.headers["x-headscope-meta"])
    assert meta["kind"] == "saliency" and meta["ablated"] == [[0, 0]] and meta["change"]["mean_abs_diff"] > 0
    r = get(base_url, f"{API}/{cat_id}/output", format="safetensors", ablate="0:0")
    assert r.status_code == 200
    tensors = st_load(r.content)
    np.testing.assert_array_equal(tensors["output"], ablated)
    np.testing.assert_array_equal(tensors["baseline"], base)
    from safetensors import safe_open

    path = f"/tmp/headscope-test-{cat_id}.safetensors"
    with open(path, "wb") as f:
        f.write(r.content)
    with safe_open(path, "np") as f:
        assert json.loads(f.metadata()["headscope"])["ablate"] == "0:0"


def test_attention_with_ablate_changes_only_later_layers_and_is_cached_per_set(base_url, samples):
    data = samples["coffee"].read_bytes()
    plain = post(base_url, data, "coffee.png")
    image_id = plain["image_id"]
    abl = post(base_url, data, "coffee.png", ablate="3:1,3:0")
    assert abl["ablated"] == [[3, 0], [3, 1]] and plain["ablated"] == []
    a, b = np.asarray(plain["attention"]), np.asarray(abl["attention"])
    np.testing.assert_allclose(b[:4], a[:4], atol=1e-6)  # blocks 0..3's maps cannot change
    assert np.abs(b[4:] - a[4:]).max() > 1e-4  # later blocks see the ablated residual stream
    again = get(base_url, f"{API}/{image_id}", ablate="3:0,3:1").json()
    assert again["cached"] is True and again["ablated"] == [[3, 0], [3, 1]]
    np.testing.assert_array_equal(np.asarray(again["attention"]), b)
    other = get(base_url, f"{API}/{image_id}", ablate="5:5").json()
    assert other["cached"] is False and other["ablated"] == [[5, 5]]
    unablated = get(base_url, f"{API}/{image_id}").json()
    assert unablated["cached"] is True
    np.testing.assert_array_equal(np.asarray(unablated["attention"]), a)
    st = get(base_url, f"{API}/{image_id}/stats", ablate="3:0,3:1")
    assert st.status_code == 200 and st.json()["ablated"] == [[3, 0], [3, 1]]
    plain_st = get(base_url, f"{API}/{image_id}/stats").json()
    assert st.json()["entropy"][2] == plain_st["entropy"][2] and st.json()["entropy"][11] != plain_st["entropy"][11]


def test_explain_takes_ablate_and_shows_the_removed_head_zeroed_before_w_o(base_url, cat_id):
    """…/explain of the ablated model: later layers' rows are the ablated maps' rows; in the
    ablated block the head still computes o_h, and W_O receives zeros in its place."""
    spec = "3:0,3:4"

    def explain(**params) -> dict:
        r = get(base_url, f"{API}/{cat_id}/explain", **params)
        assert r.status_code == 200, r.text
        return r.json()

    later = explain(layer=6, head=2, ablate=spec)
    assert later["ablated"] == [[3, 0], [3, 4]]
    row = get(base_url, f"{API}/{cat_id}", layers="6", heads="2", query="cls", ablate=spec).json()
    np.testing.assert_allclose(later["attention"], np.asarray(row["attention"])[0, 0, 0], atol=1e-6)
    plain = explain(layer=6, head=2)
    assert plain["ablated"] == [] and np.abs(np.subtract(later["attention"], plain["attention"])).max() > 1e-4

    own = explain(layer=3, head=4, ablate=spec)
    d = own["head_dim"]
    x = np.asarray(own["proj_input"])
    assert not x[0:d].any() and not x[4 * d : 5 * d].any() and x[d : 2 * d].any()
    contrib = np.asarray(own["head_contributions"])
    assert not contrib[0].any() and not contrib[4].any()
    np.testing.assert_allclose(contrib.sum(0) + np.asarray(own["proj_bias"]), own["attn_output"], atol=1e-4)
    # block 3's own attention is untouched by removing its heads: o_h is what the head computed
    unablated = explain(layer=3, head=4)
    np.testing.assert_allclose(own["attention"], unablated["attention"], atol=1e-6)
    np.testing.assert_allclose(own["head_output"], unablated["head_output"], atol=1e-5)
    assert np.abs(own["head_output"]).max() > 0


@pytest.mark.parametrize("spec", BAD_ABLATE)
def test_bad_ablate_is_422_on_every_endpoint_that_takes_it(base_url, cat_id, samples, spec):
    r = httpx.post(
        base_url + API,
        files={"image": ("cat.png", samples["cat"].read_bytes(), "image/png")},
        data={"ablate": spec},
        timeout=T,
    )
    assert_error(r, 422, "bad_ablate")
    for path in (f"{API}/{cat_id}", f"{API}/{cat_id}/stats", f"{API}/{cat_id}/output", f"{API}/{cat_id}/explain"):
        assert_error(get(base_url, path, ablate=spec), 422, "bad_ablate")
    assert get(base_url, f"{API}/{cat_id}/output", ablate="0:1").status_code == 200


@pytest.mark.thorough
def test_importance_by_ablation_equals_the_output_change_of_each_head(base_url, cat_id):
    body = long_get(base_url, cat_id, "importance")
    assert (body["method"], body["metric"], body["kind"], body["layers"], body["heads"]) == (
        "ablation",
        "mean_abs_diff",
        "saliency",
        12,
        6,
    )
    imp = np.asarray(body["importance"])
    assert imp.shape == (12, 6) and (imp > 0).all()
    for layer, head in [(0, 1), (11, 0), (6, 3)]:
        out, _ = saliency(base_url, cat_id, ablate=f"{layer}:{head}")
        assert imp[layer, head] == pytest.approx(out["change"]["mean_abs_diff"], rel=1e-4, abs=1e-6)
    again = get(base_url, f"{API}/{cat_id}/importance").json()
    assert again["cached"] is True and again["importance"] == body["importance"]
    prog = get(base_url, f"{API}/{cat_id}/importance/progress").json()
    assert prog["state"] == "done" and prog["fraction"] == 1.0


def test_importance_by_gradient(base_url, cat_id):
    body = long_get(base_url, cat_id, "importance", method="gradient")
    assert body["method"] == "gradient" and "cross-entropy" in body["loss"]
    g = np.asarray(body["importance"])
    assert g.shape == (12, 6) and (g >= 0).all() and g.max() > 0


@pytest.mark.thorough
def test_pruning_curve(base_url, cat_id):
    body = long_get(base_url, cat_id, "pruning", points=13)
    assert body["method"] == "ablation" and body["heads_total"] == 72
    assert body["removed"][0] == 0 and body["removed"][-1] == 72 and len(body["removed"]) == 13
    order = [tuple(p) for p in body["order"]]
    assert sorted(order) == [(la, h) for la in range(12) for h in range(6)]
    imp = np.asarray(long_get(base_url, cat_id, "importance")["importance"])
    vals = [imp[la, h] for la, h in order]
    assert vals == sorted(vals)  # least important first
    assert body["change"][0] == 0
    k = body["removed"][3]
    out, _ = saliency(base_url, cat_id, ablate=",".join(f"{la}:{h}" for la, h in order[:k]))
    assert body["change"][3] == pytest.approx(out["change"]["mean_abs_diff"], rel=1e-4, abs=1e-6)
    assert get(base_url, f"{API}/{cat_id}/pruning/progress", points=13).json()["state"] == "done"


@pytest.mark.sweeps  # its own picture's sweep, reused by no other test: `make test-long`
def test_progress_is_reported_and_uploads_interleave_with_a_sweep(base_url, samples):
    image_id = post(base_url, samples["rocket"].read_bytes(), "rocket.jpg")["image_id"]
    assert get(base_url, f"{API}/{image_id}/importance/progress").json()["state"] == "idle"
    result: dict = {}
    t = threading.Thread(target=lambda: result.update(body=long_get(base_url, image_id, "importance")))
    t.start()
    seen = []
    upload_done_while_running = None

    def watch() -> bool:
        """One look at the progress while the sweep runs; True once its request is answered."""
        nonlocal upload_done_while_running
        p = get(base_url, f"{API}/{image_id}/importance/progress").json()
        seen.append(p)
        if p["state"] == "running" and 0 < p["fraction"] < 0.5 and upload_done_while_running is None:
            # an upload posted now is answered between two pieces of the sweep
            post(base_url, samples["astronaut"].read_bytes(), "astronaut.png", layers="-1")
            after = get(base_url, f"{API}/{image_id}/importance/progress").json()
            upload_done_while_running = after["state"] == "running"
        return not t.is_alive()

    try:
        wait_until(watch, HANG_S, "the importance request to be answered")
    finally:
        t.join()
    running = [p for p in seen if p["state"] == "running"]
    assert running, seen
    fractions = [p["fraction"] for p in running]
    assert fractions == sorted(fractions) and all(0 <= f <= 1 for f in fractions)
    assert {"done", "total", "eta_s", "stage", "elapsed_s"} <= set(running[-1])
    assert upload_done_while_running is True
    assert np.asarray(result["body"]["importance"]).shape == (12, 6)


def test_wait_answers_202_with_the_progress_and_the_computation_goes_on(base_url, samples):
    image_id = post(base_url, samples["astronaut"].read_bytes(), "astronaut.png", layers="0")["image_id"]
    r = get(base_url, f"{API}/{image_id}/importance", method="gradient", wait=0)
    if r.status_code == 202:  # (a very fast machine could finish the gradient within the call)
        p = r.json()
        assert p["state"] == "running" and p["task"] == "importance" and r.headers["retry-after"] == "1"
        wait_until(
            lambda: (
                get(base_url, f"{API}/{image_id}/importance/progress", method="gradient").json()["state"] != "running"
            ),
            HANG_S,
            "the gradient importance to finish",
        )
    r = get(base_url, f"{API}/{image_id}/importance", method="gradient", wait=0)
    assert r.status_code == 200 and r.json()["method"] == "gradient"
    assert get(base_url, f"{API}/{image_id}/importance/progress", method="gradient").json()["state"] == "done"
    r = get(base_url, f"{API}/{image_id}/pruning", method="gradient", wait=0, points=4)
    assert r.status_code in (200, 202)
    if r.status_code == 202:
        assert r.json()["task"] == "pruning"
    body = long_get(base_url, image_id, "pruning", method="gradient", points=4)
    assert body["method"] == "gradient" and len(body["removed"]) == 4


def test_a_pruning_curve_left_with_202_runs_to_the_end_on_its_own(base_url):
    """One GET with wait=0, then only its progress: the curve (its importance ranking first) runs
    on to `done` without another GET, and every progress answer's numbers agree."""
    image_id = post(base_url, api.fresh_png(seed=4242), "fresh.png", layers="0")["image_id"]
    params = {"method": "gradient", "points": 4}
    r = get(base_url, f"{API}/{image_id}/pruning", wait=0, **params)
    assert r.status_code in (200, 202), r.text
    seen = [r.json()] if r.status_code == 202 else []

    def finished() -> bool:
        p = get(base_url, f"{API}/{image_id}/pruning/progress", **params).json()
        seen.append(p)
        assert p["state"] != "idle", seen  # the curve stopped once its ranking was done
        return p["state"] == "done"

    wait_until(finished, HANG_S, "the pruning curve to finish with nobody asking again")
    for p in seen[:-1]:
        assert p["state"] == "running" and p["task"] == "pruning", p
        assert p["fraction"] == pytest.approx(p["done"] / p["total"], abs=1e-3), p
    body = get(base_url, f"{API}/{image_id}/pruning", **params).json()
    assert body["cached"] is True and len(body["removed"]) == 4


def test_an_over_long_ablate_is_a_bad_ablate(base_url, cat_id):
    r = get(base_url, f"{API}/{cat_id}/output", ablate="0:1," * 1100)
    assert_error(r, 422, "bad_ablate")
    assert "too long" in r.json()["error"]["message"]


def test_unknown_images_and_bad_parameters(base_url, cat_id):
    unknown = "0123456789abcdef01234567"
    for path in ("output", "importance", "importance/progress", "pruning", "pruning/progress"):
        assert_error(get(base_url, f"{API}/{unknown}/{path}"), 404, "image_not_found")
    assert_error(get(base_url, f"{API}/{cat_id}/importance", method="magic"), 422)
    assert_error(get(base_url, f"{API}/{cat_id}/pruning", points=1), 422)
    assert_error(get(base_url, f"{API}/{cat_id}/importance", wait=-1), 422)
    assert_error(get(base_url, f"{API}/{cat_id}/output", format="xml"), 422)
    assert_error(get(base_url, f"{API}/not-hex/output"), 422, "invalid_image_id")
    assert_error(get(base_url, f"{API}/{cat_id}/output", model="nope"), 404, "unknown_model")


# -- classifiers and models with neither -----------------------------------------------------
@pytest.fixture(scope="module")
def other_models(server_factory_module, tmp_path_factory):
    clf = write_classifier(tmp_path_factory.mktemp("w") / "vit_head.safetensors")
    srv = server_factory_module({"HEADSCOPE_EXTRA_MODELS": json.dumps([clf, "random:test_vit"])})
    return srv.url, "local:test_vit@vit_head.safetensors", "random:test_vit"


@pytest.fixture(scope="module")
def server_factory_module():
    from helpers.server import Server

    started = []

    def make(env=None):
        srv = Server(env)
        started.append(srv)
        return srv

    yield make
    for srv in started:
        assert srv.stop() == 0
        assert "Traceback" not in srv.log()


def test_a_classifier_shows_imagenet_classes(other_models, samples):
    url, clf, _ = other_models
    image_id = post(url, samples["cat"].read_bytes(), "cat.png", model=clf)["image_id"]
    info = {m["id"]: m for m in httpx.get(url + "/api/v1/models").json()["models"]}
    assert info[clf]["output"] == "classes"
    body = get(url, f"{API}/{image_id}/output", model=clf).json()
    assert body["kind"] == "classes" and body["metric"] == "top1_logprob_drop"
    out = body["output"]
    probs = np.asarray(out["probabilities"])
    assert probs.shape == (1000,) and probs.sum() == pytest.approx(1.0, abs=1e-4)
    top5 = out["top5"]
    assert [c["index"] for c in top5] == list(np.argsort(-probs)[:5])
    assert all(c["label"] and c["description"] for c in top5)
    from timm.data import ImageNetInfo

    assert top5[0]["description"] == ImageNetInfo().index_to_description(top5[0]["index"])
    abl = get(url, f"{API}/{image_id}/output", model=clf, ablate="0:0,0:1,1:0").json()
    ch = abl["change"]
    assert ch["top1_before"]["index"] == top5[0]["index"] and ch["kl"] > 0
    p_after = np.asarray(abl["output"]["probabilities"])
    assert ch["top1_logprob_drop"] == pytest.approx(
        float(np.log(probs[top5[0]["index"]]) - np.log(p_after[top5[0]["index"]])), rel=1e-3, abs=1e-5
    )
    npy = get(url, f"{API}/{image_id}/output", model=clf, format="npy")
    np.testing.assert_allclose(np.load(io.BytesIO(npy.content)), probs, rtol=1e-6, atol=1e-9)
    imp = long_get(url, image_id, "importance", model=clf)
    assert imp["metric"] == "top1_logprob_drop" and np.asarray(imp["kl"]).shape == np.asarray(imp["importance"]).shape
    layer, head = 0, 1
    one = get(url, f"{API}/{image_id}/output", model=clf, ablate=f"{layer}:{head}").json()["change"]
    assert imp["importance"][layer][head] == pytest.approx(one["top1_logprob_drop"], rel=1e-3, abs=1e-5)
    assert imp["kl"][layer][head] == pytest.approx(one["kl"], rel=1e-3, abs=1e-6)
    grad = long_get(url, image_id, "importance", model=clf, method="gradient")
    assert "top class" in grad["loss"]


def test_a_model_with_neither_shows_its_embedding_norm(other_models, samples):
    url, _, emb = other_models
    image_id = post(url, samples["astronaut"].read_bytes(), "astronaut.png", model=emb)["image_id"]
    body = get(url, f"{API}/{image_id}/output", model=emb).json()
    assert body["kind"] == "embedding" and body["metric"] == "relative_l2"
    out = body["output"]
    e = np.asarray(out["embedding"])
    assert out["dim"] == e.size and out["norm"] == pytest.approx(float(np.linalg.norm(e)), rel=1e-5)
    abl = get(url, f"{API}/{image_id}/output", model=emb, ablate="0:0").json()
    ch = abl["change"]
    e2 = np.asarray(abl["output"]["embedding"])
    assert ch["norm_before"] == pytest.approx(out["norm"], rel=1e-6)
    assert ch["norm_after"] == pytest.approx(float(np.linalg.norm(e2)), rel=1e-5)
    assert ch["relative_l2"] == pytest.approx(float(np.linalg.norm(e2 - e) / np.linalg.norm(e)), rel=1e-4)
    curve = long_get(url, image_id, "pruning", model=emb)
    assert curve["heads_total"] == len(curve["order"]) and curve["change"][0] == 0
