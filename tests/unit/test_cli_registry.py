"""The command line and the model registry (local checkpoints, ids, offline errors)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import timm
import torch
from safetensors.torch import load_file, save_file

from app.zoo.errors import ModelLoadError, UnknownModelError
from app.zoo.ids import ModelSpec
from app.zoo.registry import Registry
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


@pytest.mark.parametrize("suffix", [".safetensors", ".pth"])
def test_local_checkpoint(tmp_path, suffix):
    torch.manual_seed(0)
    src = timm.create_model("vit_small_patch16_224", pretrained=False, depth=2, num_classes=0)
    sd = {k: v.contiguous() for k, v in src.state_dict().items()}
    path = tmp_path / f"w{suffix}"
    save_file(sd, str(path)) if suffix == ".safetensors" else torch.save(sd, path)
    reg = Registry([f"local:vit_small_patch16_224@{path}"], tmp_path)
    assert reg.ids == [f"local:vit_small_patch16_224@w{suffix}"]  # no server path in the id
    with pytest.raises((ModelLoadError, RuntimeError)):  # depth 12 architecture, depth 2 weights
        reg.get()
    reg2 = Registry([f"tiny=local:vit_small_patch16_224@{path}"], tmp_path)
    assert reg2.ids == ["tiny"]
    with pytest.raises(UnknownModelError):
        reg2.get("local:vit_small_patch16_224@/etc/passwd")


def test_public_ids():
    spec = ModelSpec.parse("local:vit_base_patch16_224@/secret/dir/w.safetensors")
    assert (spec.id, spec.source, spec.arch, str(spec.path)) == (
        "local:vit_base_patch16_224@w.safetensors",
        "local",
        "vit_base_patch16_224",
        "/secret/dir/w.safetensors",
    )
    assert ModelSpec.parse("mine=timm:vit_base_patch16_224") == ModelSpec("mine", "timm-hub", "vit_base_patch16_224")
    assert ModelSpec.parse("timm:eva02_base_patch14_224").id == "timm:eva02_base_patch14_224"
    assert ModelSpec.parse("dinov2-s14-focus").source == "embedded"
    with pytest.raises(UnknownModelError):
        ModelSpec.parse("local:vit_base_patch16_224")  # no weights file


def test_random_model_of_a_supported_family_loads(tmp_path):
    lm = Registry(["random:test_vit"], tmp_path).get()
    assert lm.num_layers == len(lm.model.blocks) and lm.prefix == ["cls"]


@pytest.mark.parametrize("suffix", [".safetensors", ".pt"])
def test_local_checkpoint_loads_the_given_weights(tmp_path, suffix):
    torch.manual_seed(3)
    src = timm.create_model("test_vit", pretrained=False, num_classes=0)
    sd = {k: v.contiguous() for k, v in src.state_dict().items()}
    path = tmp_path / f"w{suffix}"
    save_file(sd, str(path)) if suffix == ".safetensors" else torch.save({"state_dict": sd}, path)
    lm = Registry([f"local:test_vit@{path}"], tmp_path).get()
    for k, v in lm.model.state_dict().items():
        assert torch.equal(v, sd[k]), k
