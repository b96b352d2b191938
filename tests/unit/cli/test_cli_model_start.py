"""`headscope serve` with a model that cannot load (issue 41), offline: a typo gets the nearest
names, an unsupported family the supported ones (and no `local:` hint for it), weights that are
neither cached nor downloadable say so; with no model left to serve it exits non-zero at once,
and a model that fails only while loading stops the server with a non-zero exit too. With
another model that loads, the server serves that one and says which failed and why."""

from __future__ import annotations

import os

import httpx
import pytest
import torch
from safetensors.torch import save_file

from headscope.zoo.preflight import preflight
from headscope.zoo.suggest import nearest
from helpers.cli import run_cli as run
from helpers.server import ROOT, SAMPLES, Server, free_port

CLI_TIMEOUT_S = 600
pytestmark = pytest.mark.timeout(3 * CLI_TIMEOUT_S)
TYPO = "timm:vit_smal_patch16_224.augreg_in21k"


@pytest.fixture
def offline(tmp_path) -> dict[str, str]:
    """No hub and an empty Hugging Face cache: nothing is downloaded, nothing is cached."""
    return {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "HEADSCOPE_EXTRA_MODELS": ""}


def serve(*args: str, env: dict[str, str]):
    return run("serve", "--port", str(free_port()), "--no-fetch", *args, env=env)


def test_nearest_names_of_a_typo():
    assert nearest("vit_smal_patch16_224.augreg_in21k")[0] == "vit_small_patch16_224.augreg_in21k"
    assert "vit_small_patch16_224" in nearest("vit_smal_patch16_224")
    assert nearest("no_such_thing_at_all") == []


def test_preflight_finds_a_misspelt_open_clip_tag_and_ids_without_a_name(caplog):
    """``open_clip:ViT-B-32/nosuch`` passed the start-up check and failed when it loaded (fetch
    said it at once); ``random:`` was "timm has no architecture named ''"; and checking a
    pretrained open_clip model logged open_clip's "initialized randomly" on the terminal."""
    pytest.importorskip("open_clip")
    models = ROOT / "models"
    why, permanent = preflight("open_clip:ViT-B-32/nosuch", models)
    assert permanent and why.startswith("open_clip has no pretrained weights 'nosuch' for ViT-B-32 (it has: openai")
    with caplog.at_level("WARNING"):
        preflight("open_clip:ViT-B-32/openai", models)
    assert not [r for r in caplog.records if "initialized randomly" in r.getMessage()], caplog.text
    assert preflight("random:", models) == ("'random:': the model's name is missing; write random:ARCH", True)
    assert preflight("x=", models)[0] == "'x=': NAME=SPEC needs the model after '=', e.g. x=timm:NAME"


def test_preflight_says_what_stops_each_model(tmp_path):
    models = ROOT / "models"
    why, permanent = preflight(TYPO, models)
    assert permanent and "Did you mean vit_small_patch16_224" in why
    why, permanent = preflight("resnet50.a1_in1k", models)
    assert permanent and "supported families: vit, deit" in why and "dinov2" in why and "local:" not in why
    why, permanent = preflight(f"local:test_vit@{tmp_path / 'absent.safetensors'}", models)
    assert permanent and why == "the weights file absent.safetensors is not there"  # no server path
    assert preflight("random:test_vit", models) is None
    assert preflight("dinov2-s14-focus", models) is None


@pytest.mark.lifecycle  # a serve process that refuses to start (its imports, 5 s): make test-long
def test_a_typo_exits_non_zero_with_the_nearest_names(offline):
    r = serve("--model", TYPO, env=offline)
    assert r.returncode == 1, r.stderr
    said = f"headscope serve: model {TYPO} cannot load: timm has no architecture named 'vit_smal_patch16_224'"
    assert said in r.stderr
    assert "Did you mean vit_small_patch16_224" in r.stderr
    assert "no model to serve" in r.stderr and "Traceback" not in r.stderr
    assert "Uvicorn running" not in r.stderr  # refused before the server started


@pytest.mark.lifecycle  # a serve process that refuses to start (its imports, 5 s): make test-long
def test_an_unsupported_family_names_the_supported_ones(offline):
    r = serve("--model", "resnet50.a1_in1k", env=offline)
    assert r.returncode == 1, r.stderr
    assert "ResNet has no transformer 'blocks'" in r.stderr
    assert "supported families: vit, deit (incl. distilled), dinov2" in r.stderr and "siglip" in r.stderr
    assert "local:resnet50" not in r.stderr  # not a family a local file could serve either


@pytest.mark.lifecycle  # a serve process that refuses to start (its imports, 5 s): make test-long
def test_weights_neither_cached_nor_reachable_say_so(offline):
    r = serve("--model", "timm:vit_tiny_patch16_224.augreg_in21k", env=offline)
    assert r.returncode == 1, r.stderr
    assert "HF_HUB_OFFLINE=1" in r.stderr and "not in its Hugging Face cache" in r.stderr
    assert "headscope fetch timm:vit_tiny_patch16_224.augreg_in21k" in r.stderr


@pytest.mark.lifecycle
def test_a_model_that_fails_while_loading_stops_the_server(offline, tmp_path):
    wrong = tmp_path / "wrong.safetensors"
    save_file({"not_a_vit": torch.zeros(2)}, str(wrong))  # passes the checks, fails to load
    r = serve("--model", f"local:test_vit@{wrong}", env=offline)
    assert r.returncode == 1, r.stderr
    assert "headscope serve: no model could be loaded" in r.stderr and "does not fit test_vit" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.lifecycle
def test_with_another_model_the_server_serves_it_and_says_which_failed(offline):
    uncached = "timm:vit_tiny_patch16_224.augreg_in21k"  # may load later (the hub may answer): not refused
    srv = Server(offline, args=["--model", TYPO, "--model", "random:test_vit", "--model", uncached, "--no-fetch"])
    try:
        ready = httpx.get(f"{srv.url}/readyz", timeout=30).json()
        assert ready == {"status": "ready", "model": "random:test_vit"}
        models = httpx.get(f"{srv.url}/api/v1/models", timeout=30).json()
        assert models["default"] == "random:test_vit"
        failed = {m["id"]: m["error"] for m in models["models"] if m["error"]}
        assert list(failed) == [TYPO, uncached] and "Did you mean vit_small_patch16_224" in failed[TYPO]
        # what the terminal said of it, also in the list (it was null until someone asked for it)
        assert "not in its Hugging Face cache" in failed[uncached]
        # the page names the default it serves (its notice lists the failed model from the list above)
        page = httpx.get(f"{srv.url}/", timeout=30).text
        assert 'data-default-model="random:test_vit"' in page and 'data-testid="model-failures"' in page
        # asking for the failed model: its reason at once, not a 503 to try again
        with open(SAMPLES / "cat.png", "rb") as f:
            r = httpx.post(f"{srv.url}/api/v1/attention", data={"model": TYPO}, files={"image": f}, timeout=120)
        assert r.status_code == 422, r.text
        err = r.json()["error"]
        assert err["code"] == "model_refused" and "Did you mean" in err["message"]
    finally:
        assert srv.stop() == 0
    assert "Traceback" not in srv.log()
    assert os.path.exists(srv.log_path)


@pytest.mark.lifecycle  # a serve process that refuses to start (its imports, 5 s): make test-long
def test_two_weights_files_of_one_name_are_refused_with_the_way_to_name_them(offline, tmp_path):
    # Both had the id local:test_vit@model.safetensors: the second was dropped, and nothing said so.
    specs = []
    for side in ("a", "b"):
        (tmp_path / side).mkdir()
        specs += ["--model", f"local:test_vit@{tmp_path / side / 'model.safetensors'}"]
    r = serve(*specs, env=offline)
    assert r.returncode == 2, r.stderr
    assert "two models have the id local:test_vit@model.safetensors" in r.stderr
    assert (
        "give each an id of its own, NAME=SPEC (e.g. other=local:ARCH@/path" in r.stderr and "Traceback" not in r.stderr
    )
