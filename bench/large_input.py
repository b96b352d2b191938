"""``python -m bench.large_input``: CLS rows at a large input against timm's ``AttentionExtract``.

At 518 x 518 (1,370 tokens) the attention maps are where the time goes: timm's
``AttentionExtract`` needs the explicit softmax of every head (fused attention switched off) and
hands back every map, while Headscope's capture keeps the fused forward and computes only the
rows asked for. Timed interleaved at batch 1, one random picture, fp32 (rows, paired per round
to the bare forward of the same round, as speed: bare time over the row's time):

* ``bare``: the model's own ``forward_features`` (fused attention), the reference;
* ``headscope_cls``: the capture (``LoadedModel.capture``) of the CLS rows of every layer and
  head, as the worker computes them;
* ``timm_cls``: ``AttentionExtract`` on a fresh timm model with the same weights, its CLS rows.

Both give the same rows (checked, <= 1e-5). Target (issue #37: a CPU bar that must hold):
Headscope >= 1.5x timm. Prints JSON, and writes it with ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import torch

from headscope.engine.analysis import attention_tensor
from headscope.engine.selection import Selection

from . import peers
from .common import BenchFailure, paired

TARGET = 1.5  # Headscope's speed over timm AttentionExtract's, CLS rows


def measure(models_dir: Path, size: int = 518, rounds: int = 10) -> dict[str, Any]:
    from headscope.serving.malloc import tune_malloc
    from headscope.zoo.loaders import load_embedded

    tune_malloc()
    lm = load_embedded(models_dir)
    model, cap = lm.model, lm.capture
    grid = (size // lm.patch_size[0], size // lm.patch_size[1])
    ext = peers.build_timm_extract(peers.timm_state_dict(models_dir))
    x = torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(0))
    sel = Selection(list(range(lm.num_layers)), list(range(lm.num_heads)), [0])

    def bare() -> Any:
        with torch.inference_mode():
            return model.forward_features(x)  # type: ignore[operator]

    def headscope_cls() -> torch.Tensor:
        with torch.inference_mode():
            with cap.capturing(materialise=False):
                model.forward_features(x)  # type: ignore[operator]
            return attention_tensor(cap.results()[0], sel)  # L, H, 1, N

    def timm_cls() -> torch.Tensor:
        with torch.inference_mode():
            return peers.timm_maps(ext, x)[0, :, :, 0:1, :].contiguous()  # L, H, 1, N

    a, b = headscope_cls(), timm_cls()
    diff = float((a.reshape(b.shape) - b).abs().max())
    if a.numel() != b.numel() or not diff <= 1e-5:
        raise BenchFailure(f"the CLS rows differ: shapes {tuple(a.shape)} / {tuple(b.shape)}, max |diff| {diff:.3g}")
    rows = {"bare": bare, "headscope_cls": headscope_cls, "timm_cls": timm_cls}
    times: dict[str, list[float]] = {k: [] for k in rows}
    load0 = os.getloadavg()[0]
    for _ in range(rounds + 1):  # the first round warms up
        for k, fn in rows.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    times = {k: v[1:] for k, v in times.items()}
    hs, tm = paired(times["bare"], times["headscope_cls"]), paired(times["bare"], times["timm_cls"])
    over = paired(times["timm_cls"], times["headscope_cls"])  # timm's time over Headscope's: speed
    return {
        "input": f"{size}x{size}, batch 1, {1 + grid[0] * grid[1]} tokens",
        "rounds": rounds,
        "threads": torch.get_num_threads(),
        "ms_median": {k: sorted(v)[len(v) // 2] * 1000 for k, v in times.items()},
        "headscope_speed_vs_bare": hs,
        "timm_speed_vs_bare": tm,
        "headscope_over_timm": over,
        "target": TARGET,
        "ok": over["median"] >= TARGET,
        "max_abs_diff": diff,
        "load_average": {"before": load0, "after": os.getloadavg()[0]},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.large_input", description=__doc__)
    p.add_argument("--size", type=int, default=518, help="input side in pixels (default 518)")
    p.add_argument("--rounds", type=int, default=10, help="interleaved timed rounds (default 10)")
    p.add_argument("--models-dir", type=Path, default=Path(__file__).resolve().parents[1] / "models")
    p.add_argument("--out", type=Path, default=None, help="also write the results as JSON")
    a = p.parse_args(argv)
    res = measure(a.models_dir, a.size, a.rounds)
    text = json.dumps(res, indent=1)
    print(text)
    if a.out:
        a.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
