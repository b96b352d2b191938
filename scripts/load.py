"""Load, soak and resource-exhaustion runs against a real Headscope server on loopback
(bounded in count and time).

    python scripts/load.py load  [--levels 1,4,16,64] [--per-level 64] [--max-seconds 120]
    python scripts/load.py soak  [--requests 2000] [--max-seconds 900]
    python scripts/load.py decode-flood     [--clients 8]
    python scripts/load.py follow-up-flood  [--clients 110]
    python scripts/load.py answers          [--clients 6]
    ... [--server-root /work/main]   the same run against another checkout (before/after)

Each run starts its own server (``tests/helpers/server.py``), sends traffic only to 127.0.0.1, and
stops by itself. ``load`` ramps concurrency past capacity and checks that accepted requests meet
their deadline, the excess gets 429 with Retry-After at once, there are no 5xx, and /healthz
stays fast. ``soak`` sends mixed sizes and formats and checks memory, the cache bound, file
descriptors and temp files.

The exhaustion modes measure what the reliability table of docs/limits.md quotes: ``decode-flood``
posts small files that decode to huge pictures, all at once, and reports the server's peak
memory; ``follow-up-flood`` sends that many concurrent ``/stats`` requests (each a distinct
``mass``) and, meanwhile, a new upload, and reports the upload's wait; ``answers`` asks for the
largest answer (every map of a 900x300 picture) as JSON and as safetensors, then opens that
many connections that ask for it as binary and never read, and reports the server's memory.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import re
import socket
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from helpers.server import Server  # noqa: E402

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


async def _poll_health(client: httpx.AsyncClient, stop: asyncio.Event, out: list[float], failed: list[str]) -> None:
    """/healthz every 50 ms while the load runs: the times of its 200s in ``out``, anything else in ``failed``."""
    while not stop.is_set():
        t0 = time.perf_counter()
        try:
            r = await client.get("/healthz")
        except httpx.HTTPError as e:
            failed.append(type(e).__name__)
        else:
            if r.status_code == 200:
                out.append(time.perf_counter() - t0)
            else:
                failed.append(str(r.status_code))
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
        health_failed: list[str] = []
        stop = asyncio.Event()
        poller = asyncio.create_task(_poll_health(health_client, stop, health, health_failed))
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
        "failed": health_failed,
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
    warmup: int = 100,
) -> dict:
    """Mixed sizes and formats; samples RSS, fds and the cache size along the way (every 50
    requests). Growth is judged from the first sample at or after ``warmup`` requests (or a fifth
    of the run, if more): before that the RSS still climbs to its plateau as the cache fills and
    the allocator's arenas reach their working size, and how many requests that takes depends on
    how the machine's load interleaves them."""
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
    warm = [s for n, s in samples if n >= max(warmup, requests // 5)] or [s for _, s in samples]
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
        "rss_mb_samples": {n: round(s["VmRSS"] / 2**20, 1) for n, s in samples},
        "fds_first": fds[0] if fds else None,
        "fds_last": fds[-1] if fds else None,
        "cache_bytes_max": cache_seen,
        "cache_limit": cache_bytes,
        "temp_files_left": leftovers,
    }


def start_server(env: dict[str, str], root: Path | None = None) -> tuple[Server, Path]:
    tmpdir = Path(tempfile.mkdtemp(prefix="headscope-soak-"))
    return Server({"TMPDIR": str(tmpdir), **env}, **({"cwd": root} if root else {})), tmpdir


# -- resource exhaustion --------------------------------------------------------------------
MiB = 2**20


def _save(img: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **kw)
    return buf.getvalue()


def decode_bombs() -> dict[str, bytes]:
    """Small files (under 0.3 MB each) that decode to pictures of about 40 megapixels."""
    a = np.full((5000, 8000), 30000, np.uint16)
    a[::7, ::5] = 1000
    f = np.zeros((5000, 8000), np.float32)
    f[::9, ::3] = 1.5
    return {
        "png 1x40,000,000 grey": _save(Image.new("L", (40_000_000, 1), 128), "PNG"),
        "png 8000x5000 16-bit": _save(Image.frombytes("I;16", (8000, 5000), a.tobytes()), "PNG"),
        "tiff 8000x5000 float": _save(
            Image.frombytes("F", (8000, 5000), f.tobytes()), "TIFF", compression="tiff_deflate"
        ),
        "png 7740x5160 rgba": _save(Image.new("RGBA", (7740, 5160), (10, 20, 30, 128)), "PNG"),
    }


def _hwm_reset(pid: int) -> int:
    """Reset the process's peak resident memory to its current value (Linux); returns it."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")
    return _proc_status(pid)["VmRSS"]


async def decode_flood(url: str, pid: int, clients: int, bombs: dict[str, bytes] | None = None) -> dict:
    """``clients`` concurrent uploads of decode bombs (cycling through ``bombs``)."""
    bombs = bombs or decode_bombs()
    names = list(bombs)
    base = _hwm_reset(pid)
    codes: dict[str, int] = {}
    retry_after_missing = 0
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=httpx.Limits(max_connections=clients + 4)) as c:

        async def one(i: int) -> None:
            nonlocal retry_after_missing
            status, _, r = await _post(c, bombs[names[i % len(names)]], layers="-1")
            key = f"{status} {r.json()['error']['code']}" if status != 200 else "200"
            codes[key] = codes.get(key, 0) + 1
            retry_after_missing += status == 429 and "retry-after" not in r.headers

        t0 = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(clients)))
        wall = time.perf_counter() - t0
        after = (await c.get("/healthz")).status_code
    peak = _proc_status(pid)["VmHWM"]
    return {
        "clients": clients,
        "files_kb": {k: round(len(v) / 1024, 1) for k, v in bombs.items()},
        "codes": codes,
        "retry_after_missing": retry_after_missing,
        "rss_before_mb": round(base / MiB),
        "peak_rss_growth_mb": round((peak - base) / MiB),
        "wall_s": round(wall, 1),
        "healthz_after": after,
    }


async def follow_up_flood(url: str, clients: int, fault: str | None = None, warm: bool = True) -> dict:
    """``clients`` concurrent ``/stats`` follow-ups (distinct ``mass`` each) on one picture and,
    once they are under way, one new upload: how long the upload waits, what the flood got.

    Args:
        fault: an ``X-Headscope-Fault`` for the follow-ups (``sleep:S`` makes each one's
            worker call S seconds longer; needs a server with fault injection).
        warm: ask for the picture's statistics once before the flood. The first ``/stats`` of
            a picture computes everything but the mass thresholds (about 2.5 forwards, one
            worker call that an upload arriving meanwhile waits for); with ``warm`` the flood
            measures the queue, not that one call.
    """
    seed = int(time.time() * 1000) % 2**31  # new pictures: nothing cached from an earlier run
    limits = httpx.Limits(max_connections=clients + 8, max_keepalive_connections=clients + 8)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as c:
        status, _, r = await _post(c, make_image(seed), layers="-1")
        image_id = r.json()["image_id"]
        if warm:
            await c.get(f"{API}/{image_id}/stats")
        finished: list[tuple[int, float]] = []
        headers = {"X-Headscope-Fault": fault} if fault else None

        async def follow_up(i: int) -> None:
            try:
                g = await c.get(
                    f"{API}/{image_id}/stats", params={"mass": f"{0.3 + i * 0.6 / clients:.6f}"}, headers=headers
                )
            except httpx.TimeoutException:  # no answer within the client's 300 s: counted as code 0
                finished.append((0, time.monotonic()))
                return
            finished.append((g.status_code, time.monotonic()))

        flood = [asyncio.create_task(follow_up(i)) for i in range(clients)]
        await asyncio.sleep(0.5)
        t0 = time.monotonic()
        status, _, r = await _post(c, make_image(seed + 1), layers="-1")
        t1 = time.monotonic()
        await asyncio.gather(*flood)
    codes: dict[int, int] = {}
    for code, _ in finished:
        codes[code] = codes.get(code, 0) + 1
    return {
        "clients": clients,
        "warm": warm,
        "upload_status": status,
        "upload_wait_s": round(t1 - t0, 2),
        "upload_timing_ms": r.json().get("timing_ms") if status == 200 else r.text[:200],
        "follow_up_codes": codes,
        "follow_ups_done_before_upload": sum(1 for code, t in finished if code == 200 and t < t1),
    }


def wide_picture() -> bytes:
    """900x300: 16x48 patches, 769 tokens, the issue's 'largest answer' picture."""
    return make_image(900300, (900, 300))


async def slow_readers(url: str, pid: int, image_id: str, clients: int, hold_s: float, query: str) -> dict:
    """``clients`` connections that ask for every map as safetensors and never read."""
    host, port = url.removeprefix("http://").split(":")
    base = _hwm_reset(pid)
    socks = []
    for _ in range(clients):
        r, w = await asyncio.open_connection(host, int(port), limit=4096)
        sock = w.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        w.write(f"GET {API}/{image_id}?{query}&format=safetensors HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        await w.drain()
        socks.append((r, w))
    await asyncio.sleep(hold_s)
    held = _proc_status(pid)
    statuses = []
    for r, w in socks:
        try:
            line = await asyncio.wait_for(r.readline(), 300)  # generous: a loaded machine
            statuses.append(int(line.split()[1]) if line.startswith(b"HTTP/1.1") else 0)
        except (asyncio.TimeoutError, ValueError, IndexError, ConnectionError):
            statuses.append(0)
        w.close()
    codes: dict[int, int] = {}
    for code in statuses:
        codes[code] = codes.get(code, 0) + 1
    return {
        "clients": clients,
        "codes": codes,
        "rss_before_mb": round(base / MiB),
        "rss_held_growth_mb": round((held["VmRSS"] - base) / MiB),
        "peak_rss_growth_mb": round((held["VmHWM"] - base) / MiB),
    }


async def answers(url: str, pid: int, clients: int, hold_s: float = 10.0) -> dict:
    """The largest answer as JSON and as safetensors, then ``clients`` slow readers of it."""
    query = "query=all&layers=all&heads=all"
    async with httpx.AsyncClient(base_url=url, timeout=300) as c:
        status, _, r = await _post(c, wide_picture(), layers="-1")
        image_id = r.json()["image_id"]
        base = _hwm_reset(pid)
        j = await c.get(f"{API}/{image_id}?{query}")
        json_peak = _proc_status(pid)["VmHWM"] - base
        base = _hwm_reset(pid)
        b = await c.get(f"{API}/{image_id}?{query}&format=safetensors")
        bin_peak = _proc_status(pid)["VmHWM"] - base
    out = {
        "picture": "900x300 (769 tokens)",
        "json": {
            "status": j.status_code,
            "bytes": len(j.content),
            "code": j.json()["error"]["code"] if j.status_code != 200 else None,
            "peak_rss_growth_mb": round(json_peak / MiB),
        },
        "safetensors": {
            "status": b.status_code,
            "mb": round(len(b.content) / MiB, 1),
            "peak_rss_growth_mb": round(bin_peak / MiB),
        },
    }
    out["slow_readers"] = await slow_readers(url, pid, image_id, clients, hold_s, query)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["load", "soak", "decode-flood", "follow-up-flood", "answers"])
    p.add_argument("--levels", default="1,4,16,64")
    p.add_argument("--per-level", type=int, default=64)
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--max-seconds", type=float, default=900)
    p.add_argument("--timeout-s", type=float, default=10.0, help="server request deadline")
    p.add_argument("--max-queue", type=int, default=16)
    p.add_argument("--cache-mb", type=int, default=64)
    p.add_argument("--clients", type=int, help="exhaustion modes: concurrent clients (8, 110, 6)")
    p.add_argument("--fault", help="follow-up-flood: X-Headscope-Fault for the follow-ups, e.g. sleep:0.2")
    p.add_argument("--cold", action="store_true", help="follow-up-flood: the flood's first /stats computes them")
    p.add_argument("--server-root", type=Path, help="run the server from this checkout (e.g. /work/main)")
    p.add_argument("--out", help="write the result as JSON here")
    a = p.parse_args()
    if a.mode in ("load", "soak"):
        env = {
            "HEADSCOPE_REQUEST_TIMEOUT_S": str(a.timeout_s),
            "HEADSCOPE_MAX_QUEUE": str(a.max_queue),
            "HEADSCOPE_CACHE_BYTES": str(a.cache_mb * 2**20),
        }
    else:  # the server's defaults: what docs/limits.md's table describes
        env = {"HEADSCOPE_ENABLE_FAULT_INJECTION": "1"} if a.fault else {}
    srv, tmpdir = start_server(env, a.server_root)
    try:
        if a.mode == "load":
            res = asyncio.run(
                load(srv.url, [int(x) for x in a.levels.split(",")], a.per_level, a.timeout_s, a.max_seconds)
            )
        elif a.mode == "soak":
            res = asyncio.run(soak(srv.url, srv.proc.pid, a.requests, a.cache_mb * 2**20, tmpdir, a.max_seconds))
        elif a.mode == "decode-flood":
            res = asyncio.run(decode_flood(srv.url, srv.proc.pid, a.clients or 8))
        elif a.mode == "follow-up-flood":
            res = asyncio.run(follow_up_flood(srv.url, a.clients or 110, a.fault, warm=not a.cold))
        else:
            res = asyncio.run(answers(srv.url, srv.proc.pid, a.clients or 6))
    finally:
        srv.stop()
    print(json.dumps(res, indent=2))
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
