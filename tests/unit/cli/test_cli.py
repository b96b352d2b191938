"""The command line: extract and fetch, run as a user runs them."""

from __future__ import annotations

import json
import subprocess
import sys

import torch
from safetensors.torch import load_file

from server import ROOT, SAMPLES


def cli(*args, timeout=180):
    return subprocess.run(
        [sys.executable, "-m", "app.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**__import__("os").environ, "HEADSCOPE_MODELS_DIR": str(ROOT / "models")},
    )


def test_extract_many_files_into_one_safetensors(tmp_path):
    out = tmp_path / "attn.safetensors"
    r = cli("extract", str(SAMPLES), "--out", str(out), "--layers", "-1", "--query", "cls")
    assert r.returncode == 0, r.stderr
    tensors = load_file(str(out))
    assert len(tensors) == 4
    with open(out, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        meta = json.loads(json.loads(f.read(n))["__metadata__"]["images"])
    cat = next(k for k, v in meta.items() if v["file"].endswith("cat.png"))
    assert tensors[cat].shape == (1, 6, 1, 385) and meta[cat]["tokens"]["grid"] == [16, 24]
    assert torch.allclose(tensors[cat].sum(-1), torch.ones(1, 6, 1), atol=1e-5)


def test_fetch_timm_offline_says_what_to_do():
    r = cli("fetch", "timm:vit_base_patch16_224.augreg_in21k", timeout=120)
    assert r.returncode == 1
    assert "vit_base_patch16_224.augreg_in21k" in r.stderr and "local:vit_base_patch16_224@" in r.stderr
    assert "Traceback" not in r.stderr
    r = cli("fetch", "timm:not_a_model")
    assert r.returncode == 1 and "no model named 'not_a_model'" in r.stderr


def test_fetch_default_is_a_no_op_when_converted():
    r = cli("fetch")
    assert r.returncode == 0 and "dinov2-s14-focus: ready" in r.stdout
