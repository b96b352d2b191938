"""The model registry: local checkpoints, public ids, random models."""

from __future__ import annotations

import pytest
import timm
import torch
from safetensors.torch import save_file

from headscope.zoo.errors import ModelLoadError, UnknownModelError
from headscope.zoo.ids import ModelSpec
from headscope.zoo.registry import Registry


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


def test_random_weights_are_seed_0_and_leave_the_callers_random_stream_alone(tmp_path):
    torch.manual_seed(0)
    want = timm.create_model("test_vit", pretrained=False, num_classes=0, dynamic_img_size=True).state_dict()
    torch.manual_seed(123)
    torch.rand(2)
    lm = Registry(["random:test_vit"], tmp_path).get()
    after = torch.rand(2)
    torch.manual_seed(123)
    torch.rand(2)
    assert torch.equal(after, torch.rand(2))  # a notebook's stream goes on as if nothing was loaded
    for k, v in lm.model.state_dict().items():
        assert torch.equal(v, want[k]), k


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


def test_weights_of_another_model_size_are_one_line_that_says_so(tmp_path):
    """torch's own error for tensors of another shape is a line per tensor (150 for a ViT)."""
    src = timm.create_model("test_vit", pretrained=False, num_classes=0, embed_dim=32)
    path = tmp_path / "small.safetensors"
    save_file({k: v.contiguous() for k, v in src.state_dict().items()}, str(path))
    with pytest.raises(ModelLoadError) as e:
        Registry([f"local:test_vit@{path}"], tmp_path).get()
    message = str(e.value)
    assert "\n" not in message and len(message) < 400, message
    assert message.startswith("small.safetensors does not fit test_vit: ")
    assert "tensor(s) of another shape" in message and "[32]" in message


def test_loading_weights_leaves_the_callers_random_stream_alone():
    """Building a model for loaded weights still runs random initialisation (the embedded
    model's saliency decoder): a notebook's seeded stream goes on as if nothing was loaded
    (``torch.manual_seed(0); headscope.load(); torch.randn(3)``)."""
    from pathlib import Path

    torch.manual_seed(7)
    want = torch.randn(3)
    torch.manual_seed(7)
    Registry(["dinov2-s14-focus"], Path(__file__).resolve().parents[3] / "models").get()
    assert torch.equal(torch.randn(3), want)
