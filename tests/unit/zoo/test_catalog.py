"""The catalogue of models a page may load (issue 30): timm's pretrained list cut to what Headscope
captures; names only; the least recently used model unloaded beyond the bound."""

from __future__ import annotations

import os
import re

import pytest
import torch

from headscope.engine.block_capture import UnsupportedModelError
from headscope.zoo import catalog, loaders
from headscope.zoo.errors import UnknownModelError
from headscope.zoo.ids import ModelSpec
from headscope.zoo.registry import Registry


def builds_and_captures(name: str) -> bool:
    """Whether the architecture, built on the meta device (no weights), has attention Headscope captures."""
    try:
        with torch.device("meta"):
            model, dynamic = loaders._create(name, pretrained=False)
        loaders._finish(ModelSpec.parse(f"random:{name}"), model, dynamic)
        return True
    except UnsupportedModelError:
        return False


def test_catalogue_holds_supported_families_on_the_hub_only():
    import timm

    entries = catalog.entries()
    assert len(entries) > 300
    assert {e.family for e in entries.values()} == set(catalog.FAMILIES.values())
    assert all(e.repo and name in timm.list_models(pretrained=True) for name, e in list(entries.items())[:50])
    for name in [
        "resnet50.a1_in1k",
        "convnext_tiny.fb_in1k",
        "xcit_tiny_12_p16_224.fb_in1k",
        "cait_xxs24_224.fb_dist_in1k",
    ]:
        assert name not in entries  # other families, or attention Headscope cannot capture
    assert "vit_small_patch14_reg4_dinov2.lvd142m" in entries and "swinv2_tiny_window8_256.ms_in1k" in entries


def test_excluded_names_cannot_be_captured_and_a_sample_of_the_rest_can():
    import timm
    from timm.models import get_arch_name
    from timm.models._registry import _model_to_module

    excluded = [
        n
        for n in timm.list_models(pretrained=True)
        if _model_to_module.get(get_arch_name(n)) in catalog.FAMILIES and n not in catalog.entries()
    ]
    first_per_pattern = {p: next(n for n in excluded if re.search(p, n)) for p in catalog.UNSUPPORTED_PATTERNS}
    for name in first_per_pattern.values():
        assert not builds_and_captures(name), name
    sample = {}
    for name, e in catalog.entries().items():  # the first of each family, and every prefix in small steps
        sample.setdefault(e.family, name)
        sample.setdefault(name.split("_")[0], name)
    for name in sample.values():
        assert builds_and_captures(name), name


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("HEADSCOPE_SLOW") != "1", reason="HEADSCOPE_SLOW=1: every architecture, minutes")
def test_every_catalogue_model_can_be_captured():
    failed = [n for n in catalog.entries() if not builds_and_captures(n)]
    assert not failed, failed


def test_lookup_takes_names_only():
    assert catalog.lookup("timm:test_vit.r160_in1k").name == "test_vit.r160_in1k"
    for bad in [
        "",
        "resnet50.a1_in1k",
        "https://huggingface.co/timm/x",
        "../etc/passwd",
        "timm/test_vit.r160_in1k",
        "test_vit.r160_in1k@main",
        "TEST_VIT.R160_IN1K",
        "local:test_vit@/tmp/w.safetensors",
    ]:
        with pytest.raises(UnknownModelError):
            catalog.lookup(bad)


def test_search_orders_exact_then_prefix_then_name():
    total, hits = catalog.search("vit_small_patch16_224.augreg_in21k", 5)
    assert hits[0].name == "vit_small_patch16_224.augreg_in21k"
    total, hits = catalog.search("test vit", 10)
    assert [e.name for e in hits] == ["test_vit.r160_in1k", "test_vit2.r160_in1k", "test_vit3.r160_in1k"]
    total, hits = catalog.search("", 7)
    assert len(hits) == 7 and total == len(catalog.entries()) + len(catalog.open_clip_entries() or {})
    assert all(e.source == "timm" for e in hits)  # timm's first, then open_clip's (issue 42)
    if catalog.open_clip_entries():
        total, hits = catalog.search("b-32 openai", 10)
        assert {e.name for e in hits} == {"ViT-B-32/openai", "ViT-B-32-quickgelu/openai"} and total == 2


def test_registry_unloads_the_least_recently_used_but_never_the_default(tmp_path):
    reg = Registry(["random:test_vit", "random:test_vit2"], tmp_path, max_loaded=2)
    reg.get()
    reg.get("random:test_vit2")
    mid = reg.offer("random:test_vit3")
    assert reg.ids[-1] == mid and reg.info()[-1]["on_demand"]
    reg.get(mid)  # a third: test_vit2 (least recently used, not the default) goes
    assert [reg.is_loaded(m) for m in reg.ids] == [True, False, True] and reg.unloaded == 1
    reg.loaded("random:test_vit")  # a use of the default changes nothing: it is never unloaded
    reg.get("random:test_vit2")  # back (from its source): test_vit3 goes
    assert [reg.is_loaded(m) for m in reg.ids] == [True, True, False]
    assert reg.ids == ["random:test_vit", "random:test_vit2", mid]  # still offered
    reg.withdraw("random:test_vit2")  # configured: stays
    reg.withdraw(mid)
    assert reg.ids == ["random:test_vit", "random:test_vit2"]


def test_open_clip_vits_are_catalogue_entries_and_absent_without_the_extra(monkeypatch):
    """open_clip's pretrained ViTs (issue 42): ViT towers only, each buildable and captured (a
    sample of the architectures on the meta device); without open_clip, none and a note."""
    pytest.importorskip("open_clip")
    oc = catalog.open_clip_entries()
    assert oc is not None and len(oc) > 50
    e = catalog.lookup("open_clip:ViT-B-32/openai")
    assert e is catalog.lookup("ViT-B-32/openai") and e.model_id == "open_clip:ViT-B-32/openai"
    assert (e.family, e.source, e.repo) == ("clip", "open_clip", "timm/vit_base_patch32_clip_224.openai")
    assert catalog.lookup("ViT-B-16-SigLIP/webli").family == "siglip"
    hybrid = "MobileCLIP-B/datacompdr"  # a convolutional stem feeds its ViT: refused by loaders, so not offered
    for bad in [
        "ViT-B-32/nosuchtag",
        "RN50/openai",
        "coca_ViT-B-32/laion2b_s13b_b90k",
        "ViT-B-32/openai/x",
        "/x",
        hybrid,
    ]:
        with pytest.raises(UnknownModelError):
            catalog.lookup(bad)
    archs = {}
    for name in oc:
        archs.setdefault(name.split("/")[0].split("-")[0] + ("SigLIP" if "SigLIP" in name else ""), name)
    for name in archs.values():
        loaders.skeleton(ModelSpec.parse("open_clip:" + name.split("/")[0]), None)  # raises if not captured
    assert catalog.parameter_count(e) > 100e6  # both towers, on the meta device

    import sys

    catalog.open_clip_entries.cache_clear()
    monkeypatch.setitem(sys.modules, "open_clip", None)  # the clip extra missing
    try:
        assert catalog.open_clip_entries() is None
        assert all(h.source == "timm" for h in catalog.search("", 500)[1])
        with pytest.raises(UnknownModelError, match=r"headscope\[clip\]"):
            catalog.lookup("ViT-B-32/openai")
    finally:
        catalog.open_clip_entries.cache_clear()
