"""The REST API does what docs/api.md says, in the details a review of the API from its docs
found otherwise (2026-12-01): decimal numbers in ASCII, a rollout from `rollout_start` over every
layer, `Server-Timing` on every answer, download names that keep every part and never collide,
a blank parameter as its default, and refusals of a form or request line that say what was wrong.
Against the real server.
"""

from __future__ import annotations

import re
import socket

import httpx
import numpy as np
import pytest

from headscope.serving.encoders import answer_stem
from helpers.api import API, assert_error, get, post
from helpers.server import HTTP_TIMEOUT


@pytest.fixture(scope="module")
def cat_id(base_url, samples) -> str:
    r = post(base_url, samples["cat"].read_bytes(), "cat.png", layers="-1", heads="0")
    assert r.status_code == 200, r.text
    return r.json()["image_id"]


def test_decimal_numbers_take_ascii_digits_alone(base_url, cat_id, samples):
    """``temperature=1_0`` was answered at T = 10, ``wait=0_1`` waited a second, and
    ``discard_ratio=0_5`` was refused as "less than 1": Python's float() reads the separator."""
    message = "Input should be a valid number, unable to parse string as a number"
    for path, params in [
        ("", {"temperature": "1_0"}),
        ("", {"temperature": "٢"}),
        ("", {"aggregate": "rollout", "discard_ratio": "0_5"}),
        ("/stats", {"mass": "0_5"}),
        ("/importance", {"method": "gradient", "wait": "0_1"}),
    ]:
        r = get(base_url, f"{API}/{cat_id}{path}", **params)
        assert_error(r, 422, "invalid_parameter")
        assert r.json()["error"]["message"] == f"{next(iter(params.keys() - {'aggregate', 'method'}))}: {message}"
    r = post(base_url, samples["cat"].read_bytes(), "cat.png", layers="-1", heads="0", temperature="2_5")
    assert_error(r, 422, "invalid_parameter")
    ok = get(base_url, f"{API}/{cat_id}", layers="-1", heads="0", temperature="2.5e-1")
    assert ok.status_code == 200 and ok.json()["temperature"] == 0.25


def test_a_rollout_from_rollout_start_covers_every_layer_from_it(base_url, cat_id):
    """``aggregate=rollout&rollout_start=-2`` with the default ``layers=all`` was a 422 ("layers
    before rollout_start have no rollout"): every layer that has a rollout is answered."""
    r = get(base_url, f"{API}/{cat_id}", aggregate="rollout", rollout_start="-2", query="patch:3,4")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["layers"] == [10, 11]  # of the default model's 12
    explicit = get(
        base_url, f"{API}/{cat_id}", aggregate="rollout", rollout_start="-2", query="patch:3,4", layers="-2--1"
    )
    np.testing.assert_array_equal(np.asarray(body["attention"]), np.asarray(explicit.json()["attention"]))
    # Layers named by hand before rollout_start still say why they cannot be answered.
    r = get(base_url, f"{API}/{cat_id}", aggregate="rollout", rollout_start="-2", layers="0-11")
    assert_error(r, 422, "bad_selection")


def test_a_rollout_option_without_a_rollout_is_refused(base_url, cat_id, samples):
    """``discard_ratio=0.5`` without ``aggregate=rollout`` answered the plain maps without a word."""
    r = get(base_url, f"{API}/{cat_id}", layers="-1", discard_ratio="0.5")
    assert_error(r, 422, "invalid_parameter")
    assert r.json()["error"]["message"] == (
        "discard_ratio: an option of aggregate=rollout; add aggregate=rollout, or leave it out "
        "(aggregate=none does not use it)"
    )
    r = post(base_url, samples["cat"].read_bytes(), "cat.png", aggregate="mean", head_fusion="max", rollout_start="2")
    assert_error(r, 422, "invalid_parameter")
    assert r.json()["error"]["message"].startswith("rollout_start, head_fusion: options of aggregate=rollout")
    same = get(base_url, f"{API}/{cat_id}", layers="-1", heads="0", head_fusion="mean", discard_ratio="0")
    assert same.status_code == 200  # the defaults, spelled out, are taken


def test_every_answer_says_its_server_timing(base_url, cat_id):
    """The docs: every answer carries ``Server-Timing``. Only the answers of a capture did; the
    others (statistics, images, models, health, every error) now give ``total``."""
    timed = re.compile(r"total;dur=\d+\.\d\d")
    for path, params in [
        (f"{API}/{cat_id}/stats", {}),
        (f"/api/v1/images/{cat_id}", {}),
        ("/api/v1/models", {}),
        ("/healthz", {}),
        ("/readyz", {}),
        (f"{API}/{'0' * 24}", {}),  # 404
        (f"{API}/{cat_id}", {"layers": "99"}),  # 422
        ("/no/such/route", {}),
    ]:
        r = httpx.get(base_url + path, params=params, timeout=HTTP_TIMEOUT)
        assert timed.fullmatch(r.headers.get("server-timing", "")), (path, r.status_code, r.headers)
        assert r.headers["x-request-id"]
    parts = httpx.get(f"{base_url}{API}/{cat_id}", params={"layers": "-1"}, timeout=HTTP_TIMEOUT).headers
    assert {"queue", "compute", "encode"} <= {p.split(";")[0].strip() for p in parts["server-timing"].split(",")}


def test_download_names_keep_every_part_and_never_collide(base_url, cat_id):
    """A name was cut at 150 characters, so a long query lost the parts after it (two answers, one
    name); explain and output had names of their own without the model; relevance put the model
    id in as it was."""
    cells = "patch:" + ";".join(f"{r},{c}" for r in range(8) for c in range(0, 16, 3))

    def name(path: str = "", **params) -> str:
        r = get(base_url, f"{API}/{cat_id}{path}", **params)
        assert r.status_code == 200, r.text[:300]
        m = re.fullmatch(r'attachment; filename="([A-Za-z0-9._-]+)"', r.headers["content-disposition"])
        assert m, r.headers["content-disposition"]
        return m.group(1)

    a = name(format="npy", query=cells, layers="-1", heads="0")
    b = name(format="npy", query=cells, layers="0-5", heads="0,2", dtype="float16")
    assert a != b and len(a) <= 154 and len(b) <= 154
    assert "-L-1-H0-" in a and "-L0-5-H0_2-float16-" in b  # the parts after the query are kept
    prefix = f"{cat_id[:12]}-dinov2-s14-focus"
    assert name("/explain", format="safetensors", layer="3", head="2", ablate="1:0") == (
        f"explain-{prefix}-L3-H2-token0-ablate-1_0.safetensors"
    )
    assert name("/output", format="npy", ablate="1:0,2:1") == f"output-{prefix}-ablate-1_0_2_1.npy"
    assert name("/output", format="npy") == f"output-{prefix}.npy"
    assert name("/relevance", format="npy", method="random", seed="3") == f"relevance-{prefix}-random-output-seed3.npy"
    # chefer2021's first layer, as the seed: two starts, two maps, two names (they shared one)
    assert name("/relevance", format="npy", method="chefer2021", start_layer="0") == (
        f"relevance-{prefix}-chefer2021-output-start0.npy"
    )
    assert name("/relevance", format="npy", method="chefer2021") == f"relevance-{prefix}-chefer2021-output-start1.npy"
    # A model id of the catalogue's or open_clip's form: no ':' or '/' reaches the name.
    assert answer_stem("relevance", cat_id, "open_clip:ViT-B-32/laion2b", "chefer", "text-a_cat") == (
        f"relevance-{cat_id[:12]}-open_clip_ViT-B-32_laion2b-chefer-text-a_cat"
    )


def test_a_blank_parameter_is_its_default(base_url, cat_id):
    """``drop=`` was a 422 where ``layers=`` and ``query=`` were the default: an HTML form's blank
    field is the default of every parameter that has one."""
    plain = get(base_url, f"{API}/{cat_id}", layers="-1", heads="0").json()
    blank = get(
        base_url, f"{API}/{cat_id}", layers="-1", heads="0", drop="", temperature="", aggregate=" ", rollout_start=""
    )
    assert blank.status_code == 200, blank.text
    assert blank.json()["attention"] == plain["attention"] and blank.json()["query"] == plain["query"] == [0]


def test_form_and_request_line_refusals_say_what_was_wrong(base_url, live_server, samples):
    cat = samples["cat"].read_bytes()
    # A text field over 64 KiB is too large, not a malformed body (it was 400 "Part exceeded maximum size of 64KB.")
    r = httpx.post(
        base_url + API, files={"image": ("cat.png", cat)}, data={"layers": "0," * 40_000}, timeout=HTTP_TIMEOUT
    )
    assert_error(r, 413, "field_too_large")
    assert "over 65,536 bytes" in r.json()["error"]["message"]
    # A file name of 9 KB: python-multipart's reason, not "Invalid multipart data."
    r = httpx.post(base_url + API, files={"image": ("x" * 9000 + ".png", cat)}, timeout=HTTP_TIMEOUT)
    assert_error(r, 400, "bad_multipart")
    assert "header size exceeded" in r.json()["error"]["message"].lower()
    # A request line h11 cannot read is quoted as text, not as Python's bytearray(b'...').
    with socket.create_connection(("127.0.0.1", live_server.port), timeout=HTTP_TIMEOUT) as s:
        s.sendall(b"GET /heal thz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 400")
    assert b"illegal request line: 'GET /heal thz HTTP/1.1'" in answer and b"bytearray" not in answer
    assert httpx.get(base_url + "/healthz", timeout=HTTP_TIMEOUT).status_code == 200


def test_a_misspelt_parameter_gets_the_name_meant(base_url, cat_id, samples):
    """``layer=`` for ``layers=``: the form's refusal said "the file goes in 'image'" whatever the
    field, and the query string's listed fourteen names without pointing at one."""
    r = post(base_url, samples["cat"].read_bytes(), "cat.png", layer="-1")
    assert_error(r, 422, "unknown_field")
    assert "unknown form field(s): layer (did you mean 'layers'?)" in r.json()["error"]["message"]
    r = httpx.post(base_url + API, files={"file": ("cat.png", b"x")}, timeout=HTTP_TIMEOUT)
    assert_error(r, 422, "unknown_field")
    said = r.json()["error"]["message"]
    assert "did you mean" not in said and "the form takes 'image' (the file) and ablate, aggregate" in said
    r = get(base_url, f"{API}/{cat_id}", heads="0", tempreature="2")
    assert_error(r, 422, "invalid_parameter")
    assert "'tempreature' (did you mean 'temperature'?) for" in r.json()["error"]["message"]
    r = get(base_url, f"{API}/{cat_id}", colour="red")
    assert_error(r, 422, "invalid_parameter")
    assert "did you mean" not in r.json()["error"]["message"]
