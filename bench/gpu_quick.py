"""``python -m bench.run --gpu-quick``: the GPU profile of issue 37, a few minutes on one GPU.

Rows (every one timed with the device synchronised before and after each call):

* ``forward``: the bare ``forward_features`` of a normalised batch already on the device, per
  batch size and precision (the reference of the ratios);
* ``capture_tensors``: ``Scope.attention(uint8 tensor [B, 3, 224, 224] on the device)``, CLS
  rows, per batch size and precision (target >= 0.9x the forward);
* ``capture_jpegs``: ``Scope.attention([640x480 JPEG bytes] * B)`` (decoded and resized in the
  Scope's thread pool while the forwards of the batches already prepared run), fp32; its
  ``vs_limit`` is the target's ratio (batch 64: >= 0.8x the slower of ``prepare_jpegs`` and
  ``forward_jpegs``);
* ``prepare_jpegs``: the preparation alone (``Scope._read``: the same threads, decoding,
  resizing and each picture's id; the decode limit), and ``forward_jpegs``: the bare forward
  at the size the JPEGs become (294 x 224 for the default model: the aspect is kept); the JPEG
  target is >= 0.8x the smaller of the two;
* ``capture_pil``: ``Scope.attention([PIL.Image] * B)`` of the same pictures already decoded
  (prepared from their pixels, no PNG round trip), fp32;
* ``chefer``: ``Scope.relevance(tensors, method="chefer")`` at batch 1 and 8 (target <= 3x a
  forward at batch 8); ``chefer2021`` and ``attnlrp`` the same (issue #40: <= 4x and <= 2x);
* ``api``: ``POST /api/v1/attention`` with distinct JPEGs at concurrency 1, 16, 64 through a
  real server, and the GPU's busy fraction meanwhile (``torch.cuda.utilization``, sampled);
  ``vs_limit`` against the JPEG limit at the batch nearest the concurrency (:func:`api_vs_limit`),
  and ``http``: one JPEG posted again and again (answered from the cache), the server's own
  limit, so each row says which of the two ``binds``. Each API row also has the server
  process's CPU time per answer (``server_cpu_ms_per_request``, all its threads), its event
  loop's (``server_loop_ms_per_request``, the main thread: HTTP, routing and sending under one
  GIL; ``loop_limit_per_s`` is 1000 over it, the most answers a second one process can give at
  that cost) and the cores it kept busy (``server_cores``); :func:`api_vs_limit` adds
  ``cores_at_target``: the cores a server would need to answer at the target's 0.7x of the
  JPEG limit at that CPU cost, beside the machine's (``machine_cores``). A server process that
  keeps about one core busy while the machine has more is bound by itself (its GIL);
  ``cores_at_target`` says whether more processes could reach the target on that machine.

On the CPU (``--device cpu --gpu-quick``) the same code runs smoke-sized: the tests run it so.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from headscope.engine.device import autocast, release_memory
from headscope.zoo.errors import first_line

from .common import proc_jiffies, summary

JPEG_SIZE = (480, 640)  # H, W
RELEVANCE_ROWS = ("chefer", "chefer2021", "attnlrp")  # timed at batch 1 and 8
REST_TARGET = 0.7  # issue #37: the REST API at concurrency 64 >= 0.7x the JPEG limit


def measured(measure: Callable[[], Any], device: torch.device, log: Callable[[str], None], what: str) -> Any:
    """``measure()``, or where it fails (out of memory at batch 128, say) the row ``{"error": …}``
    in place of its numbers, so that the run's one GPU session still measures the rows after it.
    The error is handled after the ``except`` block, its traceback dropped, so the failed row's
    device memory is freed first."""
    try:
        return measure()
    except Exception as e:
        err = e
    err.__traceback__ = None
    release_memory(device)
    why = f"{type(err).__name__}: {first_line(err)}" if str(err).strip() else type(err).__name__
    log(f"gpu-quick: {what} failed: {why}")
    return {"error": why}


def random_levels(B: int, size: int, device: torch.device) -> torch.Tensor:
    """``[B, 3, size, size]`` uint8 pixels (seeded by ``B``) on ``device``."""
    rng = np.random.default_rng(B)
    return torch.from_numpy(rng.integers(0, 256, (B, 3, size, size), dtype=np.uint8)).to(device)


def bare_forward(scope: Any, x: torch.Tensor, amp: bool = False) -> Callable[[], None]:
    """The reference of the ratios: the backbone's ``forward_features`` of the normalised batch
    ``x``, as the scope runs it (fp32 without TF32; with ``amp`` its autocast too)."""
    runner = scope.runner
    dtype = runner.amp_dtype if amp else None

    def forward() -> None:
        with torch.inference_mode(), runner.numerics(), autocast(x.device.type, dtype):
            scope.lm.model.forward_features(x)

    return forward


def jpegs(n: int, start: int = 0) -> list[bytes]:
    """``n`` distinct 640 x 480 JPEGs (quality 90), a counter in the first pixels."""
    from PIL import Image

    rng = np.random.default_rng(0)
    base = rng.integers(0, 256, (*JPEG_SIZE, 3), dtype=np.uint8)
    base = (base // 32 * 32).astype(np.uint8)  # blocky, so a JPEG of it is a realistic size
    out = []
    for i in range(start, start + n):
        a = base.copy()
        a[:8, :8] = i % 256
        a[8:16, :8] = (i // 256) % 256
        buf = io.BytesIO()
        Image.fromarray(a).save(buf, "JPEG", quality=90)
        out.append(buf.getvalue())
    return out


def pil_images(files: list[bytes]) -> list[Any]:
    """The JPEGs decoded, as ``PIL.Image`` objects (prepared from their pixels, no PNG round trip)."""
    from PIL import Image

    out = []
    for data in files:
        img = Image.open(io.BytesIO(data))
        img.load()
        out.append(img)
    return out


def timed(fn: Callable[[], Any], iters: int, warmup: int, sync: Callable[[], None]) -> list[float]:
    """Seconds per call of ``fn``, the device synchronised around each timed call."""
    for _ in range(warmup):
        fn()
    sync()
    out = []
    for _ in range(iters):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        out.append(time.perf_counter() - t0)
    return out


def _row(times: list[float], batch: int, ref: list[float] | None = None) -> dict[str, Any]:
    ms = summary([t * 1000 for t in times])
    row: dict[str, Any] = {"ms": ms, "images_per_s": batch / ms["median"] * 1000}
    if ref:
        row["vs_forward"] = summary([r / t for r, t in zip(ref, times)])["median"]
    return row


class BusySampler:
    """The GPU's busy fraction sampled every 50 ms: ``torch.cuda.utilization`` (NVML through
    pynvml), else ``nvidia-smi --query-gpu=utilization.gpu`` (one call per sample), else none."""

    def __init__(self, device: torch.device):
        self.device, self.samples = device, []  # type: ignore[var-annotated]
        self.source: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _nvidia_smi(self) -> float:
        import subprocess

        index = self.device.index if self.device.index is not None else torch.cuda.current_device()
        out = subprocess.run(
            ["nvidia-smi", f"--id={index}", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        )
        return float(out.stdout.strip().splitlines()[0])

    def _read(self) -> float:
        if self.source != "nvidia-smi":
            try:
                value = float(torch.cuda.utilization(self.device))
                self.source = "nvml"
                return value
            except Exception:  # no pynvml here: try the command line tool
                self.source = "nvidia-smi"
        return self._nvidia_smi()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append(self._read())
            except Exception:  # neither NVML nor nvidia-smi: nothing to report
                self.source = None
                return
            self._stop.wait(0.05)

    def __enter__(self) -> BusySampler:
        if self.device.type == "cuda":
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(1)

    @property
    def fraction(self) -> float | None:
        return float(np.mean(self.samples)) / 100 if self.samples else None


class ServerCpu:
    """The CPU time a process used in a block (utime + stime of all its threads, from /proc),
    the cores it kept busy, and the share of its main thread: the server's event loop, which
    parses, routes and sends every answer under one GIL, so that ``1000 / loop_ms`` answers a
    second is the most one server process can give at that cost. None where /proc is not
    there (not Linux) or no pid is given."""

    def __init__(self, pid: int | None):
        self.pid = pid
        self.seconds: float | None = None
        self.loop_seconds: float | None = None
        self.cores: float | None = None

    def __enter__(self) -> ServerCpu:
        self._t0 = time.perf_counter()
        self._j0 = proc_jiffies(self.pid) if self.pid else 0
        self._loop0 = proc_jiffies(self.pid, self.pid) if self.pid else 0
        return self

    def __exit__(self, *exc: object) -> None:
        wall = time.perf_counter() - self._t0
        if self.pid and self._j0:
            tick = os.sysconf("SC_CLK_TCK")
            self.seconds = (proc_jiffies(self.pid) - self._j0) / tick
            self.loop_seconds = (proc_jiffies(self.pid, self.pid) - self._loop0) / tick
            self.cores = self.seconds / wall if wall > 0 else None

    def per_request_ms(self, requests: int) -> float | None:
        return 1000 * self.seconds / requests if self.seconds is not None and requests else None

    def loop_ms(self, requests: int) -> float | None:
        """The event loop's CPU per answer."""
        return 1000 * self.loop_seconds / requests if self.loop_seconds is not None and requests else None

    def row(self, requests: int) -> dict[str, Any]:
        """The API row's server fields."""
        loop = self.loop_ms(requests)
        return {
            "server_cpu_ms_per_request": self.per_request_ms(requests),
            "server_loop_ms_per_request": loop,
            "loop_limit_per_s": 1000 / loop if loop else None,
            "server_cores": self.cores,
        }


def _capture_rows(
    scope: Any, runner: Any, device: torch.device, B: int, precision: str, iters: int, warmup: int, sync
) -> dict[str, Any]:
    """One batch size's capture rows at ``precision`` (and, in fp32, the JPEG and PIL rows)."""
    levels = random_levels(B, 224, device)
    forward = bare_forward(scope, runner.inputs(levels), amp=True)
    ref = timed(forward, iters, warmup, sync)
    rows = {
        "forward": _row(ref, B),
        "capture_tensors": _row(timed(lambda: scope.attention(levels), iters, warmup, sync), B, ref),
    }
    if precision == "fp32":
        files = jpegs(B)
        rows["capture_jpegs"] = _row(timed(lambda: scope.attention(files), iters, warmup, sync), B, ref)
        rows["prepare_jpegs"] = _row(timed(lambda: scope._read(files), iters, warmup, sync), B, ref)
        # The bare forward at the size the JPEGs become (640 x 480 keeps its aspect: 294 x 224
        # for the default model, a third more tokens than 224 x 224).
        xj = runner.inputs(torch.stack([p.prep.raw for p in scope._read(files)]).to(device))
        rows["forward_jpegs"] = _row(timed(bare_forward(scope, xj, amp=True), iters, warmup, sync), B)
        # the JPEG target's ratio: against the slower of its two limits (decode, forward)
        limit = min(rows["prepare_jpegs"]["images_per_s"], rows["forward_jpegs"]["images_per_s"])
        rows["capture_jpegs"]["vs_limit"] = rows["capture_jpegs"]["images_per_s"] / limit
        images = pil_images(files)
        rows["capture_pil"] = _row(timed(lambda: scope.attention(images), iters, warmup, sync), B, ref)
    return rows


def inproc(
    scope_for: Callable[[str], Any],
    device: torch.device,
    batches: list[int],
    precisions: list[str],
    iters: int,
    warmup: int,
    sync: Callable[[], None],
    log: Callable[[str], None],
    res: dict[str, Any] | None = None,
    save: Callable[[], None] = lambda: None,
) -> dict[str, Any]:
    """The in-process rows (forward, capture from tensors and JPEGs, preparation, chefer).

    Args:
        res: filled row by row (the caller's dict, so a run stopped by a timeout keeps the rows
            measured before it); a new one when None.
        save: called after each row, to write what is measured so far.
    """
    res = {} if res is None else res
    res.setdefault("capture", {})
    for m in RELEVANCE_ROWS:
        res.setdefault(m, {})
    for precision in precisions:
        scope = measured(lambda p=precision: scope_for(p), device, log, f"{precision} model")
        if isinstance(scope, dict):  # its error
            res["capture"][f"{precision}/*"] = scope
            save()
            continue
        runner = scope.runner
        for B in batches:
            log(f"gpu-quick: {precision} batch {B}")
            res["capture"][f"{precision}/{B}"] = measured(
                lambda B=B, p=precision: _capture_rows(scope, runner, device, B, p, iters, warmup, sync),
                device,
                log,
                f"{precision} batch {B}",
            )
            save()
        if precision == "fp32":
            for B in [b for b in (1, 8) if b <= max(batches)] or [1]:
                levels = random_levels(B, 224, device)
                ref = timed(bare_forward(scope, runner.inputs(levels)), iters, warmup, sync)
                for method in RELEVANCE_ROWS:
                    log(f"gpu-quick: {method} batch {B}")

                    def relevance_row(m: str = method, B: int = B, levels: torch.Tensor = levels, ref=ref) -> dict:
                        t = timed(lambda: scope.relevance(levels, method=m), iters, warmup, sync)
                        return {**_row(t, B), "vs_forward_time": summary([a / r for a, r in zip(t, ref)])["median"]}

                    res[method][str(B)] = measured(relevance_row, device, log, f"{method} batch {B}")
                    save()
    return res


async def _api_level(url: str, c: int, n: int, files: list[bytes]) -> tuple[float, int, dict[str, int]]:
    """Wall seconds, failed requests, and the failures by status and error code."""
    from .client import LeanClient

    done, failed = 0, 0
    why: dict[str, int] = {}
    it = iter(range(n))
    async with LeanClient(url, c + 2) as client:

        async def worker() -> None:
            nonlocal done, failed
            for i in it:
                r = await client.post("/api/v1/attention", files={"image": (f"{i}.jpg", files[i], "image/jpeg")})
                if r.status_code == 200:
                    done += 1
                else:
                    failed += 1
                    try:
                        code = json.loads(r.content).get("error", {}).get("code", "")
                    except Exception:  # not the API's JSON error body
                        code = ""
                    key = f"{r.status_code} {code}".strip()
                    why[key] = why.get(key, 0) + 1

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(c)))
        return time.perf_counter() - t0, failed, why


def api(
    server_url: str,
    device: torch.device,
    levels: list[int],
    per_level: int,
    log: Callable[[str], None],
    server_pid: int | None = None,
) -> dict[str, Any]:
    """``POST /api/v1/attention`` with distinct JPEGs at each concurrency; images/s, GPU busy and
    (``server_pid``) the server's CPU time per answer."""
    res: dict[str, Any] = {}
    start = 0
    for c in levels:
        n = max(per_level, 2 * c)
        files = jpegs(n, start)
        start += n
        log(f"gpu-quick: API concurrency {c}, {n} requests")
        with BusySampler(device) as busy, ServerCpu(server_pid) as cpu:
            wall, failed, why = asyncio.run(_api_level(server_url, c, n, files))
        res[str(c)] = {
            "requests": n,
            "failed": failed,
            "failures": why,
            "images_per_s": (n - failed) / wall,
            "gpu_busy": busy.fraction,
            "gpu_busy_source": busy.source,
            **cpu.row(n - failed),
        }
    # The server's own limit beside it: one JPEG, computed once, then posted n times at the top
    # concurrency and answered from the cache (HTTP, multipart, the hash and the answer's
    # encoding; no decoding, no forward).
    c = max(levels)
    n = max(per_level, 2 * c)
    log(f"gpu-quick: API concurrency {c}, one JPEG {n} times (the HTTP limit)")
    one = jpegs(1, start)
    asyncio.run(_api_level(server_url, 1, 1, one))  # computed once, before the clock starts
    with ServerCpu(server_pid) as cpu:
        wall, failed, why = asyncio.run(_api_level(server_url, c, n, one * n))
    res["http"] = {
        "concurrency": c,
        "requests": n,
        "failed": failed,
        "failures": why,
        "images_per_s": (n - failed) / wall,
        **cpu.row(n - failed),
    }
    return res


def api_vs_limit(quick: dict[str, Any]) -> None:
    """Each API row's ``vs_limit``: its images/s against the JPEG limit of the in-process rows
    (the slower of ``prepare_jpegs`` and ``forward_jpegs``, fp32) at the batch nearest its
    concurrency, and that batch (``limit_batch``). The REST target: >= 0.7x at concurrency 64."""
    limits = {
        int(key.split("/")[1]): min(rows["prepare_jpegs"]["images_per_s"], rows["forward_jpegs"]["images_per_s"])
        for key, rows in quick.get("capture", {}).items()
        if key.startswith("fp32/") and "forward_jpegs" in rows
    }
    api = quick.get("api", {})
    http = api.get("http", {}).get("images_per_s")
    for c, row in api.items():
        if c == "http" or not limits or "images_per_s" not in row:  # a level that failed has no numbers
            continue
        b = min(limits, key=lambda b: (abs(b - int(c)), b))
        row["limit_batch"], row["vs_limit"] = b, row["images_per_s"] / limits[b]
        if row.get("server_cpu_ms_per_request") is not None:
            # the cores that answering at the target (0.7x the limit) would keep busy at this cost
            row["cores_at_target"] = REST_TARGET * limits[b] * row["server_cpu_ms_per_request"] / 1000
            row["machine_cores"] = os.cpu_count()
        if http is not None:  # which limit binds the server: its HTTP path, or decoding and forwards
            row["binds"] = "http" if http < limits[b] else "jpeg"
