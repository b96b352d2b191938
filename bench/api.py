"""End-to-end REST API through a real ``headscope serve`` process on loopback.

Three kinds of request, each at every concurrency level (closed loop: ``c`` clients, each
sending its next request when the previous answer arrived):

* ``post_json``: ``POST /api/v1/attention`` with default parameters (JSON, CLS rows, all layers
  and heads) -> ``[12, 6, 1, 257]``;
* ``post_st``: the same with ``format=safetensors&query=all`` (every map) -> ``[12, 6, 257, 257]``;
* ``get_patch``: ``GET /api/v1/attention/{image_id}?query=patch:R,C`` for images posted just
  before (answered from the server's cache, no forward pass);
* ``explain``: ``GET /api/v1/attention/{image_id}/explain?layer=L&head=H&query=patch:R,C`` for
  the same images: one head's whole computation (q, k, v, scores, softmax, head output, every
  head's share of W_O) from the cached capture, JSON.

Every POST carries a distinct picture (a few pixels changed per request) so the server's
content-hash cache never answers one. Rounds interleave levels and kinds; each round also
times the bare fp32 forward in this process while the server is idle, the reference for the
API ratios. The server's mean batch size per block is read from ``/metrics``.
"""

from __future__ import annotations

import asyncio
import io
import json
import re
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from headscope.serving.uploads import image_id_of
from tests.helpers.server import Server

from .common import BenchFailure, progress, summary

ROOT = Path(__file__).resolve().parent.parent
KINDS = ("post_json", "post_st", "get_patch", "explain")
FOLLOW_UPS = ("get_patch", "explain")  # answered from the cache: they read the ids the POSTs cached
KIND_LABELS = {
    "post_json": "API POST JSON, CLS rows (default params)",
    "post_st": "API POST safetensors, query=all (full maps)",
    "get_patch": "API GET cached, query=patch:R,C",
    "explain": "API GET cached explain, one head",
}


def start_server(env: dict[str, str], log_dir: Path, timeout: float = 180, models_dir: Path | None = None) -> Server:
    """``python -m headscope.cli serve`` on a free loopback port, as the tests start it
    (``tests/helpers/server.py``), its output in ``log_dir/server.log`` (the last run's).

    Args:
        models_dir: the server's models folder: the bench's ``--models-dir`` (a GPU machine
            keeps its models elsewhere than the checkout's ``models/``); None for the checkout's.
    """
    try:
        kw = {} if models_dir is None else {"models_dir": models_dir}
        return Server(env, timeout=timeout, log_path=log_dir / "server.log", **kw)
    except RuntimeError as e:
        raise BenchFailure(str(e)) from None


class Pictures:
    """Distinct 224x224 PNGs: the sample pictures with a counter written into a few pixels."""

    def __init__(self) -> None:
        from PIL import Image

        files = sorted(p for p in (ROOT / "static" / "samples").glob("*") if p.suffix in (".png", ".jpg"))
        self.bases = []
        for f in files:
            with Image.open(f) as im:
                self.bases.append(np.asarray(im.convert("RGB").resize((224, 224), Image.BICUBIC)).copy())
        if not self.bases:
            rng = np.random.default_rng(0)
            self.bases = [rng.integers(0, 256, (224, 224, 3), dtype=np.uint8)]
        self.count = 0

    def make(self, n: int) -> list[bytes]:
        from PIL import Image

        out = []
        for _ in range(n):
            i = self.count
            self.count += 1
            a = self.bases[i % len(self.bases)].copy()
            a[0, 0:4, 0] = np.frombuffer(struct.pack("<I", i), np.uint8)  # 4 pixels carry the counter
            a[-1, -1] = (i * 37) % 256, (i * 101) % 256, (i * 13) % 256
            buf = io.BytesIO()
            Image.fromarray(a).save(buf, "PNG", compress_level=1)
            out.append(buf.getvalue())
        return out


def parse_server_timing(h: str | None) -> dict[str, float]:
    out = {}
    for part in (h or "").split(","):
        m = re.match(r"\s*(\w+);dur=([\d.]+)", part)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def safetensors_shape(body: bytes) -> list[int]:
    (n,) = struct.unpack("<Q", body[:8])
    header = json.loads(body[8 : 8 + n])
    t = header["attention"]
    size = int(np.prod(t["shape"])) * {"F32": 4, "F16": 2}[t["dtype"]]
    if len(body) != 8 + n + size:
        raise BenchFailure(f"safetensors body of {len(body)} bytes, expected {8 + n + size}")
    return t["shape"]


@dataclass
class KindStats:
    latencies: list[float] = field(default_factory=list)  # seconds
    block_ips: list[float] = field(default_factory=list)
    requests: int = 0
    wall: float = 0.0
    timing: dict[str, list[float]] = field(default_factory=dict)  # Server-Timing parts
    batches: list[float] = field(default_factory=list)  # mean server batch size per block
    bytes: list[int] = field(default_factory=list)


class ApiBench:
    def __init__(self, server: Server, L: int, H: int, N: int, grid: tuple[int, int]):
        self.server = server
        self.L, self.H, self.N, self.grid = L, H, N, grid
        self.pictures = Pictures()
        self.recent_ids: list[str] = []
        self.failures: list[str] = []
        self.stats: dict[tuple[str, int], KindStats] = {}

    # -- one request ---------------------------------------------------------------------
    async def _post(self, client, png: bytes, kind: str, validate: bool):
        data = {"format": "safetensors", "query": "all"} if kind == "post_st" else None
        r = await client.post("/api/v1/attention", files={"image": ("bench.png", png, "image/png")}, data=data)
        if r.status_code != 200:
            raise BenchFailure(f"{kind}: HTTP {r.status_code}: {r.text[:200]}")
        iid = image_id_of(png)
        if kind == "post_st":
            shape = safetensors_shape(r.content)
            if shape != [self.L, self.H, self.N, self.N]:
                raise BenchFailure(f"post_st: shape {shape}, expected {[self.L, self.H, self.N, self.N]}")
        elif validate:
            import orjson

            body = orjson.loads(r.content)
            if body["shape"] != [self.L, self.H, 1, self.N] or body["image_id"] != iid:
                raise BenchFailure(f"post_json: shape {body['shape']}, image_id {body['image_id']}")
            a = np.asarray(body["attention"], np.float32)
            if a.shape != (self.L, self.H, 1, self.N) or abs(a.sum(-1) - 1).max() > 1e-3:
                raise BenchFailure("post_json: attention rows malformed")
        self.recent_ids.append(iid)
        return r

    async def _get(self, client, iid: str, k: int, validate: bool):
        gh, gw = self.grid
        r = await client.get(f"/api/v1/attention/{iid}", params={"query": f"patch:{k % gh},{(k * 7) % gw}"})
        if r.status_code != 200:
            raise BenchFailure(f"get_patch: HTTP {r.status_code}: {r.text[:200]}")
        st = parse_server_timing(r.headers.get("server-timing"))
        if st.get("compute", 0.0) != 0.0:
            raise BenchFailure("get_patch was not answered from the cache (compute > 0); cache too small?")
        if validate:
            import orjson

            body = orjson.loads(r.content)
            if body["shape"] != [self.L, self.H, 1, self.N] or not body["cached"]:
                raise BenchFailure(f"get_patch: shape {body['shape']}, cached {body['cached']}")
        return r

    async def _explain(self, client, iid: str, k: int, validate: bool):
        gh, gw = self.grid
        params = {"layer": k % self.L, "head": (k * 5) % self.H, "query": f"patch:{(k * 3) % gh},{(k * 11) % gw}"}
        r = await client.get(f"/api/v1/attention/{iid}/explain", params=params)
        if r.status_code != 200:
            raise BenchFailure(f"explain: HTTP {r.status_code}: {r.text[:200]}")
        st = parse_server_timing(r.headers.get("server-timing"))
        if st.get("compute", 0.0) != 0.0:
            raise BenchFailure("explain was not answered from the cache (compute > 0); cache too small?")
        if validate:
            import orjson

            b = orjson.loads(r.content)
            k_, v_ = np.asarray(b["k"], np.float32), np.asarray(b["v"], np.float32)
            if k_.shape != v_.shape or k_.shape[0] != self.N or not b["cached"]:
                raise BenchFailure(f"explain: k {k_.shape}, v {v_.shape}, cached {b['cached']}")
            s = np.asarray(b["scores"], np.float64)
            p = np.exp(s - s.max())
            if abs(p / p.sum() - np.asarray(b["attention"])).max() > 1e-5:
                raise BenchFailure("explain: attention is not softmax(scores)")
        return r

    # -- one block: n requests from c concurrent clients -----------------------------------
    async def block(self, client, kind: str, c: int, n: int, record: bool) -> None:
        if kind in FOLLOW_UPS:
            # The last few posted images only: a block of 48 full-map captures (24 MiB each) is
            # more than the server's 1 GiB cache holds, and an evicted id would answer 404.
            ids = list(self.recent_ids[-min(n, 8) :])
            if not ids:
                raise BenchFailure(f"no cached image ids for the {kind} block")
            ask = self._get if kind == "get_patch" else self._explain
            makers = [lambda i=i: ask(client, ids[i % len(ids)], i, i == 0) for i in range(n)]
        else:
            pngs = self.pictures.make(n)
            makers = [lambda i=i: self._post(client, pngs[i], kind, i == 0) for i in range(n)]
        lat: list[float] = []
        timing: list[dict] = []
        sizes: list[int] = []
        nxt = 0
        b0 = await self._batch_counter(client)

        async def worker():
            nonlocal nxt
            while nxt < n:
                i = nxt
                nxt += 1
                t0 = time.perf_counter()
                try:
                    r = await makers[i]()
                except BenchFailure as e:
                    self.failures.append(str(e))
                    continue
                except Exception as e:  # timeouts, dropped connections: broken, not slow
                    self.failures.append(f"{kind}: {type(e).__name__}: {e}")
                    continue
                lat.append(time.perf_counter() - t0)
                timing.append(parse_server_timing(r.headers.get("server-timing")))
                sizes.append(len(r.content))

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(c)))
        wall = time.perf_counter() - t0
        b1 = await self._batch_counter(client)
        if not record:
            return
        s = self.stats.setdefault((kind, c), KindStats())
        s.latencies += lat
        s.requests += len(lat)
        s.wall += wall
        s.block_ips.append(len(lat) / wall if wall > 0 else 0.0)
        s.bytes += sizes
        for t in timing:
            for k, v in t.items():
                s.timing.setdefault(k, []).append(v)
        if kind not in FOLLOW_UPS and b1[1] > b0[1]:
            s.batches.append((b1[0] - b0[0]) / (b1[1] - b0[1]))

    def raw_get_latency(self, n: int) -> list[float]:
        """Sequential cached GETs over one raw HTTP/1.1 keep-alive socket (seconds each).

        The same request as ``get_patch`` without a client library: what the server and the
        loopback cost, without the load generator's own per-request overhead.
        """
        if not self.recent_ids:
            return []
        gh, gw = self.grid
        lat = []
        with socket.create_connection(("127.0.0.1", self.server.port), timeout=30) as s:
            for i in range(n):
                iid = self.recent_ids[-1 - (i % min(len(self.recent_ids), 8))]
                req = (
                    f"GET /api/v1/attention/{iid}?query=patch:{i % gh},{(i * 7) % gw} HTTP/1.1\r\n"
                    f"Host: 127.0.0.1\r\n\r\n"
                ).encode()
                t0 = time.perf_counter()
                s.sendall(req)
                buf = b""
                while b"\r\n\r\n" not in buf:
                    chunk = s.recv(1 << 16)
                    if not chunk:
                        raise BenchFailure("raw GET: connection closed")
                    buf += chunk
                head, _, body = buf.partition(b"\r\n\r\n")
                lines = head.split(b"\r\n")
                if b" 200 " not in lines[0]:
                    raise BenchFailure(f"raw GET: {lines[0].decode(errors='replace')}")
                length = next(int(x.split(b":")[1]) for x in lines if x.lower().startswith(b"content-length:"))
                while len(body) < length:
                    body += s.recv(1 << 20)
                lat.append(time.perf_counter() - t0)
        return lat

    async def _batch_counter(self, client) -> tuple[float, float]:
        """(sum, count) of the server's headscope_batch_size histogram."""
        r = await client.get("/metrics")
        total = count = 0.0
        for line in r.text.splitlines():
            if line.startswith("headscope_batch_size_sum"):
                total = float(line.split()[-1])
            elif line.startswith("headscope_batch_size_count"):
                count = float(line.split()[-1])
        return total, count


def block_size(c: int) -> int:
    return max(3 * c, 6)


def make_client(kind: str, url: str, connections: int):
    """The load client: ``lean`` (http.client threads, see bench/client.py) or ``httpx``."""
    if kind == "httpx":
        import httpx

        limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
        return httpx.AsyncClient(base_url=url, timeout=180, limits=limits)
    from .client import LeanClient

    return LeanClient(url, max_connections=connections)


async def _run(
    bench: ApiBench,
    levels: list[int],
    rounds: int,
    ref: Callable[[], list[float]],
    ref_rounds: list[list[float]],
    verbose: bool,
    warmup_requests: int,
    client_kind: str,
) -> None:
    async with make_client(client_kind, bench.server.url, max(levels) + 4) as client:
        # warm-up: every kind at batch sizes the server will form
        for kind in KINDS:
            await bench.block(client, kind, min(4, max(levels)), warmup_requests, record=False)
        for r in range(rounds):
            ref_rounds.append(ref())
            lv = levels[r % len(levels) :] + levels[: r % len(levels)]
            for c in lv:
                for kind in KINDS:  # GETs last: they read the ids the POSTs just cached
                    await bench.block(client, kind, c, block_size(c), record=True)
                    progress(f"API round {r + 1}/{rounds}: c={c} {kind}", verbose)
        progress("", verbose)


def run(
    bench: ApiBench,
    levels: list[int],
    rounds: int,
    ref: Callable[[], list[float]],
    verbose: bool = True,
    warmup_requests: int = 8,
    client: str = "lean",
) -> tuple[dict[str, Any], list[float]]:
    """Returns per ``kind@c`` results and the reference forward times (seconds, all rounds).

    ``ratio`` pairs each block with the reference timed in the same round: block img/s over
    1 / (median reference time of that round), summarised over rounds.
    """
    ref_rounds: list[list[float]] = []
    asyncio.run(_run(bench, levels, rounds, ref, ref_rounds, verbose, warmup_requests, client))
    ref_ips = [1 / float(np.median(r)) for r in ref_rounds]
    out: dict[str, Any] = {}
    try:
        raw = [x * 1000 for x in bench.raw_get_latency(60 if rounds > 1 else 20)]
    except (OSError, BenchFailure) as e:
        bench.failures.append(f"raw GET: {e}")
        raw = []
    for (kind, c), s in sorted(bench.stats.items(), key=lambda kv: (KINDS.index(kv[0][0]), kv[0][1])):
        lat_ms = [x * 1000 for x in s.latencies]
        comp = s.timing.get("compute", [])
        out[f"{kind}@{c}"] = {
            "kind": kind,
            "label": KIND_LABELS[kind],
            "concurrency": c,
            "requests": s.requests,
            "ips": s.requests / s.wall if s.wall else 0.0,
            "block_ips": summary(s.block_ips),
            "ratio": summary([b / r for b, r in zip(s.block_ips, ref_ips)]) if len(s.block_ips) == len(ref_ips) else {},
            "server_compute_ms_per_image": (
                float(np.median(comp)) / float(np.mean(s.batches)) if comp and s.batches else None
            ),
            "latency_ms": {
                **summary(lat_ms),
                **(
                    {
                        "p50": float(np.percentile(lat_ms, 50)),
                        "p95": float(np.percentile(lat_ms, 95)),
                        "p99": float(np.percentile(lat_ms, 99)),
                    }
                    if lat_ms
                    else {}
                ),
            },
            "server_timing_ms_median": {k: float(np.median(v)) for k, v in s.timing.items()},
            "mean_batch": float(np.mean(s.batches)) if s.batches else None,
            "response_bytes_median": float(np.median(s.bytes)) if s.bytes else None,
        }
    if raw:
        out["get_patch_raw@1"] = {
            "kind": "get_patch_raw",
            "label": "API GET cached, raw HTTP/1.1 socket (no client library)",
            "concurrency": 1,
            "requests": len(raw),
            "ips": 1000 / float(np.mean(raw)),
            "block_ips": {},
            "ratio": {},
            "server_compute_ms_per_image": None,
            "latency_ms": {
                **summary(raw),
                "p50": float(np.percentile(raw, 50)),
                "p95": float(np.percentile(raw, 95)),
                "p99": float(np.percentile(raw, 99)),
            },
            "server_timing_ms_median": {},
            "mean_batch": None,
            "response_bytes_median": None,
        }
    return out, [t for r in ref_rounds for t in r]
