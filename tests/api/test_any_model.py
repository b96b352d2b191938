"""Any timm model from the page (issue 30): `--model` repeated, the catalogue, loads with progress,
an unreachable hub, and the least recently used model unloaded. Against real servers.

The hub is a local stand-in (tests/helpers/hub_standin.py): a prepared Hugging Face cache folder and a
small file server on 127.0.0.1 that the server reaches through HF_ENDPOINT; stopping it makes
the hub unreachable. Nothing leaves the machine.
"""

from __future__ import annotations

import json

import httpx
import pytest

from helpers.hub_standin import StandInHub, prepare_cache, weights
from helpers.server import HTTP_TIMEOUT, SAMPLES, Server
from helpers.waiting import wait_until

CACHED = "test_vit.r160_in1k"  # in the prepared cache from the start
DOWNLOADED = "test_vit3.r160_in1k"  # served by the stand-in hub
MISSING = "test_vit2.r160_in1k"  # neither
DEFAULT = "random:test_vit"


@pytest.fixture(scope="module")
def hub():
    h = StandInHub({f"timm/{DOWNLOADED}/model.safetensors": weights(DOWNLOADED, seed=3)}, seconds=3.0)
    yield h
    h.stop()


@pytest.fixture(scope="module")
def server(tmp_path_factory, hub):
    root = tmp_path_factory.mktemp("hf")
    prepare_cache(root / "hub", CACHED, weights(CACHED, seed=1))
    env = {
        "HF_HOME": str(root / "home"),
        "HF_HUB_CACHE": str(root / "hub"),
        "HF_ENDPOINT": hub.url,
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HEADSCOPE_MODEL": DEFAULT,
        "HEADSCOPE_ANY_MODEL": "1",
        "HEADSCOPE_MAX_LOADED_MODELS": "2",
    }
    srv = Server(env)
    yield srv
    srv.stop_cleanly()


def models(url: str) -> dict[str, dict]:
    body = httpx.get(url + "/api/v1/models", timeout=HTTP_TIMEOUT).json()
    return {m["id"]: m for m in body["models"]}


def wait_ready(url: str, name: str, pace, seen: list[dict] | None = None) -> dict:
    seen = [] if seen is None else seen

    def ended() -> dict | None:
        seen.append(httpx.get(f"{url}/api/v1/models/catalog/{name}/load", timeout=HTTP_TIMEOUT).json())
        return seen[-1] if seen[-1]["state"] in ("ready", "failed") else None

    return wait_until(ended, pace.s(120), f"{name} to load")


def attention(url: str, model: str) -> httpx.Response:
    with open(SAMPLES / "cat.png", "rb") as f:
        return httpx.post(
            url + "/api/v1/attention",
            files={"image": ("cat.png", f, "image/png")},
            data={"model": model, "layers": "-1", "query": "0"},  # test_vit2/3 have no CLS token
            timeout=HTTP_TIMEOUT,
        )


def test_model_repeated_offers_every_id_and_the_first_is_the_default(server_factory):
    srv = server_factory(
        {"HEADSCOPE_EXTRA_MODELS": json.dumps(["random:test_vit3"]), "HEADSCOPE_MODEL": "dinov2-s14-focus"},
        args=["--model", "random:test_vit", "--model", "random:test_vit2"],
    )
    body = httpx.get(srv.url + "/api/v1/models", timeout=HTTP_TIMEOUT).json()
    assert body["default"] == "random:test_vit"
    assert [m["id"] for m in body["models"]] == ["random:test_vit", "random:test_vit2", "random:test_vit3"]
    assert body["any_model"] is False
    r = attention(srv.url, "random:test_vit2")
    assert r.status_code == 200 and r.json()["model"] == "random:test_vit2"
    # Off by default: the catalogue says how to switch it on, in the one error body.
    r = httpx.get(srv.url + "/api/v1/models/catalog", params={"q": "vit"}, timeout=HTTP_TIMEOUT)
    assert r.status_code == 403 and r.json()["error"]["code"] == "any_model_off"
    assert "--any-model" in r.json()["error"]["message"]
    r = httpx.post(srv.url + f"/api/v1/models/catalog/{CACHED}/load", timeout=HTTP_TIMEOUT)
    assert r.status_code == 403


def test_catalogue_lists_supported_families_only(server):
    get = lambda **p: httpx.get(server.url + "/api/v1/models/catalog", params=p, timeout=HTTP_TIMEOUT)
    body = get(q="test_vit").json()
    assert [m["name"] for m in body["models"]] == [CACHED, MISSING, DOWNLOADED]
    assert [m["cached"] for m in body["models"]] == [True, False, False]
    assert {m["family"] for m in body["models"]} == {"vit"} and body["models"][0]["id"] == f"timm:{CACHED}"
    assert get(q="resnet50").json()["total"] == 0  # timm has it, Headscope cannot capture it
    assert get(q="vit_base_patch16_rope").json()["total"] == 0  # a supported module, unsupported attention
    swin = get(q="swinv2 tiny").json()
    assert swin["total"] >= 1 and all(m["family"] == "swinv2" for m in swin["models"])
    some = get(q="vit", limit=3).json()
    assert len(some["models"]) == 3 and some["total"] > 100
    exact = get(q="vit_small_patch14_dinov2.lvd142m").json()
    assert exact["models"][0]["name"] == "vit_small_patch14_dinov2.lvd142m"
    r = get(limit=0)
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_parameter"


def test_names_only_never_a_url_or_a_path(server, hub):
    before = list(hub.requests)
    for name in ["resnet50.a1_in1k", "VIT_SMALL_PATCH16_224.AUGREG_IN21K", "..", "x" * 100, "vit@main", "a%3Ab"]:
        r = httpx.post(f"{server.url}/api/v1/models/catalog/{name}/load", timeout=HTTP_TIMEOUT)
        assert r.status_code == 404 and r.json()["error"]["code"] in ("unknown_model", "not_found"), (name, r.text)
    for path in ["https:%2F%2Fexample.com%2Fw.safetensors", "..%2F..%2Fetc%2Fpasswd", "timm%2Fvit"]:
        r = httpx.post(f"{server.url}/api/v1/models/catalog/{path}/load", timeout=HTTP_TIMEOUT)
        assert r.status_code == 404, (path, r.text)
    r = attention(server.url, f"timm:{DOWNLOADED}")  # not offered until loaded: no download by the back door
    assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_model"
    assert hub.requests == before, "a refused name reached the hub"


def test_load_shows_download_progress_then_the_model_is_offered(server, hub, pace):
    r = httpx.post(f"{server.url}/api/v1/models/catalog/{DOWNLOADED}/load", timeout=HTTP_TIMEOUT)
    assert r.status_code == 202 and r.json()["state"] in ("queued", "downloading")
    again = httpx.post(f"{server.url}/api/v1/models/catalog/{DOWNLOADED}/load", timeout=HTTP_TIMEOUT)
    assert again.status_code == 202  # joins the load under way
    seen: list[dict] = []
    st = wait_ready(server.url, DOWNLOADED, pace, seen)
    assert st["state"] == "ready", st
    size = len(hub.files[f"timm/{DOWNLOADED}/model.safetensors"])
    assert st["bytes_done"] == st["bytes_total"] == size and st["fraction"] == 1.0
    partial = [s for s in seen if s["state"] == "downloading" and s["bytes_total"] and 0 < s["bytes_done"] < size]
    assert partial, [(s["state"], s["bytes_done"]) for s in seen]
    gets = [s for s in hub.requests if s.startswith("GET")]
    assert gets == [f"GET /timm/{DOWNLOADED}/resolve/main/model.safetensors"]  # once, though asked twice
    m = models(server.url)[f"timm:{DOWNLOADED}"]
    assert m["loaded"] and m["on_demand"] and m["layers"] == 9 and m["heads"] == 3
    r = attention(server.url, f"timm:{DOWNLOADED}")
    assert r.status_code == 200, r.text
    assert r.json()["model"] == f"timm:{DOWNLOADED}" and r.json()["shape"][:2] == [1, 3]


def st_text(url: str, name: str) -> str:
    return httpx.get(f"{url}/api/v1/models/catalog/{name}/load", timeout=HTTP_TIMEOUT).text.replace(" ", "")


def test_unreachable_hub_is_a_clear_503_and_cached_models_still_load(server, hub, pace):
    hub.stop()  # from here on the hub refuses connections
    r = httpx.post(f"{server.url}/api/v1/models/catalog/{MISSING}/load", timeout=HTTP_TIMEOUT)
    assert r.status_code == 503, r.text
    err = r.json()["error"]
    assert err["code"] == "hub_unreachable" and "cannot be reached" in err["message"] and MISSING in err["message"]
    # Refused at the request, not after a download attempt; a client polling the load is told why.
    st = httpx.get(f"{server.url}/api/v1/models/catalog/{MISSING}/load", timeout=HTTP_TIMEOUT).json()
    assert st["state"] == "failed" and st["error"] == {"code": err["code"], "message": err["message"]}, st
    assert '"seconds":0.0' in st_text(server.url, MISSING)  # no time spent (it read -0.0)
    assert f"timm:{MISSING}" not in models(server.url)
    # The prepared cache needs no hub; it is the third model, so the least recently used goes.
    r = httpx.post(f"{server.url}/api/v1/models/catalog/{CACHED}/load", timeout=HTTP_TIMEOUT)
    assert r.status_code == 202
    assert wait_ready(server.url, CACHED, pace)["state"] == "ready"
    ms = models(server.url)
    assert ms[f"timm:{CACHED}"]["loaded"] and ms[DEFAULT]["loaded"]  # the default is never unloaded
    assert not ms[f"timm:{DOWNLOADED}"]["loaded"]  # unloaded, still offered
    # Asked for again, it loads from the cache (the hub is down) and the other one goes.
    r = attention(server.url, f"timm:{DOWNLOADED}")
    assert r.status_code == 200, r.text
    ms = models(server.url)
    assert ms[f"timm:{DOWNLOADED}"]["loaded"] and ms[DEFAULT]["loaded"] and not ms[f"timm:{CACHED}"]["loaded"]
    assert sum(m["loaded"] for m in ms.values()) == 2


def test_open_clip_models_are_in_the_catalogue_and_refused_clearly_offline(server, hub):
    """open_clip's pretrained ViTs are catalogue entries (issue 42): listed, found by words of their
    id, looked up by ARCH/PRETRAINED (its '/' as is or as %2F), and, not cached with the hub down,
    refused at once with the usual sentence (no download: the stand-in hub is stopped by now)."""
    pytest.importorskip("open_clip")
    hub.stop()
    get = lambda **p: httpx.get(server.url + "/api/v1/models/catalog", params=p, timeout=HTTP_TIMEOUT).json()
    body = get(q="open_clip", limit=500)
    assert body["note"] is None and body["total"] == len(body["models"]) > 50
    rows = {m["name"]: m for m in body["models"]}
    assert rows["ViT-B-32/openai"]["id"] == "open_clip:ViT-B-32/openai" and rows["ViT-B-32/openai"]["family"] == "clip"
    assert rows["ViT-B-16-SigLIP/webli"]["family"] == "siglip"
    assert not any(n.startswith(("RN50", "coca_", "convnext", "EVA", "PE-Core")) or "CLIPA" in n for n in rows)
    assert all(m["id"].startswith("open_clip:") and not m["offered"] and not m["cached"] for m in body["models"])
    siglip = get(q="siglip b-16 webli")
    assert siglip["total"] >= 5 and all(m["family"] == "siglip" for m in siglip["models"])
    for name in ["ViT-B-32%2Fopenai", "ViT-B-32/openai"]:
        r = httpx.post(f"{server.url}/api/v1/models/catalog/{name}/load", timeout=HTTP_TIMEOUT)
        assert r.status_code == 503, r.text
        err = r.json()["error"]
        assert err["code"] == "hub_unreachable" and "ViT-B-32/openai" in err["message"]
        assert "open_clip:ViT-B-32 (the same model with random weights)" in err["message"]
        st = httpx.get(f"{server.url}/api/v1/models/catalog/{name}/load", timeout=HTTP_TIMEOUT).json()
        assert st["state"] == "failed" and st["id"] == "open_clip:ViT-B-32/openai", st
        assert st["error"]["code"] == "hub_unreachable", st
    for bad in ["ViT-B-32%2Fnosuchtag", "NoSuchArch%2Fopenai", "RN50%2Fopenai", "ViT-B-32%2Fopenai%2Fx"]:
        r = httpx.post(f"{server.url}/api/v1/models/catalog/{bad}/load", timeout=HTTP_TIMEOUT)
        assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_model", (bad, r.text)
    assert "open_clip:ViT-B-32/openai" not in models(server.url)
