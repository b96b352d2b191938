"""Swin v1/v2 through a real server: exact rows per stage, the stage rules, stats, models.

The server offers Swin models by configuration only (``HEADSCOPE_EXTRA_MODELS``): random
weights (``random:``) and a ``local:`` checkpoint of random weights written here. Rows are
compared with an independent windowing of each block's own weights (tests/helpers/swin_reference.py)
run in this process on the same model and the same prepared pixels.
"""

from __future__ import annotations

import io
import json
import math
from functools import partial

import httpx
import numpy as np
import pytest
import torch
from safetensors.numpy import load as st_load

from helpers import api
from helpers.api import API
from helpers.server import ROOT
from helpers.swin_reference import SWIN_ARCH as ARCH
from helpers.swin_reference import SWIN_V1 as V1
from helpers.swin_reference import SWIN_V2 as V2
from helpers.swin_reference import reference_explain, reference_maps

TIMEOUT = 180


@pytest.fixture(scope="module")
def checkpoint(swin_checkpoint):
    """The classifier checkpoint of random weights (1000-class head included) the server offers."""
    return swin_checkpoint


post = partial(api.post, timeout=TIMEOUT)  # the Swin models' first forwards take long on a loaded machine


def get(base, image_id, **params):
    return httpx.get(f"{base}{API}/{image_id}", params=params, timeout=TIMEOUT)


def error(r: httpx.Response, code: str) -> str:
    assert r.status_code == 422, r.text
    body = r.json()
    assert set(body) == {"error"} and body["error"]["code"] == code, body
    assert "Traceback" not in r.text
    return body["error"]["message"]


def safetensors_of(r: httpx.Response) -> tuple[np.ndarray, dict]:
    assert r.status_code == 200, r.text
    header_len = int.from_bytes(r.content[:8], "little")
    meta = json.loads(json.loads(r.content[8 : 8 + header_len])["__metadata__"]["headscope"])
    return st_load(r.content)["attention"], meta


def local_model(model_id: str, checkpoint):
    """The model the server builds for ``model_id``, built the same way in this process."""
    from headscope.zoo.ids import ModelSpec
    from headscope.zoo.loaders import build

    spec = ModelSpec.parse(f"local:{ARCH}@{checkpoint}" if model_id == "local" else model_id)
    return build(spec, ROOT / "models")


def probe_cells(grid: tuple[int, int]) -> list[tuple[int, int]]:
    """Corners (whose shifted windows wrap round), an edge cell, the centre."""
    gh, gw = grid
    return [(0, 0), (gh - 1, gw - 1), (0, gw - 1), (gh - 1, 0), (gh // 2, gw // 2), (gh - 2, 3 % gw)]


@pytest.mark.parametrize("which", [V1, V2, "local"], ids=["v1-random", "v2-random", "v1-local"])
def test_rows_of_every_stage_equal_an_independent_windowing(swin_server, samples, checkpoint, which):
    from headscope.config import Settings
    from headscope.serving.pictures import Pictures

    model_id = which if which != "local" else f"local:{ARCH}@{checkpoint.name}"
    data = samples["cat"].read_bytes()  # 451 x 300: a wide grid, padding on the last stage
    lm = local_model(which, checkpoint)
    prep = Pictures.for_model(lm, Settings()).prepare(data)
    layout = lm.layout(prep.input_size)
    queries = {}
    for s in layout.stages:
        cells = [r * s.grid[1] + c for r, c in probe_cells(s.grid)]
        for layer in s.layers:
            queries[layer] = cells
    ref = reference_maps(lm.model, prep.pixels[None], "v2" if "v2" in which else "v1", queries)

    first = layout.stages[0]
    r = post(swin_server.url, data, model=model_id, layers=f"{first.first_layer}-{first.last_layer}", query="patch:0,0")
    assert r.status_code == 200, r.text
    b = r.json()
    image_id = b["image_id"]
    assert b["input_size"] == list(prep.input_size) and b["model"] == model_id
    assert b["tokens"] == {
        "count": first.grid[0] * first.grid[1],
        "num_prefix": 0,
        "prefix": [],
        "grid": list(first.grid),
        "patch_size": list(first.cell_size),
        "stage": 0,
        "window": list(first.window),
    }
    assert b["stages"] == layout.as_dict()
    want = np.stack([ref[layer][0, :, 0].numpy() for layer in first.layers])  # query (0, 0): the first probe
    np.testing.assert_allclose(np.array(b["attention"])[:, :, 0], want, atol=2e-6)
    padded = shifted = 0
    for s in layout.stages:
        cells = probe_cells(s.grid)
        spec = ";".join(f"{r},{c}" for r, c in cells)
        arr, meta = safetensors_of(
            get(
                swin_server.url,
                image_id,
                model=model_id,
                layers=f"{s.first_layer}-{s.last_layer}",
                query=f"patch:{spec}",
                format="safetensors",
            )
        )
        n = s.grid[0] * s.grid[1]
        assert arr.shape == (len(s.layers), s.heads, len(cells), n)
        assert meta["tokens"]["stage"] == s.index and meta["query"] == queries[s.first_layer]
        assert meta["cached"] is True
        for i, layer in enumerate(s.layers):
            np.testing.assert_allclose(arr[i], ref[layer][0].numpy(), atol=2e-6, rtol=1e-5)
            shifted += any(s.shift_of(layer))
        padded += s.grid[0] % s.window[0] != 0 or s.grid[1] % s.window[1] != 0
    assert shifted and padded


def test_models_list_stages_before_and_after_loading(swin_server, samples):
    before = {m["id"]: m for m in httpx.get(swin_server.url + "/api/v1/models", timeout=30).json()["models"]}
    assert before["dinov2-s14-focus"]["windowed"] is False
    assert before[V2]["windowed"] is True  # known from the name: nothing loaded it yet
    post(swin_server.url, samples["astronaut"].read_bytes(), model=V1, layers="0", query="0")
    m = {m["id"]: m for m in httpx.get(swin_server.url + "/api/v1/models", timeout=30).json()["models"]}[V1]
    assert m["loaded"] and m["windowed"] and m["layers"] == 12 and m["heads"] == 24
    assert m["prefix_tokens"] == [] and m["input_size"] == [224, 224] and m["patch_size"] == [4, 4]
    assert [(s["layers"], s["heads"], s["grid"], s["window"]) for s in m["stages"]] == [
        ([0, 1], 3, [56, 56], [7, 7]),
        ([2, 3], 6, [28, 28], [7, 7]),
        ([4, 9], 12, [14, 14], [7, 7]),
        ([10, 11], 24, [7, 7], [7, 7]),
    ]
    assert m["stages"][0]["shifts"] == [[0, 0], [3, 3]] and m["stages"][3]["shifts"] == [[0, 0], [0, 0]]


def test_stage_rules_are_422s_that_say_what_to_ask(swin_server, samples):
    url = swin_server.url
    data = samples["coffee"].read_bytes()
    msg = error(post(url, data, model=V1, query="patch:1,1"), "layers_span_stages")  # layers=all by default
    assert "stage 0 = layers 0-1" in msg and "stage 3 = layers 10-11" in msg and "24 heads" in msg
    image_id = post(url, data, model=V1, layers="0", query="0").json()["image_id"]
    assert "no CLS token" in error(get(url, image_id, model=V1, layers="2", query="cls"), "bad_selection")
    # No query: cell 0 of the stage (it was the same "no CLS token" refusal).
    plain = get(url, image_id, model=V1, layers="2")
    assert plain.status_code == 200 and plain.json()["query"] == [0], plain.text[:300]
    error(get(url, image_id, model=V1, layers="1-2", query="0"), "layers_span_stages")
    assert "outside the 28 x 42 grid" in error(
        get(url, image_id, model=V1, layers="2", query="patch:28,0"), "bad_selection"
    )
    assert "for 6 heads" in error(get(url, image_id, model=V1, layers="3", heads="6", query="0"), "bad_selection")
    msg = error(
        get(url, image_id, model=V1, layers="4-9", query="0", aggregate="rollout", rollout_start=0),
        "layers_span_stages",
    )
    assert "rollout_start=4" in msg
    # left out, the rollout starts at the stage's first layer (it was 0 here, refused; extract's start)
    alone = get(url, image_id, model=V1, layers="4-9", query="0", aggregate="rollout").json()
    four = get(url, image_id, model=V1, layers="4-9", query="0", aggregate="rollout", rollout_start=4).json()
    assert alone["attention"] == four["attention"] and alone["shape"] == [6, 1, 1, 294]
    assert "last stage" in error(get(url, image_id, model=V1, layers="2", query="0", drop="artifacts"), "bad_selection")
    msg = error(get(url, image_id, model=V1, layers="0", query="all"), "bad_selection")  # 4704 x 4704 maps
    assert "at most 2048 cells (stages 1, 2, 3 here)" in msg
    # Too large for JSON: the advice names only what this model takes (query=cls: Swin has no CLS token)
    r = get(url, image_id, model=V1, layers="2-3", query="all")
    assert r.status_code == 413 and r.json()["error"]["code"] == "answer_too_large", r.text
    advice = r.json()["error"]["message"]
    assert "query=patch:R,C" in advice and "query=cls" not in advice, advice
    # What does work: head fusion, drop on the last stage, every row of a stage, npy.
    b = get(url, image_id, model=V1, layers="10-11", query="patch:0,0;6,10", aggregate="mean").json()
    assert b["shape"] == [2, 1, 2, 77] and b["heads"] == ["mean"]
    b = get(url, image_id, model=V1, layers="-1", query="0", drop="prefix,artifacts").json()
    assert b["shape"] == [1, 24, 1, 77]
    r = get(url, image_id, model=V1, layers="11", query="all", format="npy")
    arr = np.load(io.BytesIO(r.content), allow_pickle=False)
    assert arr.shape == (1, 24, 77, 77)
    # The header's short metadata leaves its largest fields out, naming them (the JSON answer has them).
    meta = json.loads(r.headers["x-headscope-meta"])
    assert meta["stages"][3]["grid"] == [7, 11] if "stages" in meta else "stages" in meta["omitted"]
    assert "Traceback" not in swin_server.log()


def test_rollout_within_a_stage_and_stats(swin_server, samples):
    from headscope.config import Settings
    from headscope.serving.pictures import Pictures

    url = swin_server.url
    data = samples["rocket"].read_bytes()
    lm = local_model(V1, None)
    prep = Pictures.for_model(lm, Settings()).prepare(data)
    layout = lm.layout(prep.input_size)
    s1, s3 = layout.stages[1], layout.stages[3]
    n1, n3 = s1.grid[0] * s1.grid[1], s3.grid[0] * s3.grid[1]
    queries = {layer: [0] for layer in range(12)} | {2: list(range(n1)), 3: list(range(n1))}
    queries |= {10: list(range(n3)), 11: list(range(n3))}
    ref = reference_maps(lm.model, prep.pixels[None], "v1", queries)

    image_id = post(url, data, model=V1, layers="10-11", query="0").json()["image_id"]
    b = get(url, image_id, model=V1, layers="10-11", query="patch:3,5", aggregate="rollout", rollout_start=10).json()
    assert b["shape"] == [2, 1, 1, n3]
    q = 3 * s3.grid[1] + 5
    R = torch.eye(n3)
    want = []
    for layer in (10, 11):
        A = ref[layer][0].mean(0)  # heads fused by the mean
        A = 0.5 * A + 0.5 * torch.eye(n3)
        R = (A / A.sum(-1, keepdim=True)) @ R
        want.append(R[q])
    np.testing.assert_allclose(np.array(b["attention"])[:, 0, 0], torch.stack(want).numpy(), atol=1e-5)

    st = httpx.get(f"{url}{API}/{image_id}/stats", params={"model": V1}, timeout=TIMEOUT).json()
    assert st["layers"] == 12 and st["heads_per_layer"] == [3, 3, 6, 6, 12, 12, 12, 12, 12, 12, 24, 24]
    assert [len(e) for e in st["entropy"]] == st["heads_per_layer"] == [len(d) for d in st["distance_px"]]
    assert [len(m) for m in st["similarity"]] == st["heads_per_layer"]
    for k in ("prefix_mass", "artifact_mass", "entropy_cls", "cls_cosine", "mass_patches"):
        assert st[k] is None and st["unavailable"][k]
    assert "rollout" in st["unavailable"] and st["tokens"]["grid"] == list(layout.stages[0].grid)
    assert st["stages"] == layout.as_dict() and st["artifacts"]["stage"] == 3
    # Entropy over the window: stage 1's grid is whole windows, so it is the row's entropy / log 49.
    assert s1.grid[0] % 7 == 0 and s1.grid[1] % 7 == 0
    for layer in (2, 3):
        a = ref[layer][0]  # H, N, N
        h = -(a * a.clamp_min(1e-12).log()).sum(-1) / math.log(49)
        np.testing.assert_allclose(st["entropy"][layer], h.mean(-1).numpy(), atol=1e-5)


def explain(base, image_id, **params) -> httpx.Response:
    return httpx.get(f"{base}{API}/{image_id}/explain", params=params, timeout=TIMEOUT)


@pytest.mark.parametrize("which", [V1, V2], ids=["v1", "v2"])
def test_explain_keys_are_the_window_with_bias_and_shift_mask(swin_server, samples, which):
    """GET .../explain for Swin: the query's window is the keys; every field against the
    independent windowing of the block's weights, on a shifted block whose window wraps round the
    image and on a block whose window holds padding (the cat's wide grid)."""
    from headscope.config import Settings
    from headscope.serving.pictures import Pictures

    version = "v2" if "v2" in which else "v1"
    data = samples["cat"].read_bytes()
    lm = local_model(which, None)
    prep = Pictures.for_model(lm, Settings()).prepare(data)
    layout = lm.layout(prep.input_size)
    image_id = post(swin_server.url, data, model=which, layers="0", query="0").json()["image_id"]
    s0, last = layout.stages[0], layout.stages[-1]
    gh, gw = s0.grid
    cases = [(1, (gh - 1, gw - 1)), (last.last_layer, (last.grid[0] - 1, last.grid[1] - 1))]
    assert any(s0.shift_of(1)) and last.grid[1] % last.window[1]  # shifted; padded
    for layer, (r, c) in cases:
        s = layout.stage_of(layer)
        head = s.heads - 1
        cell = r * s.grid[1] + c
        got = explain(swin_server.url, image_id, model=which, layer=layer, head=-1, query=f"patch:{r},{c}")
        assert got.status_code == 200, got.text
        b = got.json()
        ref = reference_explain(lm.model, prep.pixels[None], version, layer, head, cell)
        A = s.window[0] * s.window[1]
        assert (b["layer"], b["head"], b["query"], b["stage"]) == (layer, head, cell, s.index)
        assert b["cached"] is True and b["num_heads"] == s.heads and b["tokens"]["grid"] == list(s.grid)
        assert b["key_tokens"] == ref["key_tokens"] and len(b["scores"]) == len(b["k"]) == A
        assert b["key_cells"][b["window"]["query_place"]] == [r, c]
        assert b["window"]["size"] == list(s.window) and b["window"]["shift"] == list(s.shift_of(layer))
        assert b["window"]["padding"] == sum(t < 0 for t in ref["key_tokens"])
        assert b["steps"]["windowed"] and b["steps"]["relative_bias"] and b["steps"]["cosine"] == (version == "v2")
        assert b["shapes"]["k"] == [A, b["head_dim"]]
        for f in ("q", "k", "v", "bias", "scores", "attention", "head_output", "attn_output"):
            np.testing.assert_allclose(np.asarray(b[f]), ref[f].numpy(), atol=5e-5, rtol=1e-4, err_msg=f)
        assert b["scale"] == pytest.approx(ref["scale"], rel=1e-6)
        if any(s.shift_of(layer)):
            np.testing.assert_array_equal(b["mask"], ref["mask"].numpy())
            assert min(b["mask"]) == -100.0  # the corner's window wraps: regions masked apart
        else:
            assert b["mask"] is None and b["steps"]["shift_mask"] is False
        sc = np.asarray(b["scores"], np.float64)
        parts = b["scale"] * np.asarray(b["dot"]) + np.asarray(b["bias"]) + np.asarray(b["mask"] or 0.0)
        np.testing.assert_allclose(parts, sc, atol=1e-4, rtol=1e-5)
        hc = np.asarray(b["head_contributions"], np.float64)
        np.testing.assert_allclose(hc.sum(0) + np.asarray(b["proj_bias"]), b["attn_output"], atol=1e-4, rtol=1e-5)
        # attention = softmax(scores) = the served row's nonzero entries, at T = 1 and at T = 5
        keys = np.asarray(b["key_tokens"])
        real = keys >= 0
        for T in (1.0, 5.0):
            row = get(
                swin_server.url, image_id, model=which, layers=layer, heads=head, query=f"patch:{r},{c}", temperature=T
            ).json()["attention"][0][0][0]
            e = np.exp((sc - sc.max()) / T)
            want = e / e.sum()
            np.testing.assert_allclose(np.asarray(row)[keys[real]], want[real], atol=2e-6, rtol=1e-5)
            assert np.count_nonzero(row) <= real.sum()
            if T == 1.0:
                np.testing.assert_allclose(np.asarray(row)[keys[real]], np.asarray(b["attention"])[real], atol=2e-6)
        if layer == last.last_layer:
            assert not real.all()  # padding: keys with no cell, in the softmax only
            assert sum(np.asarray(row)) < 1 - 1e-6 or np.asarray(b["attention"])[~real].sum() < 1e-6
    # safetensors: the same tensors, the metadata in the file
    r = explain(swin_server.url, image_id, model=which, layer=1, query="patch:0,0", format="safetensors")
    assert r.status_code == 200, r.text
    header_len = int.from_bytes(r.content[:8], "little")
    meta = json.loads(json.loads(r.content[8 : 8 + header_len])["__metadata__"]["headscope"])
    t = st_load(r.content)
    assert t["mask"].shape == t["scores"].shape == (len(meta["key_tokens"]),) and meta["stage"] == 0
    assert t["k"].shape == (s0.window[0] * s0.window[1], meta["head_dim"])


def test_explain_bad_swin_queries_are_422s(swin_server, samples):
    url = swin_server.url
    image_id = post(url, samples["coffee"].read_bytes(), model=V1, layers="0", query="0").json()["image_id"]
    b = explain(url, image_id, model=V1, layer=2).json()
    assert (b["layer"], b["head"], b["query"], b["stage"]) == (2, 0, 0, 1)  # default: cell 0, head 0
    assert "no CLS token" in error(explain(url, image_id, model=V1, query="cls"), "bad_selection")
    assert "outside the 28 x 42 grid" in error(
        explain(url, image_id, model=V1, layer=2, query="patch:28,0"), "bad_selection"
    )
    assert "6 heads" in error(explain(url, image_id, model=V1, layer=3, head=6), "bad_selection")
    assert "one query cell" in error(explain(url, image_id, model=V1, layer=2, query="0,1"), "bad_selection")
    error(explain(url, image_id, model=V1, layer=12), "bad_selection")
    assert "Traceback" not in swin_server.log()
