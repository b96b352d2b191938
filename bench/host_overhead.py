"""The host's own time per picture in ``Scope.attention`` and ``Scope.relevance``, on any machine.

    python -m bench.host_overhead [--device cpu|cuda] [--rounds N] [--out FILE.json]

On the H100 the capture of CLS rows from tensors ran at 0.4x a bare forward, and chefer2021 at
24x: the GPU waited for the host (issue #37's profile). This script measures that host time
where no GPU is: the model is a 12-layer ViT of the default model's depth and heads but width 48
at 32 x 32 pixels (4 patches), so its forward is almost all Python and kernel launches, the
regime of the default model at batch 1-128 on an H100. Its rows:

* ``forward``: the bare ``forward_features`` of a normalised batch on the device;
* ``capture``: ``Scope.attention(uint8 tensor [B, 3, 32, 32])``, CLS rows (what the #37 row
  times), and ``host_ms_per_picture``: ``(capture - forward) / B``;
* ``chefer``, ``chefer2021``, ``attnlrp`` at batch 8: ``Scope.relevance`` against the forward,
  and the aten operators each call runs (``ops``: on a GPU, about the kernel launches);
* ``pictures``: a list of 64 pictures of 640 x 480 as JPEG bytes and as decoded ``PIL.Image``s,
  ``Scope.attention`` against ``Scope._read`` (the preparation alone, the same threads:
  decoding, resizing, each picture's id) of the same list, ``vs_prepare``: how near a list's
  capture comes to its preparation when the forward costs next to nothing.
* ``convoy``: ``Scope.attention(uint8 tensor [16, 3, 32, 32])`` alone, and beside threads that
  prepare 640 x 480 JPEGs meanwhile (one thread, and one fewer than the machine's cores), in
  alternating phases: ``slowdown`` is how much longer the call takes beside them. On a GPU the
  calling thread dispatches every kernel while the decoding threads run (a list of JPEGs, the
  server's uploads), and each operator gives up the GIL and waits to take it back behind them.

Every ratio comes from the same rounds, interleaved (forward, capture, forward, capture, ...):
median of the per-round ratios, with min and max.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .gpu_quick import bare_forward, random_levels

BATCHES = (1, 32, 128)
RELEVANCE = ("chefer", "chefer2021", "attnlrp")


def tiny_scope(device: str) -> Any:
    """A Scope of a 12-layer, 6-head ViT of width 48 at 32 px (random weights, seeded)."""
    import timm

    import headscope

    torch.manual_seed(0)
    model = timm.create_model(
        "vit_small_patch16_224", pretrained=False, embed_dim=48, num_heads=6, depth=12, num_classes=10, img_size=32
    ).eval()
    return headscope.load(model, device=device, batch_size=max(BATCHES))  # every batch one forward


def aten_ops(fn: Callable[[], Any]) -> int:
    """The aten operators one call runs, outermost only (an operator inside another is one launch
    or none)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return sum(
        1
        for e in prof.events()
        if e.name.startswith("aten::") and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::"))
    )


def paired(ref: Callable[[], Any], fns: dict[str, Callable[[], Any]], rounds: int, sync: Callable[[], None]):
    """Interleaved timings: per round the reference then each function; ms lists per name."""
    times: dict[str, list[float]] = {"ref": [], **{k: [] for k in fns}}
    for fn in (ref, *fns.values()):  # warm-up
        fn()
        fn()
    for _ in range(rounds):
        for name, fn in (("ref", ref), *fns.items()):
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            times[name].append((time.perf_counter() - t0) * 1000)
    return times


def ratio_row(t: list[float], ref: list[float]) -> dict[str, float]:
    r = [a / b for a, b in zip(t, ref)]
    return {"ms_p50": float(np.median(t)), "vs_forward_p50": float(np.median(r)), "min": min(r), "max": max(r)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1: the host's cost alone)")
    ap.add_argument("--smoke", action="store_true", help="batches 1 and 2, one round (the tests run it so)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    batches, relevance_batch = ((1, 2), 2) if args.smoke else (BATCHES, 8)
    if args.smoke:
        args.rounds = 1
    before = torch.get_num_threads()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    try:
        return _run(args, batches, relevance_batch)
    finally:
        torch.set_num_threads(before)


def _run(args: argparse.Namespace, batches: tuple[int, ...], relevance_batch: int) -> int:
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    scope = tiny_scope(args.device)
    runner = scope.runner
    res: dict[str, Any] = {"device": str(device), "torch": torch.__version__, "rounds": args.rounds, "capture": {}}

    def save() -> None:  # after each row: a time limit keeps what was measured
        if args.out:
            Path(args.out).write_text(json.dumps(res, indent=2) + "\n")

    for B in batches:
        levels = random_levels(B, 32, device)
        forward = bare_forward(scope, runner.inputs(levels))

        t = paired(forward, {"capture": lambda levels=levels: scope.attention(levels)}, args.rounds, sync)
        row = ratio_row(t["capture"], t["ref"])
        row["forward_ms_p50"] = float(np.median(t["ref"]))
        row["host_ms_per_picture"] = float(np.median([(c - f) / B for c, f in zip(t["capture"], t["ref"])]))
        row["ops"], row["forward_ops"] = aten_ops(lambda: scope.attention(levels)), aten_ops(forward)
        res["capture"][str(B)] = row
        save()
        print(
            f"capture B={B:<4} {row['ms_p50']:7.2f} ms  forward {row['forward_ms_p50']:6.2f} ms  "
            f"ratio fwd/capture {1 / row['vs_forward_p50']:.2f}  host {row['host_ms_per_picture']:.3f} ms/picture  "
            f"ops {row['ops']} (forward {row['forward_ops']})",
            flush=True,
        )
    B = relevance_batch
    levels = random_levels(B, 32, device)
    forward_r = bare_forward(scope, runner.inputs(levels))

    fns = {m: (lambda m=m: scope.relevance(levels, method=m)) for m in RELEVANCE}
    t = paired(forward_r, fns, max(1 if args.smoke else 3, args.rounds // 3), sync)
    for m in RELEVANCE:
        row = ratio_row(t[m], t["ref"])
        row["ops"] = aten_ops(fns[m])
        res[m] = {**row, "batch": B}
        save()
        print(f"{m:<11} B={B} {row['ms_p50']:7.2f} ms  {row['vs_forward_p50']:.2f}x the forward  ops {row['ops']}")
    res["pictures"] = pictures(scope, 2 if args.smoke else 64, max(1, args.rounds // 3), sync)
    save()
    res["convoy"] = convoy(scope, 2 if args.smoke else 20, sync)
    save()
    return 0


def pictures(scope: Any, B: int, rounds: int, sync: Callable[[], None]) -> dict[str, Any]:
    """``Scope.attention`` of ``B`` JPEGs (640 x 480) and of the same pictures decoded, each
    against ``Scope._read`` of the same list (paired rounds), in pictures a second."""
    from .gpu_quick import jpegs, pil_images

    files = jpegs(B)
    out: dict[str, Any] = {"batch": B}
    for kind, items in (("jpeg", files), ("pil", pil_images(files))):
        t = paired(
            lambda items=items: scope._read(items),
            {"capture": lambda items=items: scope.attention(items)},
            rounds,
            sync,
        )
        ratios = [p / c for c, p in zip(t["capture"], t["ref"])]
        out[kind] = {
            "prepare_per_s": B / (float(np.median(t["ref"])) / 1000),
            "capture_per_s": B / (float(np.median(t["capture"])) / 1000),
            "vs_prepare": float(np.median(ratios)),
            "min": min(ratios),
            "max": max(ratios),
        }
        row = out[kind]
        print(
            f"pictures {kind:<4} B={B}  prepare {row['prepare_per_s']:6.0f}/s  capture {row['capture_per_s']:6.0f}/s  "
            f"{row['vs_prepare']:.2f}x the preparation",
            flush=True,
        )
    return out


def convoy(scope: Any, rounds: int, sync: Callable[[], None]) -> list[dict[str, Any]]:
    """``Scope.attention`` of 16 tensors alone and beside threads preparing JPEGs, alternating
    phases of 3 calls (``rounds`` phases each way); one row per number of threads."""
    import threading

    from .gpu_quick import jpegs

    files = jpegs(16)
    levels = random_levels(16, 32, scope.device)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    rows = []
    for n in sorted({1, max(1, cores - 1)}):
        run, done = threading.Event(), threading.Event()
        prepared = [0] * n

        def prepare(k: int) -> None:
            i = 0
            while not done.is_set():
                if run.wait(0.05):
                    scope._prepare(files[i % len(files)])
                    i += 1
                    prepared[k] += 1

        threads = [threading.Thread(target=prepare, args=(k,), daemon=True) for k in range(n)]
        for t in threads:
            t.start()
        alone: list[float] = []
        beside: list[float] = []
        busy_s, busy_n = 0.0, 0
        try:
            scope.attention(levels)  # warm
            for r in range(2 * rounds):
                on = r % 2 == 1
                (run.set if on else run.clear)()
                time.sleep(0.02)  # the threads are running (or done with their picture)
                n0, t0 = sum(prepared), time.perf_counter()
                for _ in range(3):
                    sync()
                    t = time.perf_counter()
                    scope.attention(levels)
                    sync()
                    (beside if on else alone).append((time.perf_counter() - t) * 1000)
                if on:
                    busy_s += time.perf_counter() - t0
                    busy_n += sum(prepared) - n0
        finally:
            done.set()
            run.set()
            for t in threads:
                t.join()
        row = {
            "threads": n,
            "alone_ms": float(np.median(alone)),
            "beside_ms": float(np.median(beside)),
            "slowdown": float(np.median(beside) / np.median(alone)),
            "preparations_per_s": busy_n / busy_s if busy_s > 0 else 0.0,
        }
        rows.append(row)
        print(
            f"convoy {n:>2} preparing thread(s)  attention(B=16) {row['alone_ms']:6.2f} ms alone, "
            f"{row['beside_ms']:6.2f} ms beside them ({row['slowdown']:.2f}x); {row['preparations_per_s']:.0f} JPEGs/s",
            flush=True,
        )
    return rows


if __name__ == "__main__":
    sys.exit(main())
