"""The Python API's numbers are the REST API's: one real server (the default model and one
random-weight model of every family the server tests), the same pictures posted to it and given
to ``headscope``, answers compared number for number. Photos larger than 3x the model's input
(the server's early reduction), list input, PIL and array pictures (the server's image_id of the
PNG bytes), the long computations, and bad arguments (the same message as the API's 422)."""

from __future__ import annotations

import io
import json

import httpx
import numpy as np
import pytest
import torch
from PIL import Image

import headscope
from headscope.python.inputs import pixels_id, png_bytes
from helpers.api import API, get, post
from helpers.server import ROOT, SAMPLES, Server

# One random-weight model per family (the archs the server's own tests use, or the smallest of kin).
FAMILIES = {
    "vit": "random:test_vit",
    "deit": "random:deit_tiny_distilled_patch16_224",  # a distillation token
    "dinov2-reg": "random:vit_small_patch14_reg4_dinov2",  # registers
    "eva": "random:eva02_tiny_patch14_224",  # RoPE
    "beit": "random:beit_base_patch16_224",  # relative position bias
    "siglip": "random:vit_base_patch16_siglip_224",  # no prefix token
    "flexivit": "random:flexivit_small",
    "swin": "random:swin_tiny_patch4_window7_224",  # windows
    "swinv2": "random:swinv2_tiny_window8_256",
}
DEFAULT = "dinov2-s14-focus"
SMALL = "random:test_vit"
# The same computation in two processes: float32 kernels may order sums differently per call.
ATOL = 2e-6


@pytest.fixture(scope="module")
def server():
    srv = Server({"HEADSCOPE_EXTRA_MODELS": json.dumps(list(FAMILIES.values()))})
    yield srv
    srv.stop_cleanly()


_SCOPES: dict[str, headscope.Scope] = {}


def scope_of(model_id: str) -> headscope.Scope:
    if model_id not in _SCOPES:
        _SCOPES[model_id] = headscope.load(model_id, device="cpu", models_dir=ROOT / "models")
    return _SCOPES[model_id]


@pytest.fixture(scope="module")
def photo() -> bytes:
    """A JPEG photo 1800 x 2400: more than 3x every model's input (518 px at most here)."""
    im = Image.open(SAMPLES / "cat.png").convert("RGB").resize((2400, 1800), Image.BICUBIC)
    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=90)
    return buf.getvalue()


def served(srv: Server, data: bytes, model: str, **fields) -> tuple[dict, np.ndarray]:
    r = post(srv.url, data, "photo.jpg", model=model, **fields)
    assert r.status_code == 200, r.text[:300]
    body = r.json()
    return body, np.asarray(body.pop("attention"), dtype=np.float32)


def close(got: torch.Tensor, want: np.ndarray) -> None:
    assert tuple(got.shape) == want.shape
    np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=ATOL)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_family_answers_as_the_api(server, photo, family):
    model = FAMILIES[family]
    windowed = family.startswith("swin")
    by_patch = windowed or family == "siglip"  # no CLS token
    scope = scope_of(model)
    # Swin: a request's layers are within one stage (the last has 2 layers in both); query a patch
    fields = dict(layers="-2,-1", heads="all", query="patch:1,2" if by_patch else "cls", temperature=0.7)
    body, want = served(server, photo, model, **fields)
    att = scope.attention(photo, **fields)
    close(att.maps, want)
    assert att.image_id == body["image_id"] and att.tokens == body["tokens"]
    assert att.layers == body["layers"] and att.heads == body["heads"] and att.query == body["query"]
    assert att.input_size == tuple(body["input_size"]) and att.image_size == tuple(body["image_size"]) == (1800, 2400)
    if by_patch or family == "vit":
        # No query: the CLS row, or the first patch's where there is no CLS token (a 422 "no CLS token" before).
        plain = {k: v for k, v in fields.items() if k != "query"}
        body0, want0 = served(server, photo, model, **plain)
        att0 = scope.attention(photo, **plain)
        close(att0.maps, want0)
        assert body0["query"] == att0.query == [0]  # token 0: the CLS token, or the first patch
        if by_patch:
            _, want_cell = served(server, photo, model, **{**plain, "query": "patch:0,0"})
            np.testing.assert_array_equal(want0, want_cell)

    if att.tokens["count"] <= 1000:  # DINOv2 at 518 px (1800 tokens): statistics take 15 s a side here
        stats = get(server.url, f"{API}/{body['image_id']}/stats", model=model).json()
        df = att.stats()
        heads = stats.get("heads_per_layer") or [stats["heads"]] * stats["layers"]
        assert len(df) == sum(heads)
        for col in ("entropy", "distance_px", "prefix_mass", "mass_patches"):
            if stats[col] is None:
                continue
            api = np.concatenate([np.asarray(row, dtype=np.float64) for row in stats[col]])
            np.testing.assert_allclose(df[col].to_numpy(np.float64), api, rtol=1e-5, atol=1e-6, err_msg=col)

    if windowed:  # every layer: one tensor per stage, each the API's answer for that stage's layers
        every = scope.attention(photo, query="patch:1,2")
        assert isinstance(every.maps, list) and len(every.maps) == len(every.grid) > 1
        first = every.layers[1]
        _, want = served(server, photo, model, query="patch:1,2", layers=f"{first[0]}-{first[-1]}")
        close(every.maps[1], want)


def test_the_default_model_every_query_and_explain(server, samples):
    data = samples["cat"].read_bytes()
    scope = scope_of(DEFAULT)
    fields = dict(layers="0,5,-1", heads="1,3", query="all", drop="prefix", ablate="2:1")
    body, want = served(server, data, DEFAULT, **fields)
    att = scope.attention(data, **fields)
    close(att.maps, want)
    agg = dict(layers="all", query="patch:3,4", aggregate="rollout", head_fusion="max", discard_ratio=0.5)
    _, want = served(server, data, DEFAULT, **agg)
    close(scope.attention(data, **agg).maps, want)

    ex = get(server.url, f"{API}/{body['image_id']}/explain", layer=7, head=2, query="patch:3,5", ablate="2:1")
    assert ex.status_code == 200, ex.text
    ex = ex.json()
    mine = att.explain(7, 2, (3, 5))
    for name in ("q", "k", "v", "scores", "attention", "head_output"):
        np.testing.assert_allclose(mine[name].numpy(), np.asarray(ex[name], dtype=np.float32), rtol=1e-5, atol=1e-5)
    assert {k: mine[k] for k in ("layer", "head", "query", "ablated")} == {
        k: ex[k] for k in ("layer", "head", "query", "ablated")
    }


def test_lists_pil_and_arrays_are_the_servers_pictures(server, photo, samples):
    scope = scope_of(DEFAULT)
    arr = np.asarray(Image.open(samples["coffee"]).convert("RGB"))
    pil = Image.fromarray(arr[::2, ::3])
    many = scope.attention([photo, arr, pil, samples["rocket"]], layers=-1)
    assert len(many) == 4
    for att, data in zip(many, [photo, png_bytes(arr), png_bytes(pil), samples["rocket"].read_bytes()]):
        body, want = served(server, data, DEFAULT, layers=-1)
        close(att.maps, want)
    # paths and bytes: the server's id; images and arrays (no PNG made): the hash of their pixels
    assert [a.image_id for a in many] == [
        served(server, photo, DEFAULT, layers=-1)[0]["image_id"],
        pixels_id(Image.fromarray(arr)),
        pixels_id(pil),
        served(server, samples["rocket"].read_bytes(), DEFAULT, layers=-1)[0]["image_id"],
    ]


def test_output_importance_and_pruning_are_the_apis(server, samples):
    data = samples["astronaut"].read_bytes()
    scope = scope_of(SMALL)
    body, _ = served(server, data, SMALL, layers=0)
    image_id = body["image_id"]

    api = get(server.url, f"{API}/{image_id}/output", model=SMALL, ablate="1:0,3:1").json()
    out = scope.output(data, ablate=[(1, 0), (3, 1)])
    assert out["kind"] == api["kind"] == "embedding" and out["ablated"] == api["ablated"] == [[1, 0], [3, 1]]
    assert out["change"].keys() == api["change"].keys()
    for k, v in api["change"].items():
        assert out["change"][k] == (pytest.approx(v, rel=1e-5, abs=1e-6) if isinstance(v, float) else v), k

    for method in ("ablation", "gradient"):
        api = get(server.url, f"{API}/{image_id}/importance", model=SMALL, method=method).json()
        mine = scope.importance(data, method=method)
        np.testing.assert_allclose(mine["importance"].numpy(), np.asarray(api["importance"]), rtol=1e-4, atol=1e-6)
    api = get(server.url, f"{API}/{image_id}/pruning", model=SMALL, points=4).json()
    mine = scope.pruning(data, points=4)
    assert mine["order"] == api["order"]
    np.testing.assert_allclose(mine["change"].numpy(), np.asarray(api["change"]), rtol=1e-4, atol=1e-6)


# (parameters, what the Python call is): each must fail with the message the API answers.
BAD = [
    ({"layers": "99"}, "attention"),
    ({"layers": "0-"}, "attention"),
    ({"heads": "x"}, "attention"),
    ({"query": "patch:99,0"}, "attention"),
    ({"query": "nonsense"}, "attention"),
    ({"temperature": "0"}, "attention"),
    ({"temperature": "-1"}, "attention"),
    ({"aggregate": "median"}, "attention"),
    ({"drop": "everything"}, "attention"),
    ({"ablate": "99:0"}, "attention"),
    ({"ablate": "0:x"}, "attention"),
    ({"rollout_start": "40", "aggregate": "rollout"}, "attention"),
    ({"discard_ratio": "1"}, "attention"),
    ({"layer": "30"}, "explain"),
    ({"head": "9"}, "explain"),
    ({"query": "patch:0,99"}, "explain"),
    ({"mass": "2"}, "stats"),
    ({"method": "magic"}, "importance"),
]


@pytest.mark.parametrize(("params", "call"), BAD)
def test_bad_arguments_say_what_the_api_says(server, samples, params, call):
    data = samples["cat"].read_bytes()
    scope = scope_of(DEFAULT)
    if call == "attention":
        r = post(server.url, data, "cat.png", **params)
    else:
        image_id = served(server, data, DEFAULT, layers=0)[0]["image_id"]
        path = {"explain": "explain", "stats": "stats", "importance": "importance"}[call]
        r = httpx.get(f"{server.url}{API}/{image_id}/{path}", params=params, timeout=120)
    assert r.status_code == 422, r.text[:300]
    message = r.json()["error"]["message"]
    if call == "attention":  # a POST's refusal adds where its kept picture is; the rest is the same words
        message, kept, _ = message.partition("; the picture is kept as image ")
        assert kept or r.json()["error"]["code"] == "invalid_parameter", r.text  # refused before it was kept
    with pytest.raises(ValueError) as e:
        if call == "attention":
            scope.attention(data, **params)
        elif call == "explain":
            scope.attention(data, layers=0).explain(**{"layer": -1, "head": 0, **params})
        elif call == "stats":
            scope.attention(data, layers=0).stats(mass=float(params["mass"]))
        else:
            scope.importance(data, **params)
    assert str(e.value) == message
