"""The command line: extract and fetch, run as a user runs them."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest
import torch
from safetensors import safe_open
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


def test_extract_skips_a_picture_without_the_token_asked_for_and_names_fused_heads(tmp_path, capsys):
    """Token 300 exists in the cat (385 tokens), not in the astronaut (257): the astronaut is skipped
    and named, the cat written as 00000 (no gap); fused heads are ["mean"] in the metadata, as in
    the API's answers. In this process (the same code as the command). Found by a reviewer: the
    whole run stopped at the astronaut, and the metadata listed the six heads that were fused."""
    out = tmp_path / "attn.safetensors"
    files = [str(SAMPLES / "astronaut.png"), str(SAMPLES / "cat.png")]
    argv = ["extract", *files, "--out", str(out), "--layers", "-1", "--query", "300", "--aggregate", "mean"]
    assert headscope_cli.main(argv) == 0
    err = capsys.readouterr().err
    assert "astronaut.png" in err and "out of range" in err and "(bad_selection)" in err, err
    tensors = load_file(str(out))
    assert list(tensors) == ["00000"] and tensors["00000"].shape == (1, 1, 1, 385)
    with open(out, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        meta = json.loads(json.loads(f.read(n))["__metadata__"]["images"])
    assert meta["00000"]["file"].endswith("cat.png") and meta["00000"]["heads"] == ["mean"]
    assert meta["00000"]["fused_heads"] == [0, 1, 2, 3, 4, 5]


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
    assert headscope_cli.main(["fetch", "timm:not_a_model"]) == 2  # the id itself: 2, as extract and survey
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


def test_serve_on_an_address_not_this_machines_says_so_before_loading(capsys):
    """192.0.2.1 (TEST-NET-1) is no interface's: one line naming --host / HEADSCOPE_HOST, before the
    model loads (it was uvicorn's errno 99 after the model had loaded and said ready)."""
    assert headscope_cli.main(["serve", "--no-fetch", "--host", "192.0.2.1", "--port", str(free_port())]) == 1
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "192.0.2.1 is not an address of this machine (--host or HEADSCOPE_HOST)" in lines[0], err
    assert "Errno" not in err and "ready" not in err


@pytest.mark.parametrize(
    "argv, env, said",
    [
        (["--port", "-1"], {}, "--port / HEADSCOPE_PORT: input should be greater than or equal to 0 (got -1)"),
        (["--port", "70000"], {}, "--port / HEADSCOPE_PORT: input should be less than or equal to 65535"),
        ([], {"HEADSCOPE_PORT": "-1"}, "--port / HEADSCOPE_PORT: input should be greater than or equal to 0"),
        (["--max-loaded-models", "0"], {}, "--max-loaded-models / HEADSCOPE_MAX_LOADED_MODELS: input should be"),
        ([], {"HEADSCOPE_MAX_QUEUE": "-1"}, "headscope serve: HEADSCOPE_MAX_QUEUE: input should be greater"),
        (
            ["--device", "bogus"],
            {},
            "headscope serve: --device / HEADSCOPE_DEVICE: device 'bogus': use auto, cpu, cuda, cuda:N or mps",
        ),
        ([], {"HEADSCOPE_MODEL": " , "}, "headscope serve: --model / HEADSCOPE_MODEL: no model id in ' , '"),  # named
        # argparse never checks a default against its choices: this was uvicorn's KeyError traceback
        ([], {"HEADSCOPE_LOG_LEVEL": "verbose"}, "headscope serve: HEADSCOPE_LOG_LEVEL 'verbose': one of critical"),
        ([], {"HEADSCOPE_DEVICE": "gpu"}, "headscope serve: --device / HEADSCOPE_DEVICE: device 'gpu'"),  # named
        ([], {"HEADSCOPE_EXTRA_MODELS": "[bad"}, "HEADSCOPE_EXTRA_MODELS: not a JSON list (expecting value at"),
        ([], {"HEADSCOPE_EXTRA_MODELS": '{"a": 1}'}, "HEADSCOPE_EXTRA_MODELS: not a JSON list: write"),
        ([], {"HEADSCOPE_DOCS_URL": "x" * 501}, "at most 500 characters (got 'xxxxxxxxxx"),  # the value cut
    ],
)
def test_serve_refuses_a_bad_setting_in_one_line_before_starting(argv, env, said, capsys, monkeypatch):
    """Out of range or not there: the flag and its variable named, exit 2, no traceback and no
    start-up (a port out of range was a traceback from the port check; a bad device, uvicorn's
    failed start-up; a pool of -1, a server that refused every request)."""
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert headscope_cli.main(["serve", "--no-fetch", *argv]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and said in lines[0], err
    assert "Traceback" not in err and "pydantic.dev" not in err and len(lines[0]) < 400, err


@pytest.mark.parametrize(
    "argv, said",
    [
        (["--actors", "0"], "--actors must be at least 1"),  # 0 was the default, silently; -1 Ray's own words
        (["--actors", "-1"], "--actors must be at least 1"),
    ],
)
def test_survey_refuses_a_bad_flag_in_one_line(tmp_path, argv, said, capsys):
    cat = str(SAMPLES / "cat.png")
    assert headscope_cli.main(["survey", cat, "--out", str(tmp_path / "s.parquet"), "--quiet", *argv]) == 2
    err = capsys.readouterr().err
    assert f"headscope survey: {said}" in err and "Traceback" not in err, err


def test_a_class_target_on_the_saliency_model_names_the_surveys_own_targets(tmp_path, capsys):
    cat = str(SAMPLES / "cat.png")
    out = str(tmp_path / "s.parquet")
    argv = ["survey", cat, "--out", out, "--quiet", "--faithfulness", "chefer", "--target", "top"]
    assert headscope_cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "headscope survey: --target: target 'top' is for" in err, err
    assert "the survey also takes region (the default" in err, err


def test_a_place_where_no_folder_can_be_made_is_said_before_the_work(tmp_path, capsys):
    """/proc takes no new folders, even from root (whom os.access lets through): said at once, in
    the words extract uses, not as the errno of a mkdir after the pictures were computed."""
    cat = str(SAMPLES / "cat.png")
    assert headscope_cli.main(["survey", cat, "--out", "/proc/headscope-test.parquet", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "cannot write /proc/headscope-test.parquet: cannot make folders in /proc" in err, err
    assert "Errno" not in err


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_extract_of_a_missing_path_fails_before_loading_the_model(tmp_path):
    # The model id cannot load: had extract loaded it first, the error would name the model. Nor are
    # torch and timm imported: a mistyped path is said at once, not after their seconds of importing.
    out = ["--out", str(tmp_path / "o.safetensors"), "--model", "timm:nope"]
    r = cli("extract", str(tmp_path / "nope.png"), *out, say_imports=True)
    assert r.returncode == 2
    assert r.stderr.strip() == f"headscope extract: no such file or folder: {tmp_path / 'nope.png'}"
    assert json.loads(r.stdout.splitlines()[-1]) == []
    url = "https://example.org/cat.png"  # named as given ("https:/..." once read as a path), and why
    r = cli("extract", url, *out, say_imports=True)
    assert r.returncode == 2
    assert r.stderr.strip() == f"headscope extract: {url}: a URL; extract reads files and folders: download it first"
    assert json.loads(r.stdout.splitlines()[-1]) == []
    (tmp_path / "o.safetensors").write_bytes(b"precious")  # and an --out it would replace
    r = cli("extract", str(SAMPLES / "cat.png"), *out, say_imports=True)
    assert r.returncode == 2 and "pass --force to replace it" in r.stderr
    assert json.loads(r.stdout.splitlines()[-1]) == []
    assert (tmp_path / "o.safetensors").read_bytes() == b"precious"


@pytest.mark.surveys  # a whole survey or extract run (a model load, every picture): make test-long
def test_extract_swin_asks_for_one_stage(tmp_path):
    out = tmp_path / "swin.safetensors"
    model = ["--model", "random:swin_tiny_patch4_window7_224"]
    r = cli("extract", str(SAMPLES / "cat.png"), "--out", str(out), *model, "--layers", "0-3", "--query", "patch:1,1")
    assert r.returncode == 2 and "stage 0 = layers 0-1" in r.stderr and "Traceback" not in r.stderr
    # every layer, the default: one tensor per stage (it was refused as layers of four stages)
    r = cli("extract", str(SAMPLES / "cat.png"), "--out", str(out), *model, "--query", "patch:1,1")
    assert r.returncode == 0, r.stderr
    with safe_open(str(out), "np") as f:
        meta = json.loads(f.metadata()["images"])
        shapes = [f.get_tensor(k).shape for k in sorted(f.keys())]
    assert [m["tokens"]["stage"] for m in meta.values()] == [0, 1, 2, 3]
    assert [m["layers"] for m in meta.values()] == [[0, 1], [2, 3], [4, 5, 6, 7, 8, 9], [10, 11]]
    assert shapes == [(2, 3, 1, 56 * 84), (2, 6, 1, 28 * 42), (6, 12, 1, 14 * 21), (2, 24, 1, 7 * 11)]
    r = cli("extract", str(SAMPLES / "cat.png"), "--out", str(out), *model, "--layers", "2-3", "--query", "patch:27,0",
            "--force")  # fmt: skip
    assert r.returncode == 0, r.stderr
    (t,) = load_file(str(out)).values()
    assert t.shape == (2, 6, 1, 28 * 42) and ((t > 0).sum(-1) <= 49).all()
    with open(out, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        meta = json.loads(json.loads(f.read(n))["__metadata__"]["images"])
    (m,) = meta.values()
    assert m["tokens"]["grid"] == [28, 42] and m["tokens"]["stage"] == 1 and m["query"] == [27 * 42]
