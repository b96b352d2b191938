"""Can the relevance passes run as captured CUDA graphs, and what would a replay gain? (issues 37, 40)

    python -m bench.graph_probe [--device cuda] [--models-dir DIR] [--batch 8] [--rounds 20] [--out FILE.json]

On an H100 the relevance maps are bound by the host's dispatch, not by the GPU's arithmetic:
``chefer`` cost 6.2x a forward at batch 8 and ``chefer2021`` 24x, where the targets are 3x and
4x. A CUDA graph replays a captured pass's kernels without the host, so it is the one lever left
for those targets. This probe measures it before any serving path is built on it.

For the bare forward (the backbone in inference mode and the head or decoder) and for each
method's device work (``relevance_tensors``: the forwards and backwards of ``relevance`` with
nothing read back to the host), at one batch of the sample photos (224 x 224, fp32, TF32 off):

* ``eager_ms``: the call as it runs today (median of ``--rounds``, each synchronised);
* ``sync``: the first place in Headscope's code where the call waits for the device (a value read
  back to the host: ``torch.cuda.set_sync_debug_mode("error")``), or null: what a capture cannot
  hold, found before it is tried;
* ``captured``: whether one CUDA graph captured it, after three warm-up calls on a side stream;
  else ``error``, the first line of what stopped the capture (and of what it raised first);
* ``replay_ms``: the graph's replay (median of ``--rounds``);
* ``eager_x`` and ``replay_x``: each time over the eager forward's;
* ``replay_error``: the replay's largest difference from the eager call's maps, over the
  largest value of those maps (0 where the kernels are the same and deterministic).

On a CPU (a dry run of the script) only the eager rows are measured; ``captured`` is null there.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from .gpu_quick import timed

METHODS = ("chefer", "chefer2021", "attnlrp")


def _median_ms(fn: Callable[[], Any], sync: Callable[[], None], rounds: int) -> float:
    return statistics.median(timed(fn, rounds, 0, sync)) * 1000


def _first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0][:300] if lines else ''}"


def _first_sync(fn: Callable[[], Any]) -> str | None:
    """Where ``fn`` first waits for the CUDA device, as ``file:line: error``; None if it never does."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        fn()
        return None
    except RuntimeError as e:
        ours = [f for f in traceback.extract_tb(e.__traceback__) if "headscope" in f.filename or "/app/" in f.filename]
        where = f"{Path(ours[-1].filename).name}:{ours[-1].lineno}" if ours else "?"
        return f"{where}: {_first_line(e)}"
    finally:
        torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()


def _capture(fn: Callable[[], torch.Tensor]) -> tuple[Any, torch.Tensor]:
    """One CUDA graph of ``fn`` (warm-up on a side stream first, as torch.cuda.graph asks) and the
    tensor its replays write."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


def probe(lm: Any, x: torch.Tensor, rounds: int, methods: tuple[str, ...] = METHODS) -> dict[str, Any]:
    """The rows for the model ``lm`` and the batch ``x`` (normalised, on the model's device)."""
    from headscope.engine.output import head_output
    from headscope.engine.relevance import parse_methods, parse_target, relevance_tensors

    cuda = x.device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    hw = (int(x.shape[-2]), int(x.shape[-1]))
    tgt = parse_target(None, lm, hw)

    def forward() -> torch.Tensor:
        with torch.inference_mode():
            return head_output(lm, lm.model.forward_features(x), hw, logits=True)

    calls: dict[str, Callable[[], torch.Tensor]] = {"forward": forward}
    for m in methods:
        names = parse_methods([m])
        calls[m] = lambda names=names, m=m: relevance_tensors(lm, x, tgt, names).maps[m]
    rows: dict[str, Any] = {}
    for name, fn in calls.items():
        want = fn().detach().float()
        row: dict[str, Any] = {"eager_ms": _median_ms(fn, sync, rounds), "captured": None}
        if cuda:
            row["sync"] = _first_sync(fn)
            try:
                graph, out = _capture(fn)
                graph.replay()
                sync()
                scale = float(want.abs().max().clamp_min(1e-30))
                row.update(
                    captured=True,
                    replay_ms=_median_ms(graph.replay, sync, rounds),
                    replay_error=float((out.detach().float() - want).abs().max()) / scale,
                )
                del graph, out
            except Exception as e:  # the finding is what stopped the capture
                row.update(captured=False, error=_first_line(e))
                if e.__context__ is not None:  # torch.cuda.graph's exit raised over the first error
                    row["error_first"] = _first_line(e.__context__)
                torch.cuda.synchronize()
        rows[name] = row
    base = rows["forward"]["eager_ms"]
    for row in rows.values():
        row["eager_x"] = row["eager_ms"] / base
        if row.get("replay_ms") is not None:
            row["replay_x"] = row["replay_ms"] / base
    return rows


def main(argv: list[str] | None = None) -> int:
    import headscope
    from headscope.engine.device import exact_fp32_process

    from .relevance import PHOTOS, _pixels

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--models-dir", default=None)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--methods", default=",".join(METHODS), help="comma-separated: chefer, chefer2021, attnlrp")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    exact_fp32_process()  # fp32 means fp32, as the server computes
    kw = {"models_dir": args.models_dir} if args.models_dir else {}
    lm = headscope.load(device=args.device, precision="fp32", **kw).lm
    photos = [_pixels(lm, args.device, name) for name in PHOTOS]  # each decoded once
    x = torch.cat([photos[i % len(photos)] for i in range(args.batch)])  # B, 3, H, W
    methods = tuple(m.strip() for m in args.methods.split(",") if m.strip())
    rows = probe(lm, x, args.rounds, methods)
    result = {
        "device": torch.cuda.get_device_name() if x.device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "model": lm.id,
        "batch": args.batch,
        "rounds": args.rounds,
        "rows": rows,
    }
    for name, r in rows.items():
        line = f"{name:>11}: eager {r['eager_ms']:8.2f} ms ({r['eager_x']:.2f}x a forward)"
        if r["captured"]:
            line += f", replay {r['replay_ms']:8.2f} ms ({r['replay_x']:.2f}x), replay error {r['replay_error']:.1e}"
        elif r["captured"] is False:
            line += f", not captured: {r.get('error_first') or r['error']}"
        if r.get("sync"):
            line += f"; first wait for the device at {r['sync']}"
        print(line)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
