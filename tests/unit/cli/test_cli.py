"""The command line: extract and fetch, run as a user runs them."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from headscope import cli as headscope_cli
from helpers.cli import run_cli as cli
from helpers.server import SAMPLES, free_port
from helpers.waiting import wait_until

# Each command starts a Python that imports torch and timm (and extract loads a model): on a loaded
# 2-core machine that alone took over 2 minutes, so the limits are generous, not tight.
CLI_TIMEOUT_S = 600
pytestmark = pytest.mark.timeout(2 * CLI_TIMEOUT_S)


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


def test_extract_and_survey_take_a_precision_flag(tmp_path, monkeypatch):
    """--precision beside HEADSCOPE_PRECISION (the flag wins), said in the file's metadata and in
    every survey row; in this process (the same code as the command)."""
    import pyarrow.parquet as pq

    monkeypatch.setenv("HEADSCOPE_PRECISION", "fp32")
    cat = str(SAMPLES / "cat.png")
    out = tmp_path / "attn.safetensors"
    assert headscope_cli.main(["extract", cat, "--out", str(out), "--layers", "-1", "--precision", "bf16"]) == 0
    with open(out, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        assert json.loads(f.read(n))["__metadata__"]["precision"] == "bf16"
    folder = tmp_path / "survey.parquet"
    assert headscope_cli.main(["survey", cat, "--out", str(folder), "--precision", "bf16", "--quiet"]) == 0
    assert set(pq.read_table(folder).column("precision").to_pylist()) == {"bf16"}


def test_fetch_timm_offline_says_what_to_do(capsys):
    r = cli("fetch", "timm:vit_base_patch16_224.augreg_in21k")
    assert r.returncode == 1
    assert "vit_base_patch16_224.augreg_in21k" in r.stderr and "local:vit_base_patch16_224@" in r.stderr
    assert "Traceback" not in r.stderr
    # in this process: the same code, without a second interpreter's start (seconds on 2 cores)
    assert headscope_cli.main(["fetch", "timm:not_a_model"]) == 1
    assert "no model named 'not_a_model'" in capsys.readouterr().err


def test_fetch_default_is_a_no_op_when_converted():
    r = cli("fetch")
    assert r.returncode == 0 and "dinov2-s14-focus: ready" in r.stdout


def test_serve_on_a_port_in_use_says_so_in_one_line():
    port = free_port()
    other = subprocess.Popen(
        [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        # until the other process listens (at most about five minutes)
        wait_until(lambda: other.poll() is not None or _listening(port), 300, "the other process to listen")
        assert _listening(port), "the other process never listened"
        r = cli("serve", "--port", str(port), "--no-fetch")
        assert r.returncode == 1
        lines = [line for line in r.stderr.splitlines() if line.strip()]
        assert len(lines) == 1, r.stderr
        assert f"port {port} on 127.0.0.1 is already in use" in lines[0] and f"--port {port + 1}" in lines[0]
        assert "Errno" not in r.stderr and "Traceback" not in r.stderr
    finally:
        other.terminate()
        other.wait(30)


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_extract_of_a_missing_path_fails_before_loading_the_model(tmp_path):
    # The model id cannot load: had extract loaded it first, the error would name the model.
    r = cli("extract", str(tmp_path / "nope.png"), "--out", str(tmp_path / "o.safetensors"), "--model", "timm:nope")
    assert r.returncode == 2
    assert r.stderr.strip() == f"headscope extract: no such file or folder: {tmp_path / 'nope.png'}"
    assert not (tmp_path / "o.safetensors").exists()


@pytest.mark.surveys  # a whole survey or extract run (a model load, every picture): make test-long
def test_extract_swin_asks_for_one_stage(tmp_path):
    out = tmp_path / "swin.safetensors"
    model = ["--model", "random:swin_tiny_patch4_window7_224"]
    r = cli("extract", str(SAMPLES / "cat.png"), "--out", str(out), *model, "--query", "patch:1,1")
    assert r.returncode == 2 and "stage 0 = layers 0-1" in r.stderr and "Traceback" not in r.stderr
    r = cli("extract", str(SAMPLES / "cat.png"), "--out", str(out), *model, "--layers", "2-3", "--query", "patch:27,0")
    assert r.returncode == 0, r.stderr
    (t,) = load_file(str(out)).values()
    assert t.shape == (2, 6, 1, 28 * 42) and ((t > 0).sum(-1) <= 49).all()
    with open(out, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        meta = json.loads(json.loads(f.read(n))["__metadata__"]["images"])
    (m,) = meta.values()
    assert m["tokens"]["grid"] == [28, 42] and m["tokens"]["stage"] == 1 and m["query"] == [27 * 42]
