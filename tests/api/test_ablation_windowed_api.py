"""Model output and head ablation for windowed models (Swin), and ablation with temperature.

Windowed models answer their own output (a classifier's classes) but no head ablation: every
endpoint that would remove heads answers 422 ``ablation_unsupported`` in the one error shape
(docs/ablation.md, "Windowed models (Swin)"). Temperature composes with ``ablate``:
the forward of the ablated model runs as the model does (T = 1), and the maps it captures are
shown at T like any other.
"""

from __future__ import annotations

from functools import partial

import httpx
import numpy as np
import pytest
import torch

from helpers import api
from helpers.api import API, assert_error
from helpers.server import ROOT
from helpers.swin_reference import SWIN_ARCH as ARCH
from helpers.swin_reference import SWIN_LOCAL

T = 600  # generous: these tests must pass on a loaded machine
post = partial(api.post_json, timeout=T)  # a POST that must succeed: its JSON
get = partial(api.get, timeout=T)


@pytest.fixture(scope="module")
def checkpoint(swin_checkpoint):
    return swin_checkpoint


@pytest.fixture(scope="module")
def swin(swin_server):
    return swin_server.url, SWIN_LOCAL


def assert_422(r: httpx.Response, code: str) -> str:
    assert_error(r, 422, code)
    return r.json()["error"]["message"]


def test_a_windowed_classifier_shows_its_classes_exactly(swin, checkpoint, samples):
    from headscope.config import Settings
    from headscope.serving.pictures import Pictures
    from headscope.zoo.ids import ModelSpec
    from headscope.zoo.loaders import build

    url, model = swin
    data = samples["cat"].read_bytes()
    image_id = post(url, data, model=model, layers="0", query="0")["image_id"]
    info = {m["id"]: m for m in httpx.get(url + "/api/v1/models", timeout=T).json()["models"]}
    assert info[model]["output"] == "classes" and info[model]["windowed"] is True

    r = get(url, f"{API}/{image_id}/output", model=model)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["kind"] == "classes" and body["ablated"] == [] and body["change"] is None
    probs = np.asarray(body["output"]["probabilities"])
    # Independent: the checkpoint's own timm model, its whole forward on the same pixels.
    lm = build(ModelSpec.parse(f"local:{ARCH}@{checkpoint}"), ROOT / "models")
    prep = Pictures.for_model(lm, Settings()).prepare(data)
    with torch.inference_mode():
        want = torch.softmax(lm.model(prep.pixels[None]).float(), -1)[0].numpy()
    np.testing.assert_allclose(probs, want, atol=1e-5)
    assert [c["index"] for c in body["output"]["top5"]] == list(np.argsort(-want)[:5])


def test_windowed_models_refuse_head_ablation_with_one_clear_422(swin, samples):
    url, model = swin
    data = samples["astronaut"].read_bytes()
    image_id = post(url, data, model=model, layers="0", query="0")["image_id"]
    asks = [
        get(url, f"{API}/{image_id}", model=model, layers="0", query="0", ablate="0:0"),
        get(url, f"{API}/{image_id}/stats", model=model, ablate="0:0"),
        get(url, f"{API}/{image_id}/output", model=model, ablate="0:0"),
        get(url, f"{API}/{image_id}/importance", model=model),
        get(url, f"{API}/{image_id}/importance", model=model, method="gradient"),
        get(url, f"{API}/{image_id}/pruning", model=model),
        get(url, f"{API}/{image_id}/importance/progress", model=model),
        get(url, f"{API}/{image_id}/pruning/progress", model=model),
        httpx.post(
            url + API,
            files={"image": ("img.png", data, "application/octet-stream")},
            data={"model": model, "layers": "0", "query": "0", "ablate": "1:2"},
            timeout=T,
        ),
    ]
    for r in asks:
        msg = assert_422(r, "ablation_unsupported")
        assert "windowed" in msg and "Swin" in msg
    # "no ablation" spelled out is no ablation: answered as usual.
    r = get(url, f"{API}/{image_id}", model=model, layers="0", query="0", ablate="none")
    assert r.status_code == 200 and r.json()["ablated"] == []
    assert get(url, f"{API}/{image_id}/output", model=model, ablate="").status_code == 200


def test_temperature_applies_to_the_ablated_models_maps(base_url, samples):
    """ablate + temperature: the maps of the model with the head removed (its forward at T = 1),
    each row then softmax(scores / T), exactly as without ablation."""
    data = samples["coffee"].read_bytes()
    image_id = post(base_url, data, layers="0", query="cls")["image_id"]

    def maps(**params) -> tuple[np.ndarray, dict]:
        r = get(base_url, f"{API}/{image_id}", layers="3,11", heads="all", query="cls", **params)
        assert r.status_code == 200, r.text
        body = r.json()
        return np.asarray(body["attention"], np.float64), body

    ablated_t1, b1 = maps(ablate="2:1")
    ablated_t2, b2 = maps(ablate="2:1", temperature="2")
    plain_t2, _ = maps(temperature="2")
    assert b2["ablated"] == [[2, 1]] and b2["temperature"] == 2 and b1["temperature"] == 1
    # softmax(s / T) = p^(1/T) / sum p^(1/T): from the ablated T = 1 rows, independently of the server.
    want = ablated_t1 ** (1 / 2)
    want /= want.sum(-1, keepdims=True)
    np.testing.assert_allclose(ablated_t2, want, atol=2e-6)
    # and not the unablated model's tempered maps: the head removed in block 2 changes later blocks
    assert np.abs(ablated_t2 - plain_t2).max() > 1e-4
