"""No answer leaves its arrays to Python's cycle collector.

Memory that only a reference cycle holds is freed at the next full collection, which in a server
with the model's half a million long-lived objects comes once in hundreds or thousands of
requests: a batch's captures held by such a cycle (the out-of-memory split's recursive closure)
took a soak's heap in use from 255 MB to over 1 GB, and a failed request's frames (a known error
kept in a local of a frame in its own traceback) held its picture and tensors.

The real server runs in this process (uvicorn on a thread, the random test model); the requests
come from another process, so that every object in this one is the server's. With the collector
off, each kind of request is made once, then the cyclic garbage is counted: none of it may be a
frame, or a tensor, or be all that holds an array or a buffer."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path
from types import FrameType

import httpx
import numpy as np
import torch
import uvicorn

from headscope.config import Settings
from headscope.web.main import create_app
from helpers.api import fresh_png
from helpers.server import free_port
from helpers.waiting import wait_until

MODEL = "random:test_vit"

# The client: every kind of request once (uploads in each format, with heads removed, failing on
# the worker and out of memory; the follow-ups; the long computations), their statuses as JSON.
CLIENT = r"""
import json, sys
import httpx
url, iid, tests = sys.argv[1:4]
sys.path.insert(0, tests)
from helpers.api import fresh_png
API = url + "/api/v1/attention"
with httpx.Client(timeout=120) as c:
    def post(seed, headers=None, **data):
        files = {"image": ("a.png", fresh_png(seed, (64, 48)), "image/png")}
        return c.post(API, files=files, data=data, headers=headers).status_code
    def get(path, **params):
        return c.get(f"{API}/{iid}{path}", params=params).status_code
    codes = [
        post(1), post(2, format="safetensors", query="all", layers="-1"), post(3, format="npy", layers="0"),
        post(4, aggregate="rollout"), post(5, stats="true", ablate="0:0"),
        post(6, {"X-Headscope-Fault": "raise"}), post(7, {"X-Headscope-Fault": "oom-always"}), post(8, layers="99"),
        get("", query="patch:1,1"), get("/stats"), get("/output"), get("/explain"),
        c.get(f"{url}/api/v1/images/{iid}").status_code, get("/relevance"), get("/faithfulness", fractions="0.5"),
        get("/importance"), get("/pruning"), get("", query="patch:99,99"), get("/relevance", target="box:0,0,99,99"),
    ]
print(json.dumps(codes))
"""


def held_arrays(garbage: list) -> Counter:
    """Tensors, numpy arrays and byte buffers only ``garbage`` holds, by type: the tensors in it
    (the collector tracks them), and the arrays and buffers (which it does not) that only objects
    in it refer to."""
    kinds = (torch.Tensor, np.ndarray, bytes, bytearray, memoryview)
    held = Counter(type(o).__name__ for o in garbage if isinstance(o, torch.Tensor))
    ids = {id(o) for o in garbage}
    referred = (r for o in garbage for r in gc.get_referents(o))
    untracked = {id(r): r for r in referred if isinstance(r, kinds) and not gc.is_tracked(r)}
    for r in untracked.values():
        if (r.nbytes if isinstance(r, (np.ndarray, memoryview)) else len(r)) < 1024:
            continue  # a header, a name: not what a cycle costs
        if not [x for x in gc.get_referrers(r) if id(x) not in ids and x is not untracked]:
            held[type(r).__name__] += 1
    return held


def test_no_request_leaves_arrays_to_the_cycle_collector(tmp_path):
    port = free_port()
    app = create_app(Settings(model=MODEL, models_dir=tmp_path, enable_fault_injection=True, port=port))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: server.started and httpx.get(f"{url}/readyz").status_code == 200, 120, "the server")
        r = httpx.post(
            f"{url}/api/v1/attention", files={"image": ("a.png", fresh_png(0, (64, 48)), "image/png")}, timeout=120
        )
        assert r.status_code == 200
        iid = r.json()["image_id"]
        gc.collect()
        gc.disable()
        try:
            out = subprocess.run(
                [sys.executable, "-c", CLIENT, url, iid, str(Path(__file__).parents[2])],
                capture_output=True,
                text=True,
                timeout=600,
                check=True,
            )
            gc.set_debug(gc.DEBUG_SAVEALL)
            gc.collect()
            garbage = list(gc.garbage)
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()
        codes = json.loads(out.stdout)
        assert codes == [200] * 5 + [500, 503, 422] + [200] * 9 + [422, 422], codes
        held = held_arrays(garbage)
        assert not held, (held, Counter(type(o).__qualname__ for o in garbage).most_common(20))
        # Nor any frame: a frame holds its function's locals (the request's picture, its tensors),
        # and it reaches the collector through an error's traceback.
        frames = Counter(f"{f.f_code.co_filename}:{f.f_code.co_name}" for f in garbage if isinstance(f, FrameType))
        assert not frames, frames
    finally:
        server.should_exit = True
        thread.join(30)
