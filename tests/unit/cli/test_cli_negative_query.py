"""`headscope extract --query` reads negative token and cell indices as the API does (issue 33,
item 10): Python's indexing, resolved in the metadata; out of range, the message gives the range."""

from __future__ import annotations

import json

import pytest
from safetensors import safe_open
from test_cli_unreadable_files import CLI_TIMEOUT_S, MODEL, assert_clean, run

from helpers.server import SAMPLES

pytestmark = pytest.mark.timeout(3 * CLI_TIMEOUT_S)


@pytest.mark.surveys  # a whole survey or extract run (a model load, every picture): make test-long
def test_extract_reads_negative_query_indices_as_python_does(tmp_path):
    """`patch:-1,0` is the first cell of the last row; out of range says the valid range."""
    out = tmp_path / "attn.safetensors"
    cat = SAMPLES / "cat.png"
    r = run("extract", str(cat), "--out", str(out), "--model", MODEL, "--layers", "-1", "--query", "patch:-1,0;-2,-1")
    assert r.returncode == 0, r.stderr
    with safe_open(str(out), "pt") as f:
        (m,) = json.loads(f.metadata()["images"]).values()
    gh, gw = m["tokens"]["grid"]
    prefix = m["tokens"]["num_prefix"]
    assert m["query"] == [prefix + (gh - 1) * gw, prefix + (gh - 2) * gw + gw - 1]
    assert m["layers"] == [m["layers"][0]] and m["layers"][0] >= 0

    r = run("extract", str(cat), "--out", str(tmp_path / "o2.safetensors"), "--model", MODEL, "--query", "patch:-99,0")
    assert r.returncode == 2
    assert_clean(r)
    assert f"rows {-gh}..{gh - 1}" in r.stderr and "negative counts from the end" in r.stderr
