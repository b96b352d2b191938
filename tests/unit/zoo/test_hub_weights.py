"""A timm hub model whose weights cannot be had is said before anything is built: with the hub
out of reach and the weights not in the Hugging Face cache, ``load_timm_pretrained`` (``headscope
fetch timm:NAME``, ``extract --model``, the Python API) refuses before the build and its random
initialisation (20 s for a ViT-g on 2 cores). A cached model still loads offline, with the
cache's weights. The files looked for are the ones timm reads, in its order."""

from __future__ import annotations

import pytest
import torch
from huggingface_hub import constants
from safetensors.torch import load

from headscope.zoo import loaders
from headscope.zoo.catalog import CatalogEntry, hub_weights
from headscope.zoo.download import cached_weights, candidates
from headscope.zoo.errors import HubUnreachableError
from headscope.zoo.ids import ModelSpec
from helpers.hub_standin import prepare_cache, weights

NAME = "vit_tiny_patch16_224.augreg_in21k"


@pytest.fixture
def offline_cache(tmp_path, monkeypatch):
    """The hub unreachable, and a Hugging Face cache of our own (empty until a test fills it)."""
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    return cache


@pytest.fixture
def builds(monkeypatch):
    """The ``pretrained`` flag of every model ``load_timm_pretrained`` builds, in order."""
    seen: list[bool] = []
    create = loaders._create

    def spy(name, pretrained, **kwargs):
        seen.append(pretrained)
        return create(name, pretrained, **kwargs)

    monkeypatch.setattr(loaders, "_create", spy)
    return seen


def test_where_timm_reads_a_models_weights():
    tagged = hub_weights(NAME)
    assert tagged is not None and (tagged.repo, tagged.filename) == (f"timm/{NAME}", None)
    bare = hub_weights("vit_base_patch16_224")  # timm's default tag
    assert bare is not None and bare.repo == "timm/vit_base_patch16_224.augreg2_in21k_ft_in1k"
    assert hub_weights("vit_base_patch16_224.no_such_tag") is None
    assert hub_weights("gcvit_tiny.in1k") is None  # weights at a URL: only timm knows


def test_the_files_looked_for_are_timms_in_its_order():
    def files(filename, source="timm"):
        return candidates(CatalogEntry("m", "vit", "org/m", filename, source))

    assert files(None) == ("model.safetensors", "pytorch_model.bin")
    assert files("pytorch_model.bin") == ("model.safetensors", "pytorch_model.bin")
    assert files("open_clip_pytorch_model.bin") == ("open_clip_model.safetensors", "open_clip_pytorch_model.bin")
    assert files("weights.bin") == ("weights.safetensors", "weights.bin")
    assert files("weights.safetensors") == ("weights.safetensors",)
    assert files("weights.pth") == ("weights.pth",)  # no twin: timm reads it as named
    assert files(None, "open_clip") == ("open_clip_model.safetensors", "open_clip_pytorch_model.bin")


def test_unreachable_and_not_cached_is_said_before_any_build_with_weights(offline_cache, builds):
    with pytest.raises(HubUnreachableError) as e:
        loaders.load_timm_pretrained(ModelSpec.parse(f"timm:{NAME}"))
    said = str(e.value)
    assert "this machine runs with HF_HUB_OFFLINE=1" in said and "not in its Hugging Face cache" in said
    assert f"Put the weights there with `headscope fetch timm:{NAME}`" in said and "local:vit_tiny_patch16_224@" in said
    assert "Load a model that is cached" not in said  # the server's words, for a page that may pick another
    assert builds == [False]  # the family check on the meta device, and nothing after it


def test_a_cached_model_loads_offline_with_the_caches_weights(offline_cache, builds):
    data = weights(NAME, seed=3)
    path = prepare_cache(offline_cache, NAME, data)
    assert cached_weights(hub_weights(NAME)) == path
    lm = loaders.load_timm_pretrained(ModelSpec.parse(f"timm:{NAME}"))
    assert builds == [False, True]
    state = lm.model.state_dict()
    for key, value in load(data).items():
        assert torch.equal(state[key], value), key
