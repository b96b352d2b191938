"""How long a model with weights takes to load, built on the meta device (the loaders' way,
``app/zoo/loaders.py`` ``_create_with``) against built, randomly initialised and then overwritten
(the way before), in paired rounds (docs/performance.md's *Loading a model*).

    python -m bench.model_load [--rounds N] [--archs A,B] [--models-dir DIR] [--out FILE.json]

Rows: the default model (``load_embedded``), and ``local:ARCH@FILE`` (``load_local``) for each
architecture of ``--archs`` with seeded random weights written once to a temporary safetensors
file (reading the file is in both timings, from the page cache after the first round). Each
round times the loader with ``_create_with`` and then with the usual construction in its place;
the ratio is the median of the rounds' ratios.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
ARCHS = ("vit_base_patch16_224", "vit_large_patch16_224")


def _usual(
    arch: str, sd: dict[str, torch.Tensor], source: str = "", **kwargs: Any
) -> tuple[torch.nn.Module, bool, list[str], list[str]]:
    """The construction before: initialised, then the weights copied in (``source``: unused, as
    ``_create_with``'s)."""
    from headscope.zoo import loaders

    model, dynamic = loaders._create(arch, pretrained=False, **kwargs)
    missing, unexpected = model.load_state_dict(sd, strict=False)
    return model, dynamic, list(missing), list(unexpected)


def paired(load: Callable[[], Any], rounds: int) -> dict[str, Any]:
    """``load()`` with the loaders' ``_create_with`` and with :func:`_usual` in its place, alternating."""
    from headscope.zoo import loaders

    meta = loaders._create_with
    times: dict[str, list[float]] = {"meta": [], "usual": []}
    for _ in range(rounds):
        for name, create in (("meta", meta), ("usual", _usual)):
            loaders._create_with = create  # type: ignore[assignment]
            try:
                t0 = time.perf_counter()
                load()
                times[name].append(time.perf_counter() - t0)
            finally:
                loaders._create_with = meta
    ratios = [u / m for m, u in zip(times["meta"], times["usual"])]
    return {
        "meta_s_p50": float(np.median(times["meta"])),
        "usual_s_p50": float(np.median(times["usual"])),
        "speedup_p50": float(np.median(ratios)),
        "speedup_min": min(ratios),
        "speedup_max": max(ratios),
        "meta_s": times["meta"],
        "usual_s": times["usual"],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--archs", default=",".join(ARCHS), help="timm architectures for local:ARCH@FILE rows")
    ap.add_argument("--models-dir", default=str(ROOT / "models"))
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    import timm
    from safetensors.torch import save_file

    from headscope.zoo import loaders
    from headscope.zoo.ids import ModelSpec

    res: dict[str, Any] = {"torch": torch.__version__, "threads": torch.get_num_threads(), "rounds": args.rounds}
    loaders.load_embedded(Path(args.models_dir))  # converted, and its file in the page cache
    res["embedded"] = paired(lambda: loaders.load_embedded(Path(args.models_dir)), args.rounds)
    print(f"embedded  {res['embedded']['meta_s_p50']:.2f} s vs {res['embedded']['usual_s_p50']:.2f} s", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for arch in filter(None, args.archs.split(",")):
            torch.manual_seed(0)
            path = Path(tmp) / f"{arch}.safetensors"
            save_file({k: v.contiguous() for k, v in timm.create_model(arch).state_dict().items()}, str(path))
            spec = ModelSpec.parse(f"local:{arch}@{path}")
            row = paired(lambda spec=spec: loaders.load_local(spec), args.rounds)
            row["params_m"] = sum(t.numel() for t in loaders.load_local(spec).model.parameters()) / 1e6
            res[f"local:{arch}"] = row
            print(f"{arch:<24} {row['meta_s_p50']:.2f} s vs {row['usual_s_p50']:.2f} s", flush=True)
    text = json.dumps(res, indent=2) + "\n"
    if args.out:
        Path(args.out).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
