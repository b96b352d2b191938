"""The REST API against a real uvicorn server on loopback."""

from __future__ import annotations

import io
import json
import re
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
from PIL import Image
from safetensors.numpy import load as st_load

from helpers.api import API, assert_error, png, post
from helpers.server import HTTP_TIMEOUT, ROOT


@pytest.fixture(scope="module")
def cat(samples):
    return samples["cat"].read_bytes()


@pytest.fixture(scope="module")
def local_model():
    from headscope.zoo.loaders import load_embedded

    return load_embedded(ROOT / "models")


def reference(lm, data: bytes):
    """The same image through the engine in this process, for comparison with the server."""
    from headscope.config import Settings
    from headscope.engine.forward import forward_capture
    from headscope.serving.pictures import Pictures

    prep = Pictures.for_model(lm, Settings()).prepare(data)
    return forward_capture(lm, prep.pixels[None])[0], prep


def test_health_ready_models(base_url):
    assert httpx.get(base_url + "/healthz", timeout=HTTP_TIMEOUT).json() == {"status": "ok"}
    assert httpx.get(base_url + "/readyz", timeout=HTTP_TIMEOUT).status_code == 200
    body = httpx.get(base_url + "/api/v1/models", timeout=HTTP_TIMEOUT).json()
    m = body["models"][0]
    assert body["default"] == m["id"] == "dinov2-s14-focus"
    assert (m["layers"], m["heads"], m["patch_size"], m["input_size"]) == (12, 6, [14, 14], [224, 224])
    assert m["prefix_tokens"] == [{"index": 0, "kind": "cls"}] and m["loaded"] is True


def test_default_post_returns_cls_rows_of_every_layer_and_head(base_url, cat, local_model):
    r = post(base_url, cat, "cat.png")
    assert r.status_code == 200, r.text
    b = r.json()
    assert b["shape"] == [12, 6, 1, 385] and np.array(b["attention"]).shape == (12, 6, 1, 385)
    assert b["tokens"] == {
        "count": 385,
        "num_prefix": 1,
        "prefix": [{"index": 0, "kind": "cls"}],
        "grid": [16, 24],
        "patch_size": [14, 14],
    }
    assert b["image_size"] == [300, 451] and b["input_size"] == [224, 336]
    assert b["layers"] == list(range(12)) and b["heads"] == list(range(6)) and b["query"] == [0]
    assert re.fullmatch(r"[0-9a-f]{24}", b["image_id"]) and b["filename"] == "cat.png"
    assert set(b["timing_ms"]) == {"queue", "compute", "encode"}
    a = np.array(b["attention"], dtype=np.float32)
    np.testing.assert_allclose(a.sum(-1), 1.0, atol=1e-5)
    ref, _ = reference(local_model, cat)
    for layer in range(12):
        np.testing.assert_allclose(a[layer, :, 0], ref.rows(layer, None, [0])[:, 0].numpy(), atol=1e-6)


def test_selection_variants(base_url, cat, local_model):
    ref, _ = reference(local_model, cat)
    r = post(base_url, cat, layers="0,-1", heads="1-2", query="patch:2,3")
    b = r.json()
    assert b["shape"] == [2, 2, 1, 385] and b["layers"] == [0, 11] and b["heads"] == [1, 2]
    assert b["query"] == [1 + 2 * 24 + 3]
    np.testing.assert_allclose(np.array(b["attention"])[1, 0, 0], ref.rows(11, [1], [52])[0, 0].numpy(), atol=1e-6)
    b = post(base_url, cat, layers="5", query="all").json()
    assert b["shape"] == [1, 6, 385, 385]
    np.testing.assert_allclose(np.array(b["attention"], np.float32)[0], ref.rows(5).numpy(), atol=1e-6)
    b = post(base_url, cat, layers="3", query="0,17,200", aggregate="mean").json()
    assert b["shape"] == [1, 1, 3, 385] and b["heads"] == ["mean"]
    np.testing.assert_allclose(
        np.array(b["attention"])[0, 0], ref.rows(3, None, [0, 17, 200]).mean(0).numpy(), atol=1e-6
    )
    b = post(base_url, cat, aggregate="rollout", layers="all").json()
    assert b["shape"] == [12, 1, 1, 385]
    np.testing.assert_allclose(np.array(b["attention"]).sum(-1), 1.0, atol=1e-5)


def test_binary_formats_carry_metadata(base_url, cat):
    r = post(base_url, cat, format="safetensors", layers="0-1", query="all", dtype="float16")
    assert r.status_code == 200 and r.headers["content-type"] == "application/octet-stream"
    tensors = st_load(r.content)
    assert tensors["attention"].shape == (2, 6, 385, 385) and tensors["attention"].dtype == np.float16
    header_len = int.from_bytes(r.content[:8], "little")
    meta = json.loads(json.loads(r.content[8 : 8 + header_len])["__metadata__"]["headscope"])
    assert meta["tokens"]["grid"] == [16, 24] and meta["layers"] == [0, 1] and meta["dtype"] == "float16"
    r = post(base_url, cat, format="npy", layers="-1")
    arr = np.load(io.BytesIO(r.content), allow_pickle=False)
    assert arr.shape == (1, 6, 1, 385) and arr.dtype == np.float32
    meta = json.loads(r.headers["x-headscope-meta"])
    assert meta["shape"] == [1, 6, 1, 385] and meta["image_id"]


def test_cached_follow_up_and_picture(base_url, cat):
    image_id = post(base_url, cat).json()["image_id"]
    r = httpx.get(f"{base_url}{API}/{image_id}", params={"query": "patch:0,0", "layers": "-1"}, timeout=HTTP_TIMEOUT)
    b = r.json()
    assert r.status_code == 200 and b["cached"] is True and b["query"] == [1] and b["shape"] == [1, 6, 1, 385]
    r = httpx.get(f"{base_url}{API}/{image_id}", params={"format": "npy", "heads": "0"}, timeout=HTTP_TIMEOUT)
    assert np.load(io.BytesIO(r.content)).shape == (12, 1, 1, 385)
    pic = httpx.get(f"{base_url}/api/v1/images/{image_id}", timeout=HTTP_TIMEOUT)
    assert pic.headers["content-type"] == "image/png" and Image.open(io.BytesIO(pic.content)).size == (451, 300)
    assert_error(httpx.get(f"{base_url}{API}/{'0' * 24}", timeout=HTTP_TIMEOUT), 404, "image_not_found")
    assert_error(httpx.get(f"{base_url}{API}/not-hex!", timeout=HTTP_TIMEOUT), 422)
    assert_error(
        httpx.get(f"{base_url}{API}/{image_id}", params={"layers": "99"}, timeout=HTTP_TIMEOUT), 422, "bad_selection"
    )
    assert_error(httpx.get(f"{base_url}{API}/{image_id}", params={"bogus": "1"}, timeout=HTTP_TIMEOUT), 422)


@pytest.mark.parametrize(
    "fields,status,code",
    [
        ({"layers": "12"}, 422, "bad_selection"),
        ({"layers": "x"}, 422, "bad_selection"),
        ({"heads": "6"}, 422, "bad_selection"),
        ({"query": "patch:16,0"}, 422, "bad_selection"),
        ({"query": "9999"}, 422, "bad_selection"),
        ({"aggregate": "median"}, 422, "invalid_parameter"),
        ({"format": "xml"}, 422, "invalid_parameter"),
        ({"dtype": "int8"}, 422, "invalid_parameter"),
        ({"model": "nope"}, 404, "unknown_model"),
        ({"model": "timm:vit_base_patch16_224"}, 404, "unknown_model"),  # not configured: never loaded on request
        ({"discard_ratio": "1.5"}, 422, "invalid_parameter"),
        ({"colour": "red"}, 422, "unknown_field"),
        ({"stats": "true", "format": "npy"}, 422, "invalid_parameter"),  # JSON only: refused, not left out
        ({"stats": "true", "format": "safetensors"}, 422, "invalid_parameter"),
    ],
)
def test_bad_parameters(base_url, cat, fields, status, code):
    assert_error(post(base_url, cat, **fields), status, code)


@pytest.mark.parametrize(
    "path, field, said",
    [
        ("", "stats=true&format=npy", "stats: stats=true needs format=json"),  # no pydantic "Value error, "
        ("/stats", "mass=nan", "mass: Input should be a finite number"),  # was "less than or equal to 1"
        ("", "discard_ratio=nan", "discard_ratio: Input should be a finite number"),
        ("/faithfulness", "wait=nan", "wait: Input should be a finite number"),
    ],
)
def test_a_refused_parameter_is_said_in_its_own_words(base_url, cat, path, field, said):
    image_id = post(base_url, cat, layers="-1").json()["image_id"]
    r = httpx.get(f"{base_url}{API}/{image_id}{path}?{field}", timeout=HTTP_TIMEOUT)
    assert_error(r, 422, "invalid_parameter")
    assert r.json()["error"]["message"].startswith(said), r.text


def test_bad_uploads(base_url, cat):
    assert_error(httpx.post(base_url + API, data={"layers": "all"}, timeout=HTTP_TIMEOUT), 415, "not_multipart")
    assert_error(httpx.post(base_url + API, files={"file": ("a.png", cat)}, timeout=HTTP_TIMEOUT), 422, "unknown_field")
    assert_error(httpx.post(base_url + API, files={"image": ("a.png", b"")}, timeout=HTTP_TIMEOUT), 422, "empty_file")
    assert_error(post(base_url, b"just some text\n", "notes.txt"), 415, "not_an_image")
    assert_error(post(base_url, cat[: len(cat) // 3]), 422, "corrupt_image")
    assert_error(post(base_url, png(Image.new("RGB", (8, 8)), "ICO")), 415, "unsupported_format")
    assert_error(post(base_url, png(Image.new("1", (10_000, 10_000)))), 413, "image_too_large")
    # The limit the user set is named, whether the form's check or the body's count found it.
    for size in (21, 25):
        r = post(base_url, b"\0" * (size * 1024 * 1024))
        assert_error(r, 413, "upload_too_large")
        assert "over the 20,971,520-byte limit (HEADSCOPE_MAX_UPLOAD_BYTES)" in r.json()["error"]["message"], size
    assert_error(  # two files in `image`: the field given twice, as any other form field
        httpx.post(base_url + API, files=[("image", ("a.png", cat)), ("image", ("b.png", cat))], timeout=HTTP_TIMEOUT),
        422,
        "duplicate_field",
    )
    # A body that ends before its closing boundary was cut short: malformed, not "no file" (the
    # parser dropped the unfinished part silently, and it was answered 422 missing_image).
    head = b'--x\r\nContent-Disposition: form-data; name="image"; filename="cat.png"\r\n\r\n'
    for body in (b"--x\r\nbroken", head + cat, head + cat + b"\r\n--x"):
        r = post_raw(base_url, body)
        assert_error(r, 400, "bad_multipart")
        assert "closing boundary" in r.json()["error"]["message"]
    # The same part with its closing boundary is read; a whole form without the image says so.
    assert post_raw(base_url, head + cat + b"\r\n--x--\r\n").status_code == 200
    assert_error(post_raw(base_url, b"--x--\r\n"), 422, "missing_image")
    # Path parts in the filename are dropped; the name is only ever displayed.
    b = post(base_url, cat, "../../etc/passwd").json()
    assert b["filename"] == "passwd"
    assert httpx.get(base_url + "/healthz", timeout=HTTP_TIMEOUT).status_code == 200  # still serving


def post_raw(base_url: str, body: bytes) -> httpx.Response:
    """POST ``body`` as it is, a multipart form with boundary ``x``."""
    headers = {"content-type": "multipart/form-data; boundary=x"}
    return httpx.post(base_url + API, content=body, headers=headers, timeout=HTTP_TIMEOUT)


def posts_counted(base_url: str, status: str, endpoint: str = "post") -> float:
    """``headscope_requests_total{endpoint, status}`` now."""
    text = httpx.get(base_url + "/metrics", timeout=HTTP_TIMEOUT).text
    m = re.search(rf'headscope_requests_total{{endpoint="{endpoint}",status="{status}"}} (\S+)', text)
    return float(m.group(1)) if m else 0.0


def rejected(base_url: str, reason: str) -> float:
    text = httpx.get(base_url + "/metrics", timeout=HTTP_TIMEOUT).text
    m = re.search(rf'headscope_rejections_total{{reason="{reason}"}} (\S+)', text)
    return float(m.group(1)) if m else 0.0


def test_a_body_refused_by_its_declared_length_is_counted(base_url):
    """Refused before any route reads it (Content-Length over the limit): in the metrics as a
    rejection by reason (it was in none)."""
    before = rejected(base_url, "upload_too_large")
    assert_error(post(base_url, b"\0" * (25 * 1024 * 1024)), 413, "upload_too_large")
    assert rejected(base_url, "upload_too_large") == before + 1
    # A parameter given twice, refused before routing too.
    before = rejected(base_url, "duplicate_parameter")
    r = httpx.get(f"{base_url}{API}/{'0' * 24}?layers=1&layers=2", timeout=HTTP_TIMEOUT)
    assert_error(r, 422, "duplicate_parameter")
    assert rejected(base_url, "duplicate_parameter") == before + 1


def test_upload_cap_is_checked_while_reading(base_url):
    def chunks():
        yield b'--b\r\nContent-Disposition: form-data; name="image"; filename="x.png"\r\n\r\n'
        for _ in range(30):
            yield b"\0" * (1024 * 1024)

    before = {s: posts_counted(base_url, s) for s in ("413", "500")}
    refused = rejected(base_url, "upload_too_large")
    r = httpx.post(
        base_url + API, content=chunks(), headers={"content-type": "multipart/form-data; boundary=b"}, timeout=30
    )
    assert_error(r, 413, "upload_too_large")
    # counted as what it was answered (it was a 500 in the metrics while the middleware answered 413)
    assert posts_counted(base_url, "413") == before["413"] + 1 and posts_counted(base_url, "500") == before["500"]
    assert rejected(base_url, "upload_too_large") == refused  # by its route, not twice


@pytest.mark.parametrize(
    "make",
    [
        lambda: Image.new("L", (300, 200), 90),
        lambda: Image.new("RGBA", (200, 300), (10, 200, 30, 128)),
        lambda: Image.new("P", (120, 120), 3),
        lambda: Image.new("I;16", (100, 150), 30000),
        lambda: Image.new("RGB", (3, 2), (255, 0, 0)),
        lambda: Image.new("RGB", (2000, 100), (0, 0, 255)),
    ],
    ids=["grey", "rgba", "palette", "16bit", "tiny", "very-wide"],
)
def test_odd_but_valid_images(base_url, make):
    r = post(base_url, png(make()), layers="-1")
    assert r.status_code == 200, r.text
    b = r.json()
    gh, gw = b["tokens"]["grid"]
    assert b["input_size"] == [gh * 14, gw * 14] and b["tokens"]["count"] == 1 + gh * gw
    assert max(gh, gw) <= 3 * min(gh, gw)


def test_concurrent_clients_get_their_own_answers_and_batches_form(base_url, samples):
    imgs = []
    for i, p in enumerate(sorted(samples.values()) * 4):  # 16 different images (crops) at once
        im = Image.open(p).convert("RGB")
        imgs.append(png(im.crop((i, i, im.width - i, im.height - i)).resize((224, 224))))
    before = httpx.get(base_url + "/metrics", timeout=HTTP_TIMEOUT).text
    with ThreadPoolExecutor(16) as ex:
        together = list(ex.map(lambda d: post(base_url, d, layers="-1,0", query="0,5").json(), imgs))
    after = httpx.get(base_url + "/metrics", timeout=HTTP_TIMEOUT).text
    singles = []
    for d in imgs:
        # One at a time, as new bytes of the same pixels: the cache is keyed by the upload's bytes,
        # so each is computed again, alone (the same bytes would only be sliced from the cache).
        fresh = png(Image.open(io.BytesIO(d)), compress_level=1)
        singles.append(post(base_url, fresh, layers="-1,0", query="0,5").json())
    for t, s in zip(together, singles):
        assert t["cached"] is False and s["cached"] is False and t["image_id"] != s["image_id"]
        np.testing.assert_array_equal(np.array(t["attention"]), np.array(s["attention"]))

    def batches(text, le):
        m = re.search(rf'headscope_batch_size_bucket{{le="{le}"}} (\S+)', text)
        total = re.search(r"headscope_batch_size_count (\S+)", text)
        return float(total.group(1)) - float(m.group(1)) if m else 0.0

    assert batches(after, "1.0") > batches(before, "1.0"), "no batch larger than 1 formed"
    assert "headscope_queue_depth" in after and "headscope_request_seconds_bucket" in after


def test_every_upload_is_counted_with_its_status_form_errors_too(base_url, cat):
    """requests_total{endpoint="post"} counts an upload refused while its form is read (a bad
    parameter, an unknown field: 422) as it counts one refused later (a corrupt picture)."""

    def counted(status: str) -> float:
        return posts_counted(base_url, status)

    before = counted("422")
    assert_error(post(base_url, cat, temperature="0"), 422, "invalid_parameter")
    assert_error(post(base_url, cat, bogus="1"), 422, "unknown_field")
    assert counted("422") == before + 2
    bad = post(base_url, b"not a picture")
    assert_error(bad, bad.status_code, "not_an_image")
    assert counted(str(bad.status_code)) >= 1


def test_a_follow_up_refused_before_its_call_is_counted_too(base_url, cat):
    """A GET refused by FastAPI's parameter check or by a dependency (a malformed image id) is
    counted under its route's endpoint, as one refused by the service is (they were not counted)."""
    image_id = post(base_url, cat, layers="-1").json()["image_id"]
    cases = [
        ("get", f"/attention/{image_id}?temperature=abc", 422, "invalid_parameter"),
        ("get", "/attention/not-an-id", 422, "invalid_image_id"),
        ("stats", f"/attention/{image_id}/stats?mass=2", 422, "invalid_parameter"),
        ("relevance", f"/attention/{image_id}/relevance?start_layer=x", 422, "invalid_parameter"),
        ("get", "/attention/" + "0" * 24, 404, None),  # refused by the service: counted as before
    ]
    for endpoint, path, status, code in cases:
        before = posts_counted(base_url, str(status), endpoint)
        assert_error(httpx.get(base_url + API + path[len("/attention") :], timeout=HTTP_TIMEOUT), status, code)
        assert posts_counted(base_url, str(status), endpoint) == before + 1, (endpoint, path)
    # Each is timed too: request_seconds' _count is requests_total's sum (it lagged by every refusal).
    text = httpx.get(base_url + "/metrics", timeout=HTTP_TIMEOUT).text
    for endpoint in ("get", "stats", "relevance"):
        total = sum(
            float(v)
            for v in re.findall(rf'^headscope_requests_total{{endpoint="{endpoint}",[^}}]*}} (\S+)$', text, re.M)
        )
        timed = re.search(rf'^headscope_request_seconds_count{{endpoint="{endpoint}"}} (\S+)$', text, re.M)
        assert timed and float(timed.group(1)) == total, endpoint


def test_every_measured_route_is_labelled_as_it_counts():
    """``counted_as`` on each route names the endpoint its ``measured()`` call counts under."""
    import importlib
    import inspect
    import pkgutil

    from headscope.web import api

    routes = []
    for info in pkgutil.iter_modules(api.__path__):
        module = importlib.import_module(f"headscope.web.api.{info.name}")
        routes += getattr(getattr(module, "router", None), "routes", [])
    labelled = 0
    for route in routes:
        fn = getattr(route, "endpoint", None)
        source = inspect.getsource(fn) if fn is not None and inspect.isfunction(fn) else ""
        found = re.findall(r'measured\(.*?"(\w+)"\)', source, re.S)
        if found:
            labelled += 1
            assert getattr(fn, "metric_endpoint", None) == found[0], route.path
    assert labelled >= 11


@pytest.mark.thorough
def test_a_batched_answer_equals_a_fresh_single_compute(server_factory, samples):
    """Same image alone on a fresh server (no cache) vs inside a batch of 8 on another."""
    srv = server_factory({"HEADSCOPE_MAX_WAIT_MS": "200", "HEADSCOPE_MAX_BATCH_SIZE": "8"})
    data = [png(Image.open(p).convert("RGB").resize((224, 224))) for p in sorted(samples.values())] * 2
    data = [d + b"" for d in data]
    with ThreadPoolExecutor(8) as ex:
        batched = list(ex.map(lambda d: post(srv.url, d, query="all", layers="-1", format="npy"), data[:4]))
    srv2 = server_factory({"HEADSCOPE_MAX_BATCH_SIZE": "1"})
    for d, rb in zip(data[:4], batched):
        rs = post(srv2.url, d, query="all", layers="-1", format="npy")
        np.testing.assert_array_equal(np.load(io.BytesIO(rb.content)), np.load(io.BytesIO(rs.content)))


def test_docs_and_openapi(base_url):
    spec = httpx.get(base_url + "/openapi.json", timeout=HTTP_TIMEOUT).json()
    paths = spec["paths"]
    for p in ("/api/v1/attention", "/api/v1/attention/{image_id}", "/api/v1/models", "/healthz", "/readyz", "/metrics"):
        assert p in paths
    body = paths["/api/v1/attention"]["post"]["requestBody"]["content"]["multipart/form-data"]["schema"]
    assert {"image", "layers", "heads", "query", "aggregate", "format", "dtype"} <= set(body["properties"])
    # /docs itself is rendered in Chromium by tests/browser/test_docs.py.


def test_unknown_route_has_the_same_error_shape(base_url):
    assert_error(httpx.get(base_url + "/api/v1/nothing", timeout=HTTP_TIMEOUT), 404)
    assert_error(httpx.delete(base_url + "/api/v1/models", timeout=HTTP_TIMEOUT), 405)


def test_stats_endpoint_and_drop(base_url, cat):
    b = post(base_url, cat, layers="-1").json()
    image_id = b["image_id"]
    r = httpx.get(f"{base_url}{API}/{image_id}/stats", timeout=HTTP_TIMEOUT)
    assert r.status_code == 200, r.text
    s = r.json()
    assert (s["layers"], s["heads"]) == (12, 6)
    ent = np.array(s["entropy"])
    assert ent.shape == (12, 6) and ((ent > 0) & (ent <= 1)).all()
    dist = np.array(s["distance_px"])
    assert dist.shape == (12, 6) and (dist >= 0).all() and dist.max() < np.hypot(224, 336)
    sim = np.array(s["similarity"])
    assert sim.shape == (12, 6, 6) and np.allclose(np.diagonal(sim, axis1=1, axis2=2), 1)
    assert len(s["rank"]["numerical"]) == 12 and all(1 <= e <= 384 for e in s["rank"]["effective"])
    assert np.array(s["mass_patches"]).shape == (12, 6)
    assert all(1 <= t < 385 for t in s["artifacts"]["tokens"])
    # POST can carry the same statistics.
    b2 = post(base_url, cat, layers="-1", stats="true").json()
    assert b2["stats"]["entropy"] == s["entropy"]
    # Dropping the prefix token renormalises rows over the patches.
    d = httpx.get(f"{base_url}{API}/{image_id}", params={"drop": "prefix", "layers": "-1"}, timeout=HTTP_TIMEOUT).json()
    a = np.array(d["attention"])
    assert d["dropped"] == [0] and np.allclose(a[..., 0], 0) and np.allclose(a.sum(-1), 1, atol=1e-5)
    assert_error(httpx.get(f"{base_url}{API}/{image_id}/stats", params={"mass": "2"}, timeout=HTTP_TIMEOUT), 422)
    assert_error(httpx.get(f"{base_url}{API}/{'a' * 24}/stats", timeout=HTTP_TIMEOUT), 404, "image_not_found")


def test_stats_carry_the_token_layout(base_url, cat):
    image_id = post(base_url, cat, layers="-1").json()["image_id"]
    s = httpx.get(f"{base_url}{API}/{image_id}/stats", timeout=HTTP_TIMEOUT).json()
    assert s["tokens"]["grid"] == [16, 24] and s["tokens"]["count"] == 385


def test_every_row_answers_come_from_the_unfused_capture_and_match_the_engine(base_url, cat, local_model):
    # Same pixels, new bytes: not in the server's cache, so this POST computes (materialised).
    fresh = png(Image.open(io.BytesIO(cat)), compress_level=1)
    r = post(base_url, fresh, format="safetensors", query="all")
    assert r.status_code == 200, r.text
    meta = json.loads(r.headers["x-headscope-meta"])
    assert meta["cached"] is False and meta["shape"] == [12, 6, 385, 385]
    maps = st_load(r.content)["attention"]
    ref, _ = reference(local_model, cat)  # fused forward + q/k recompute, in this process
    for layer in range(12):
        # The two branches round the hidden states differently (fused kernel vs explicit
        # softmax), by a few 1e-6 after a few layers.
        np.testing.assert_allclose(maps[layer], ref.rows(layer).numpy(), atol=1e-5, rtol=1e-4)
    # Follow-ups are sliced from the materialised maps.
    b = httpx.get(
        f"{base_url}{API}/{meta['image_id']}", params={"query": "patch:3,5", "layers": "2"}, timeout=HTTP_TIMEOUT
    ).json()
    assert b["cached"] is True
    np.testing.assert_allclose(np.array(b["attention"], np.float32)[0, :, 0], maps[2, :, 1 + 3 * 24 + 5], atol=0)
    h = httpx.get(
        f"{base_url}{API}/{meta['image_id']}",
        params={"dtype": "float16", "query": "all", "layers": "4"},
        timeout=HTTP_TIMEOUT,
    )
    half = np.array(h.json()["attention"], np.float32)[0]
    np.testing.assert_allclose(half, maps[4], atol=1e-3, rtol=1e-3)
    assert np.abs(half - maps[4]).max() > 0  # really rounded to float16
