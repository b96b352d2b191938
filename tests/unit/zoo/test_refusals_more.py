"""Models Headscope must refuse, or fail on clearly, before weights load (a review's findings):

- hybrid ViTs (timm's ``HybridEmbed``: a CNN backbone feeds the tokens, so the patch grid is the
  feature map's, not the picture's) through every source, and any model whose layout's patch grid
  is not the grid its patch embedding makes;
- a pretrained tag timm does not know: one ``UnknownModelError`` (a ``ValueError``) with the
  nearest names, from every path, as ``headscope serve`` says it;
- ``open_clip:ARCH/PRETRAINED`` offline and not cached: ``HubUnreachableError`` at once, as
  ``timm:NAME`` gives, without open_clip's own ERROR log line; messages cut at whole words.

Random and meta-device weights only: nothing here needs the network.
"""

from __future__ import annotations

import logging

import pytest
import timm
import torch
from huggingface_hub import constants

import headscope
from headscope.engine.capture_base import UnsupportedModelError
from headscope.zoo import loaders, open_clip_models, preflight
from headscope.zoo.errors import HubUnreachableError, ModelLoadError, UnknownModelError
from headscope.zoo.ids import ModelSpec

HYBRIDS = ["vit_small_r26_s32_224", "vit_tiny_r_s16_p8_224"]
BAD_TAG = "vit_small_patch16_224.no_such_tag"


@pytest.fixture
def builds(monkeypatch):
    """The device (``meta`` or not) and ``pretrained`` flag of every model the loaders build."""
    seen: list[tuple[str, bool]] = []
    create = loaders._create

    def spy(name, pretrained, **kwargs):
        seen.append((torch.get_default_device().type, pretrained))
        return create(name, pretrained, **kwargs)

    monkeypatch.setattr(loaders, "_create", spy)
    return seen


def _refused_as_hybrid(e: pytest.ExceptionInfo) -> None:
    said = str(e.value)
    assert "CNN backbone" in said and "not the picture's" in said, said
    assert "\n" not in said


@pytest.mark.parametrize("arch", HYBRIDS)
def test_a_random_hybrid_vit_is_refused_before_any_weights(arch, builds):
    with pytest.raises(UnsupportedModelError) as e:
        loaders.build(ModelSpec.parse(f"random:{arch}"), None)
    _refused_as_hybrid(e)
    assert builds and all(device == "meta" for device, _ in builds), builds  # no random init computed


def test_a_pretrained_hybrid_vit_is_refused_before_any_download(builds, monkeypatch):
    monkeypatch.setattr(loaders, "hub_reachable", lambda: pytest.fail("the hub was asked"))
    with pytest.raises(UnsupportedModelError) as e:
        loaders.build(ModelSpec.parse("timm:vit_small_r26_s32_224.augreg_in21k_ft_in1k"), None)
    _refused_as_hybrid(e)
    assert builds == [("meta", False)]


def test_a_local_hybrid_vit_is_refused_before_its_file_is_read(tmp_path, monkeypatch):
    weights = tmp_path / "w.safetensors"
    weights.write_bytes(b"not read")
    monkeypatch.setattr(loaders, "load_state_file", lambda path: pytest.fail(f"{path} was read"))
    with pytest.raises(UnsupportedModelError) as e:
        loaders.build(ModelSpec.parse(f"local:vit_tiny_r_s16_p8_224@{weights}"), None)
    _refused_as_hybrid(e)


def test_a_hybrid_vit_is_refused_by_serves_check_and_the_python_api(tmp_path):
    why, permanent = preflight.preflight("random:vit_small_r26_s32_224", tmp_path)
    assert permanent and "CNN backbone" in why
    with pytest.raises(ValueError, match="CNN backbone"):
        headscope.load("random:vit_tiny_r_s16_p8_224", device="cpu")
    with torch.device("meta"):
        module = timm.create_model("vit_small_r26_s32_224", pretrained=False)
    with pytest.raises(ValueError, match="CNN backbone"):
        loaders.wrap_module(module)  # headscope.load(module) goes through it


def test_a_layout_whose_grid_is_not_the_models_is_refused():
    """Whatever the module: a patch size that does not make the patch embedding's own grid at the
    size the model was built for would put the tokens in the wrong places (and count them wrong)."""
    with torch.device("meta"):
        model = timm.create_model("vit_small_patch16_224", pretrained=False)
    assert loaders.wrap_module(model).patch_size == (16, 16)  # as built: its 14 x 14 grid
    model.patch_embed.patch_size = (8, 8)  # 28 x 28 cells by the layout; the model makes 14 x 14
    with pytest.raises(UnsupportedModelError) as e:
        loaders.wrap_module(model)
    said = str(e.value)
    assert "28x28" in said and "14x14" in said, said


@pytest.mark.parametrize("source", ["timm", "random"])
def test_a_pretrained_tag_timm_does_not_know_is_an_unknown_model_with_the_nearest(source, monkeypatch):
    monkeypatch.setattr(loaders, "hub_reachable", lambda: pytest.fail("the hub was asked"))
    spec = ModelSpec.parse(f"{source}:{BAD_TAG}")
    for load in (lambda: loaders.build(spec, None), lambda: loaders.skeleton(spec, None)):
        with pytest.raises(UnknownModelError) as e:
            load()
        said = str(e.value)
        assert said.startswith(f"timm cannot build '{BAD_TAG}' (RuntimeError: Invalid pretrained tag"), said
        assert f"Did you mean {source}:vit_small_patch16_224." in said, said
    with pytest.raises(ValueError, match="Did you mean"):  # the Python API's promise
        headscope.load(f"{source}:{BAD_TAG}", device="cpu")


def test_serve_says_the_same_of_a_bad_tag(tmp_path):
    why, permanent = preflight.preflight(f"timm:{BAD_TAG}", tmp_path)
    assert permanent and why.startswith(f"timm cannot build '{BAD_TAG}'") and "Did you mean timm:" in why


@pytest.fixture
def empty_offline_cache(tmp_path, monkeypatch):
    """The hub unreachable, and an empty Hugging Face cache of our own."""
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(open_clip_models, "hub_reachable", lambda: False)
    return cache


def test_open_clip_pretrained_offline_and_not_cached_fails_at_once(empty_offline_cache, monkeypatch, caplog):
    import open_clip

    monkeypatch.setattr(open_clip, "create_model", lambda *a, **k: pytest.fail("open_clip was asked to load"))
    with caplog.at_level(logging.INFO), pytest.raises(HubUnreachableError) as e:
        loaders.build(ModelSpec.parse("open_clip:ViT-B-32/openai"), None)
    said = str(e.value)
    assert "the weights of ViT-B-32/openai are not in its Hugging Face cache" in said, said
    assert "`headscope fetch open_clip:ViT-B-32/openai`" in said and "use open_clip:ViT-B-32 " in said
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_open_clip_failure_is_said_in_whole_words_without_open_clips_error_line(monkeypatch, caplog):
    """A failure we report ourselves: open_clip's own ERROR line for it stays off the terminal, and
    its message is cut at a whole word, not mid-word."""
    import open_clip

    long = "Failed to download weights for tag 'openai': " + " ".join(["unreachable"] * 40)

    def fails(*a, **k):
        logging.error(long)  # as open_clip's factory does, on the root logger
        raise RuntimeError(long)

    monkeypatch.setattr(open_clip, "create_model", fails)
    monkeypatch.setattr(open_clip_models, "hub_reachable", lambda: True)
    with caplog.at_level(logging.INFO), pytest.raises(ModelLoadError) as e:
        loaders.build(ModelSpec.parse("open_clip:ViT-B-32/openai"), None)
    said = str(e.value)
    inner = said[said.index("(RuntimeError: ") + len("(RuntimeError: ") : said.index(" …)")]
    assert inner.split()[-1] == "unreachable", said  # a whole word before the ellipsis
    assert not [r for r in caplog.records if "Failed to download" in r.getMessage()]
    logging.error("other ERROR lines still go through")
    assert [r for r in caplog.records if r.getMessage() == "other ERROR lines still go through"]


@pytest.mark.parametrize("spec", ["nope:xyz", "Timm:vit_small_patch16_224", "openclip:ViT-B-32"])
def test_an_unknown_model_source_is_named_not_blamed_on_timm(spec, tmp_path):
    """A prefix no source has is said to be one, with the forms there are (it was "timm has no
    model named 'nope:xyz'"), where the model is refused: a server configured with it besides a
    good one still starts (its Registry takes the id) and serves the other."""
    from headscope.zoo.registry import Registry

    with pytest.raises(UnknownModelError, match=r"has no model source .*; write timm:NAME, open_clip:") as e:
        headscope.load(spec, models_dir=tmp_path)
    assert "timm has no model" not in str(e.value)
    assert preflight.preflight(spec, tmp_path)[0] == str(e.value)
    assert Registry(["random:test_vit", spec], tmp_path).ids == ["random:test_vit", spec]
    assert ModelSpec.parse("timm:vit_small_patch16_224").source == "timm-hub"
