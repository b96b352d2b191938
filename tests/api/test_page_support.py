"""What the page relies on from the API, against a real server: binary answers named for what
they hold (the page's download links carry the same names), and statistics that a leaving
client stops without harm (the page cancels them when a new image comes)."""

from __future__ import annotations

import httpx
import pytest

from helpers.api import API, fresh_png, image_id


def test_binary_answers_are_named_for_what_they_hold(base_url, samples):
    data = samples["cat"].read_bytes()
    r = httpx.post(base_url + API, files={"image": ("cat.png", data)}, data={"layers": "11", "heads": "0"}, timeout=120)
    assert r.status_code == 200, r.text
    iid = r.json()["image_id"]
    stem = f"headscope-{iid[:12]}-dinov2-s14-focus"
    cases = [
        ({"query": "patch:3,5", "format": "safetensors"}, f"{stem}-patch_3_5.safetensors"),
        ({"query": "all", "format": "safetensors", "layers": "11"}, f"{stem}-all-L11.safetensors"),
        ({"layers": "2-4", "heads": "0,1", "drop": "prefix", "format": "npy"}, f"{stem}-cls-L2-4-H0_1-drop-prefix.npy"),
        ({"aggregate": "rollout", "dtype": "float16", "format": "npy"}, f"{stem}-cls-rollout-float16.npy"),
    ]
    for params, name in cases:
        r = httpx.get(f"{base_url}{API}/{iid}", params=params, timeout=120)
        assert r.status_code == 200, r.text
        assert r.headers["content-disposition"] == f'attachment; filename="{name}"'
    # JSON answers are read by programs, not saved: no Content-Disposition.
    r = httpx.get(f"{base_url}{API}/{iid}", params={"layers": "11", "heads": "0"}, timeout=120)
    assert "content-disposition" not in r.headers


def test_statistics_survive_a_client_that_leaves(base_url):
    data = fresh_png(18)
    r = httpx.post(base_url + API, files={"image": ("x.png", data)}, data={"layers": "11", "heads": "0"}, timeout=120)
    assert r.status_code == 200, r.text
    url = f"{base_url}{API}/{image_id(data)}/stats"
    # The client gives up long before the statistics can be done: the server stops them.
    with pytest.raises(httpx.TimeoutException):
        httpx.get(url, timeout=0.05)
    # Nothing half-done is kept: asked again, they are complete, and the server keeps serving.
    r = httpx.get(url, timeout=300)
    assert r.status_code == 200, r.text
    st = r.json()
    assert st["layers"] == 12 and st["heads"] == 6 and len(st["entropy"]) == 12 and len(st["rank"]["numerical"]) == 12
