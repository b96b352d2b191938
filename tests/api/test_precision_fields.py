"""Every computing answer of the REST API says the precision it was computed in (issue #37):
JSON bodies, and the metadata of binary answers (the safetensors header, X-Headscope-Meta)."""

from __future__ import annotations

import json
import struct

import httpx

from helpers.api import follow_up, post_json
from helpers.server import HTTP_TIMEOUT


def test_every_computing_answer_says_its_precision(base_url, samples):
    posted = post_json(base_url, samples["cat"].read_bytes(), "cat.png", layers="-1")
    assert posted["precision"] == "fp32"
    iid = posted["image_id"]
    for what, params in [
        ("stats", {}),
        ("explain", {"layer": 0, "head": 0}),
        ("output", {}),
        ("output", {"ablate": "0:0"}),
        ("relevance", {"method": "attention"}),
        ("faithfulness", {"methods": "attention,random", "fractions": "0,0.5"}),
        ("importance", {"method": "gradient"}),
        ("pruning", {"method": "gradient", "points": 3}),
    ]:
        assert follow_up(base_url, iid, what, **params).get("precision") == "fp32", (what, params)
    for what in ("output", "explain"):
        r = httpx.get(
            f"{base_url}/api/v1/attention/{iid}/{what}", params={"format": "safetensors"}, timeout=HTTP_TIMEOUT
        )
        assert r.status_code == 200, r.text
        (n,) = struct.unpack("<Q", r.content[:8])  # the file's own metadata (explain's is there only)
        meta = json.loads(json.loads(r.content[8 : 8 + n])["__metadata__"]["headscope"])
        assert meta["precision"] == "fp32", what
        if what == "output":
            assert json.loads(r.headers["X-Headscope-Meta"])["precision"] == "fp32"
