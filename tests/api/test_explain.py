"""GET .../explain and the softmax temperature, against a real server on loopback."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest
from safetensors.numpy import load as st_load

from helpers.api import API, assert_error, post
from helpers.server import HTTP_TIMEOUT as TIMEOUT


def get(base, image_id: str, path: str = "", **params) -> httpx.Response:
    return httpx.get(f"{base}{API}/{image_id}{path}", params=params, timeout=TIMEOUT)


def explain(base, image_id: str, **params) -> httpx.Response:
    return get(base, image_id, "/explain", **params)


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def check_consistent(b: dict) -> None:
    """The fields of one explain answer agree with each other and with their shapes."""
    N, H, d, D = b["tokens"]["count"], b["num_heads"], b["head_dim"], b["embed_dim"]
    arr = {k: np.asarray(b[k], np.float64) for k in ("q", "k", "v", "dot", "scores", "attention")}
    assert arr["q"].shape == (d,) and arr["k"].shape == arr["v"].shape == (N, d)
    assert b["key_tokens"] == list(range(N)) and len(b["scores"]) == N
    np.testing.assert_allclose(softmax(arr["scores"]), arr["attention"], atol=1e-6)
    np.testing.assert_allclose(arr["k"] @ arr["q"], arr["dot"], atol=1e-4, rtol=1e-5)
    bias = np.asarray(b["bias"]) if b["bias"] is not None else 0.0
    np.testing.assert_allclose(b["scale"] * arr["dot"] + bias, arr["scores"], atol=1e-4, rtol=1e-5)
    np.testing.assert_allclose(arr["attention"] @ arr["v"], b["head_output"], atol=1e-5, rtol=1e-5)
    hc = np.asarray(b["head_contributions"], np.float64)
    assert hc.shape == (H, D) and len(b["proj_input"]) == H * d
    np.testing.assert_allclose(hc.sum(0) + np.asarray(b["proj_bias"]), b["attn_output"], atol=1e-4, rtol=1e-5)
    if not b["steps"]["inner_norm"]:
        h = b["head"]
        np.testing.assert_allclose(b["proj_input"][h * d : (h + 1) * d], b["head_output"], atol=1e-5, rtol=1e-5)


@pytest.fixture(scope="module")
def cat(samples):
    return samples["cat"].read_bytes()


@pytest.fixture(scope="module")
def cat_id(base_url, cat):
    r = post(base_url, cat, layers="-1")
    assert r.status_code == 200, r.text
    return r.json()["image_id"]


def test_explain_answers_from_the_cache_with_every_field(base_url, cat_id):
    r = explain(base_url, cat_id, layer=11, head=2, query="patch:3,5")
    assert r.status_code == 200, r.text
    assert "compute;dur=0.00" in r.headers["server-timing"]  # no forward pass
    b = r.json()
    assert b["cached"] is True and b["image_id"] == cat_id and b["model"] == "dinov2-s14-focus"
    assert (b["layer"], b["head"], b["query"]) == (11, 2, 1 + 3 * 24 + 5)
    assert (b["head_dim"], b["num_heads"], b["embed_dim"], b["num_layers"]) == (64, 6, 384, 12)
    assert b["scale"] == pytest.approx(0.125)
    assert b["tokens"]["grid"] == [16, 24] and b["tokens"]["count"] == 385
    assert b["bias"] is None and b["steps"]["rope"] is False and b["steps"]["absolute_pos"] is True
    assert b["shapes"]["x"] == [385, 384] and b["shapes"]["w_q"] == [384, 64] and b["shapes"]["w_o"] == [384, 384]
    check_consistent(b)
    # the softmax row is the row the attention endpoint serves
    row = get(base_url, cat_id, layers=11, heads=2, query="patch:3,5").json()["attention"][0][0][0]
    np.testing.assert_allclose(b["attention"], row, atol=1e-7)


def test_explain_defaults_and_query_forms(base_url, cat_id):
    b = explain(base_url, cat_id).json()
    assert (b["layer"], b["head"], b["query"]) == (11, 0, 0)  # last layer, head 0, CLS
    assert explain(base_url, cat_id, query="cls", layer=-12, head=-1).json()[("layer")] == 0
    assert explain(base_url, cat_id, query="17").json()["query"] == 17
    assert explain(base_url, cat_id, query="patch:-1,-1").json()["query"] == 384


def test_explain_safetensors_holds_the_same_tensors(base_url, cat_id):
    js = explain(base_url, cat_id, layer=4, head=1, query=40).json()
    r = explain(base_url, cat_id, layer=4, head=1, query=40, format="safetensors")
    assert r.status_code == 200 and r.headers["content-type"] == "application/octet-stream"
    tensors = st_load(r.content)
    for name in ("q", "k", "v", "scores", "attention", "head_output", "head_contributions", "attn_output"):
        np.testing.assert_array_equal(tensors[name], np.asarray(js[name], np.float32))
    assert "bias" not in tensors and "x-headscope-meta" not in r.headers  # in the file, not a header
    header_len = int.from_bytes(r.content[:8], "little")
    meta = json.loads(json.loads(r.content[8 : 8 + header_len])["__metadata__"]["headscope"])
    assert (meta["layer"], meta["head"], meta["query"], meta["head_dim"]) == (4, 1, 40, 64)


@pytest.mark.parametrize(
    "params,status,code",
    [
        ({"layer": "12"}, 422, "bad_selection"),
        ({"layer": "-13"}, 422, "bad_selection"),
        ({"head": "6"}, 422, "bad_selection"),
        ({"layer": "x"}, 422, "invalid_parameter"),
        ({"head": "1.5"}, 422, "invalid_parameter"),
        ({"query": "all"}, 422, "bad_selection"),
        ({"query": "0,1"}, 422, "bad_selection"),
        ({"query": "patch:16,0"}, 422, "bad_selection"),
        ({"query": "patch:1,2;3,4"}, 422, "bad_selection"),
        ({"query": "9999"}, 422, "bad_selection"),
        ({"format": "npy"}, 422, "invalid_parameter"),
        ({"model": "nope"}, 404, "unknown_model"),
        ({"bogus": "1"}, 422, "invalid_parameter"),
    ],
)
def test_explain_bad_parameters(base_url, cat_id, params, status, code):
    assert_error(explain(base_url, cat_id, **params), status, code)


@pytest.mark.parametrize("query", ["register", "all", "0,1", "box:0,0,2,2"])
def test_explain_refuses_what_is_not_one_token_with_its_own_advice(base_url, cat_id, query):
    """Not the general query advice ("use cls, all, token indices ..."), which explain refuses next."""
    r = explain(base_url, cat_id, query=query)
    assert_error(r, 422, "bad_selection")
    message = r.json()["error"]["message"]
    assert message == f"query: explain takes one query token ('cls', a token index or 'patch:R,C'); got {query!r}"


def test_explain_unknown_or_evicted_image(base_url, server_factory, samples):
    assert_error(explain(base_url, "0" * 24), 404, "image_not_found")
    assert_error(explain(base_url, "not-hex!"), 422, "invalid_image_id")
    # A cache that holds about one capture: the first image (its capture, then its upload) is
    # gone once two more came; until then an evicted capture is recomputed from the upload.
    srv = server_factory({"HEADSCOPE_CACHE_BYTES": str(40 * 2**20)})
    first = post(srv.url, samples["cat"].read_bytes()).json()["image_id"]
    assert explain(srv.url, first).json()["cached"] is True
    for name in ("coffee", "astronaut"):
        assert post(srv.url, samples[name].read_bytes()).status_code == 200
    assert_error(explain(srv.url, first), 404, "image_not_found")
    assert httpx.get(srv.url + "/healthz").status_code == 200


# -- temperature ---------------------------------------------------------------------------
def test_temperature_tempers_every_served_map(base_url, cat, cat_id):
    b = explain(base_url, cat_id, layer=7, head=3, query="patch:8,12").json()
    scores = np.asarray(b["scores"], np.float64)
    for T in (0.25, 2.0, 7.5):
        got = post(base_url, cat, layers=7, heads=3, query="patch:8,12", temperature=T).json()
        assert got["temperature"] == T
        np.testing.assert_allclose(got["attention"][0][0][0], softmax(scores / T), atol=2e-6)
        again = get(base_url, cat_id, layers=7, heads=3, query="patch:8,12", temperature=T).json()
        np.testing.assert_allclose(again["attention"], got["attention"], atol=0)
    plain = get(base_url, cat_id, layers=7, heads=3, query="patch:8,12").json()
    assert plain["temperature"] == 1.0
    np.testing.assert_allclose(plain["attention"][0][0][0], b["attention"], atol=1e-7)
    # safetensors answers state it in their metadata too
    r = get(base_url, cat_id, layers=7, format="npy", temperature=0.5)
    assert json.loads(r.headers["x-headscope-meta"])["temperature"] == 0.5


def test_temperature_composes_with_drop_rollout_and_every_row(base_url, cat_id):
    b = explain(base_url, cat_id, layer=10, head=0).json()
    scores = np.asarray(b["scores"], np.float64)
    # dropping key tokens = a softmax over the others, at the same temperature
    got = get(base_url, cat_id, layers=10, heads=0, drop="prefix", temperature=2).json()
    row = np.asarray(got["attention"][0][0][0])
    assert row[0] == 0
    np.testing.assert_allclose(row[1:], softmax(scores[1:] / 2), atol=2e-6)
    # every row (a materialised capture keeps T=1 maps; other temperatures are recomputed)
    full = get(base_url, cat_id, layers=10, heads=0, query="all", temperature=0.5).json()
    np.testing.assert_allclose(full["attention"][0][0][0], softmax(scores / 0.5), atol=2e-6)
    np.testing.assert_allclose(np.asarray(full["attention"]).sum(-1), 1, atol=1e-5)
    # rollout of the tempered maps: rows still sum to 1 and differ from the model's own
    hot = get(base_url, cat_id, aggregate="rollout", layers="all", temperature=4).json()
    cold = get(base_url, cat_id, aggregate="rollout", layers="all").json()
    assert hot["temperature"] == 4 and cold["temperature"] == 1
    h, c = np.asarray(hot["attention"]), np.asarray(cold["attention"])
    np.testing.assert_allclose(h.sum(-1), 1, atol=1e-5)
    assert np.abs(h - c).max() > 1e-3


# A blank `temperature=` is the default, T = 1 (test_api_as_documented.py), as every blank parameter.
BAD_TEMPERATURES = ["0", "-1", "-0.5", "nan", "NaN", "inf", "-inf", "Infinity", "abc", "1e999", "1_0"]


@pytest.mark.parametrize("value", BAD_TEMPERATURES)
def test_bad_temperatures_are_refused_by_post_and_get(base_url, cat, cat_id, value):
    assert_error(post(base_url, cat, temperature=value), 422, "invalid_parameter")
    assert_error(get(base_url, cat_id, temperature=value), 422, "invalid_parameter")


def test_extreme_but_valid_temperatures(base_url, cat_id):
    b = explain(base_url, cat_id, layer=3, head=5).json()
    cold = get(base_url, cat_id, layers=3, heads=5, temperature="1e-30").json()["attention"][0][0][0]
    assert np.isfinite(cold).all() and int(np.argmax(cold)) == int(np.argmax(b["scores"])) and max(cold) == 1
    hot = get(base_url, cat_id, layers=3, heads=5, temperature="1e30").json()["attention"][0][0][0]
    np.testing.assert_allclose(hot, 1 / len(hot), atol=1e-7)


# -- other families: no CLS, registers, RoPE, relative bias ----------------------------------
FAMILY_MODELS = {
    "random:vit_base_patch16_siglip_224": dict(prefix=[], rope=False, bias=False),
    "random:vit_small_patch14_reg4_dinov2": dict(prefix=["cls", "reg", "reg", "reg", "reg"], rope=False, bias=False),
    "random:eva02_tiny_patch14_224": dict(prefix=["cls"], rope=True, bias=False),
    "random:beit_base_patch16_224": dict(prefix=["cls"], rope=False, bias=True),
}


@pytest.fixture(scope="module")
def family_server(server_factory_module):
    return server_factory_module({"HEADSCOPE_EXTRA_MODELS": json.dumps(list(FAMILY_MODELS))})


@pytest.fixture(scope="module")
def server_factory_module():
    from helpers.server import Server

    started: list[Server] = []

    def make(env=None) -> Server:
        srv = Server(env)
        started.append(srv)
        return srv

    yield make
    for srv in started:
        srv.stop()
        assert "Traceback" not in srv.log()


@pytest.mark.parametrize("model", list(FAMILY_MODELS))
def test_explain_for_every_family(family_server, samples, model):
    want = FAMILY_MODELS[model]
    data = samples["astronaut"].read_bytes()
    first = post(family_server.url, data, model=model, layers=-1, query=0)  # SigLIP has no CLS row
    assert first.status_code == 200, first.text
    image_id = first.json()["image_id"]
    b = explain(family_server.url, image_id, model=model, layer=-1, head=1).json()
    assert [p["kind"] for p in b["tokens"]["prefix"]] == want["prefix"]
    # default query: the CLS token, or the first patch without one
    assert b["query"] == (0 if "cls" in want["prefix"] else b["tokens"]["num_prefix"])
    assert b["steps"]["rope"] is want["rope"] and b["steps"]["relative_bias"] is want["bias"]
    assert (b["bias"] is not None) is want["bias"]
    check_consistent(b)
    row = get(family_server.url, image_id, model=model, layers=-1, heads=1, query=str(b["query"])).json()
    np.testing.assert_allclose(b["attention"], row["attention"][0][0][0], atol=1e-7)
    # a patch query and temperature on the same model
    p = explain(family_server.url, image_id, model=model, query="patch:2,3").json()
    check_consistent(p)
    hot = get(family_server.url, image_id, model=model, layers=-1, heads=0, query="patch:2,3", temperature=3).json()
    np.testing.assert_allclose(hot["attention"][0][0][0], softmax(np.asarray(p["scores"], np.float64) / 3), atol=2e-6)
