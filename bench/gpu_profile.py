"""Where a GPU call's time goes, to explain a missed GPU target (issue 37).

    python -m bench.gpu_profile [--device cuda] [--models-dir DIR] [--out FILE.json]

For each call (a capture from uint8 tensors on the device at batch 32, a capture from 64
distinct 640 x 480 JPEGs, chefer at batch 8), in fp32: its wall time, the device's kernel time
within it (``busy``: the share of the wall the GPU computed), and the top operators by self CPU
time and by self device time (``torch.profiler``, three calls after a warm-up).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch


def profile_calls(fns: dict[str, Any], device: torch.device, calls: int = 3, top: int = 15) -> dict[str, Any]:
    """Wall, kernel time and top operators of each function."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    out: dict[str, Any] = {}
    for name, fn in fns.items():
        fn()
        sync()
        t0 = time.perf_counter()
        with profile(activities=acts) as prof:
            for _ in range(calls):
                fn()
            sync()
        wall_ms = (time.perf_counter() - t0) * 1000 / calls
        ev = prof.key_averages()

        def dev_us(e: Any) -> float:
            return float(getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0.0)) or 0.0)

        # Kernels only: an operator's self device time is its kernels' again.
        cuda_type = getattr(torch.autograd, "DeviceType", None)
        kernels = [e for e in ev if cuda_type is not None and getattr(e, "device_type", None) == cuda_type.CUDA]
        kernel_ms = sum(dev_us(e) for e in kernels) / 1000 / calls
        out[name] = {
            "wall_ms_profiled": wall_ms,
            "device_ms": kernel_ms,
            "busy": kernel_ms / wall_ms if cuda else None,
            "top_cpu": [
                {"op": e.key, "calls": e.count / calls, "self_cpu_ms": e.self_cpu_time_total / 1000 / calls}
                for e in sorted(ev, key=lambda e: e.self_cpu_time_total, reverse=True)[:top]
            ],
            "top_device": [
                {"op": e.key, "calls": e.count / calls, "self_device_ms": dev_us(e) / 1000 / calls}
                for e in sorted(ev, key=dev_us, reverse=True)[:top]
            ]
            if cuda
            else [],
        }
    return out


def main(argv: list[str] | None = None) -> int:
    import headscope

    from .gpu_quick import jpegs

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--models-dir", default=None)
    ap.add_argument("--small", action="store_true", help="batch 2 everywhere (a dry run on a CPU)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    b32, b64, b8 = (2, 2, 2) if args.small else (32, 64, 8)
    kw = {"models_dir": args.models_dir} if args.models_dir else {}
    scope = headscope.load(device=args.device, precision="fp32", batch_size=max(b32, b64), **kw)
    rng = np.random.default_rng(0)
    levels = torch.from_numpy(rng.integers(0, 256, (b32, 3, 224, 224), dtype=np.uint8)).to(device)
    files = jpegs(b64)
    few = levels[:b8].contiguous()
    res = profile_calls(
        {
            f"capture_tensors_{b32}": lambda: scope.attention(levels),
            f"capture_jpegs_{b64}": lambda: scope.attention(files),
            f"chefer_{b8}": lambda: scope.relevance(few, method="chefer"),
        },
        device,
    )
    # Python's own time (cProfile) of the two captures: what the host does per picture.
    import cProfile
    import io
    import pstats

    for name, fn in (
        (f"capture_tensors_{b32}", lambda: scope.attention(levels)),
        (f"capture_jpegs_{b64}", lambda: scope.attention(files)),
    ):
        fn()
        pr = cProfile.Profile()
        pr.enable()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        pr.disable()
        buf = io.StringIO()
        pstats.Stats(pr, stream=buf).sort_stats("tottime").print_stats(25)
        res[name]["cprofile"] = buf.getvalue()
        print(f"cProfile {name}:", buf.getvalue()[-4000:])
    for name, r in res.items():
        busy = f"{r['busy']:.0%}" if r["busy"] is not None else "-"
        print(f"{name}: {r['wall_ms_profiled']:.1f} ms wall, {r['device_ms']:.1f} ms on the device ({busy})")
        for row in r["top_cpu"][:8]:
            print(f"    cpu {row['self_cpu_ms']:8.2f} ms x{row['calls']:<5g} {row['op']}")
        for row in r["top_device"][:8]:
            print(f"    dev {row['self_device_ms']:8.2f} ms x{row['calls']:<5g} {row['op']}")
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
