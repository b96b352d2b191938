"""Load and soak runs against a real Headscope server on loopback (bounded in count and time).

    python scripts/load.py load  [--levels 1,4,16,64] [--per-level 64] [--max-seconds 120]
    python scripts/load.py soak  [--requests 2000] [--max-seconds 900]

Each run starts its own server (``tests/server.py``) unless ``--url`` is given, sends traffic
only to 127.0.0.1, and stops by itself. ``load`` ramps concurrency past capacity and checks that
accepted requests meet their deadline, the excess gets 429 with Retry-After at once, there are no
5xx, and /healthz stays fast. ``soak`` sends mixed sizes and formats and checks memory, the cache
bound, file descriptors and temp files.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from server import Server  # noqa: E402

API = "/api/v1/attention"


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def make_image(i: int, size: tuple[int, int] = (224, 224)) -> bytes:
    """A distinct image per i, so the server's content cache never answers for it."""
    rng = np.random.default_rng(i)
    a = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, "PNG", compress_level=1)
    return buf.getvalue()


async def _post(client: httpx.AsyncClient, data: bytes, **fields) -> tuple[int, float, httpx.Response]:
    t0 = time.perf_counter()
    r = await client.post(API, files={"image": ("x.png", data)}, data=fields)
    return r.status_code, time.perf_counter() - t0, r


async def _poll_health(client: httpx.AsyncClient, stop: asyncio.Event, out: list[float]) -> None:
    while not stop.is_set():
        t0 = time.perf_counter()
        r = await client.get("/healthz")
        if r.status_code == 200:
            out.append(time.perf_counter() - t0)
        await asyncio.sleep(0.05)


async def load(url: str, levels: list[int], per_level: int, deadline_s: float, max_seconds: float) -> dict:
    """Ramp concurrency; returns per-level counts and latencies plus /healthz timings."""
    end = time.monotonic() + max_seconds
    result = {"levels": [], "health_ms": {}}
    limits = httpx.Limits(max_connections=max(levels) + 8, max_keepalive_connections=max(levels) + 8)
    async with (
        httpx.AsyncClient(base_url=url, timeout=deadline_s + 30, limits=limits) as client,
        httpx.AsyncClient(base_url=url, timeout=10) as health_client,
    ):
        health: list[float] = []
        stop = asyncio.Event()
        poller = asyncio.create_task(_poll_health(health_client, stop, health))
        seq = 0
        for conc in levels:
            if time.monotonic() > end:
                break
            sem = asyncio.Semaphore(conc)
            stats = {
                "concurrency": conc,
                "ok": 0,
                "busy": 0,
                "err5xx": 0,
                "other": 0,
                "ok_ms": [],
                "busy_ms": [],
                "retry_after_missing": 0,
                "late": 0,
            }

            # Made before the clock starts: encoding inside the loop would delay reading answers.
            datas = {seq + i: make_image(seq + i) for i in range(per_level)}

            async def one(i: int) -> None:
                async with sem:
                    if time.monotonic() > end:
                        return
                    status, dt, r = await _post(client, datas[i])
                    if status == 200:
                        stats["ok"] += 1
                        stats["ok_ms"].append(dt * 1000)
                        stats["late"] += dt > deadline_s
                    elif status == 429:
                        stats["busy"] += 1
                        stats["busy_ms"].append(dt * 1000)
                        stats["retry_after_missing"] += "retry-after" not in r.headers
                    elif status >= 500:
                        stats["err5xx"] += 1
                    else:
                        stats["other"] += 1

            t0 = time.perf_counter()
            await asyncio.gather(*(one(seq + i) for i in range(per_level)))
            wall = time.perf_counter() - t0
            seq += per_level
            ok_ms, busy_ms = stats.pop("ok_ms"), stats.pop("busy_ms")
            stats.update(
                wall_s=round(wall, 2),
                ok_per_s=round(stats["ok"] / wall, 2),
                ok_p50_ms=round(pct(ok_ms, 50), 1),
                ok_p99_ms=round(pct(ok_ms, 99), 1),
                busy_p99_ms=round(pct(busy_ms, 99), 1) if busy_ms else None,
            )
            result["levels"].append(stats)
        stop.set()
        await poller
    result["health_ms"] = {
        "n": len(health),
        "p50": round(pct(health, 50) * 1000, 2),
        "p99": round(pct(health, 99) * 1000, 2),
        "max": round(max(health) * 1000, 2) if health else None,
    }
    return result


def _proc_status(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        k, _, v = line.partition(":")
        if k in ("VmRSS", "VmHWM"):
            out[k] = int(v.split()[0]) * 1024
    out["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
    return out


def _metric(text: str, name: str) -> float:
    m = re.search(rf"^{name} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


async def soak(
    url: str,
    pid: int,
    requests: int,
    cache_bytes: int,
    tmpdir: Path,
    max_seconds: float,
    concurrency: int = 4,
    client_timeout_s: float = 120,
) -> dict:
    """Mixed sizes and formats; samples RSS, fds and the cache size along the way."""
    sizes = [(224, 224), (451, 300), (300, 451), (640, 200), (96, 96)]
    kinds = [
        dict(),
        dict(format="safetensors", query="all", layers="-1"),
        dict(format="npy", layers="0,11"),
        dict(query="patch:3,3"),
        dict(aggregate="rollout"),
        dict(stats="true", layers="-1"),
    ]
    end = time.monotonic() + max_seconds
    samples: list[tuple[int, dict]] = []
    codes: dict[int, int] = {}
    cache_seen = 0.0
    sem = asyncio.Semaphore(concurrency)
    done = 0
    async with httpx.AsyncClient(base_url=url, timeout=client_timeout_s) as client:

        async def one(i: int) -> None:
            nonlocal done, cache_seen
            async with sem:
                if time.monotonic() > end:
                    return
                status, _, r = await _post(client, make_image(i, sizes[i % len(sizes)]), **kinds[i % len(kinds)])
                codes[status] = codes.get(status, 0) + 1
                if i % 7 == 0 and status == 200 and kinds[i % len(kinds)].get("format") is None:
                    image_id = r.json()["image_id"]
                    g = await client.get(f"{API}/{image_id}", params={"query": "patch:1,1"})
                    codes[g.status_code] = codes.get(g.status_code, 0) + 1
                done += 1
                if done % 50 == 0:
                    samples.append((done, _proc_status(pid)))
                    m = (await client.get("/metrics")).text
                    cache_seen = max(cache_seen, _metric(m, "headscope_cache_bytes"))

        await asyncio.gather(*(one(i) for i in range(requests)))
    warm = [s for n, s in samples if n >= max(100, requests // 5)] or [s for _, s in samples]
    rss = [s["VmRSS"] for s in warm]
    fds = [s["fds"] for s in warm]
    # torch keeps its compiler cache folder in TMPDIR; anything else left there is ours.
    leftovers = [p.name for p in tmpdir.iterdir() if not p.name.startswith("torchinductor")] if tmpdir.exists() else []
    return {
        "requests": done,
        "codes": codes,
        "rss_mb_after_warmup": round(rss[0] / 2**20, 1) if rss else None,
        "rss_mb_end": round(rss[-1] / 2**20, 1) if rss else None,
        "rss_growth": round(rss[-1] / rss[0] - 1, 4) if len(rss) > 1 else 0.0,
        "rss_growth_max": round(max(rss) / rss[0] - 1, 4) if rss else 0.0,
        "fds_first": fds[0] if fds else None,
        "fds_last": fds[-1] if fds else None,
        "cache_bytes_max": cache_seen,
        "cache_limit": cache_bytes,
        "temp_files_left": leftovers,
    }


def start_server(env: dict[str, str]) -> tuple[Server, Path]:
    tmpdir = Path(tempfile.mkdtemp(prefix="headscope-soak-"))
    return Server({"TMPDIR": str(tmpdir), **env}), tmpdir


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["load", "soak"])
    p.add_argument("--levels", default="1,4,16,64")
    p.add_argument("--per-level", type=int, default=64)
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--max-seconds", type=float, default=900)
    p.add_argument("--timeout-s", type=float, default=10.0, help="server request deadline")
    p.add_argument("--max-queue", type=int, default=16)
    p.add_argument("--cache-mb", type=int, default=64)
    p.add_argument("--out", help="write the result as JSON here")
    a = p.parse_args()
    env = {
        "HEADSCOPE_REQUEST_TIMEOUT_S": str(a.timeout_s),
        "HEADSCOPE_MAX_QUEUE": str(a.max_queue),
        "HEADSCOPE_CACHE_BYTES": str(a.cache_mb * 2**20),
    }
    srv, tmpdir = start_server(env)
    try:
        if a.mode == "load":
            res = asyncio.run(
                load(srv.url, [int(x) for x in a.levels.split(",")], a.per_level, a.timeout_s, a.max_seconds)
            )
        else:
            res = asyncio.run(soak(srv.url, srv.proc.pid, a.requests, a.cache_mb * 2**20, tmpdir, a.max_seconds))
    finally:
        srv.stop()
    print(json.dumps(res, indent=2))
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
