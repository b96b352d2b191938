"""How far bf16 and fp16 are from fp32, per output kind, on one device (docs/performance.md's
*Precision* table).

    python -m bench.precision [--device cuda] [--models-dir DIR] [--out FILE.json]

Each precision's ``headscope.load(precision=...)`` against ``precision="fp32"`` on the same
device and the same pictures (the sample photos), the largest difference over the pictures:

* ``maps``: the CLS rows of every layer and head, absolute (a row sums to 1);
* ``entropy`` (normalised, 0..1) and ``distance_px``: the statistics, absolute;
* ``chefer``: the relevance map, as a fraction of the fp32 map's maximum;
* ``y``: the relevance target (the model's saliency mean), relative;
* ``output``: the model's own output (the saliency map, 0..1), absolute;
* ``faithfulness_auc``: the perturbation test's AUCs (``chefer`` and ``attention``, both curves,
  the live protocol at fractions 0, 0.25, 0.5, 0.75), absolute (an AUC is 0..0.9 or so);
* ``importance``: every head's gradient importance, as a fraction of the fp32 maximum.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ["astronaut.png", "cat.png", "coffee.png", "rocket.jpg"]
FRACTIONS = [0, 0.25, 0.5, 0.75]


def errors(device: str, models_dir: str | None, precisions: list[str]) -> dict[str, Any]:
    """The largest difference of each output kind against fp32, per precision."""
    import headscope

    kw = {"models_dir": models_dir} if models_dir else {}
    pics = [
        (ROOT / "static" / "samples" / n).read_bytes() for n in SAMPLES if (ROOT / "static" / "samples" / n).exists()
    ]
    ref = headscope.load(device=device, precision="fp32", **kw)

    def outputs(scope: Any) -> list[dict[str, Any]]:
        out = []
        for pic in pics:
            att = scope.attention(pic)
            st = att.stats()
            rel = scope.relevance(pic, method="chefer")
            out.append(
                {
                    "maps": att.maps.float().cpu(),
                    "entropy": torch.tensor(st["entropy"].to_numpy(float)),
                    "distance_px": torch.tensor(st["distance_px"].to_numpy(float)),
                    "chefer": rel["relevance"].float().cpu(),
                    "y": float(rel["y"]),
                    "output": scope.output(pic)["output"].float().cpu(),
                    "faithfulness_auc": torch.tensor(
                        [
                            c[k]
                            for c in scope.faithfulness(pic, methods="chefer,attention", fractions=FRACTIONS)[
                                "methods"
                            ].values()
                            for k in ("auc_positive", "auc_negative")
                        ]
                    ),
                    "importance": scope.importance(pic, method="gradient")["importance"].float().cpu(),
                    "precision": att.precision,
                }
            )
        return out

    base = outputs(ref)
    res: dict[str, Any] = {"device": device, "pictures": len(pics), "precisions": {}}
    for p in precisions:
        scope = headscope.load(ref.lm, precision=p)
        got = outputs(scope)
        row: dict[str, float] = {}
        for a, b in zip(base, got):
            assert b["precision"] == p, b["precision"]
            diffs = {
                "maps": float((b["maps"] - a["maps"]).abs().max()),
                "entropy": float((b["entropy"] - a["entropy"]).abs().max()),
                "distance_px": float((b["distance_px"] - a["distance_px"]).abs().max()),
                "chefer": float((b["chefer"] - a["chefer"]).abs().max() / a["chefer"].abs().max().clamp_min(1e-30)),
                "y": abs(b["y"] - a["y"]) / max(abs(a["y"]), 1e-30),
                "output": float((b["output"] - a["output"]).abs().max()),
                "faithfulness_auc": float((b["faithfulness_auc"] - a["faithfulness_auc"]).abs().max()),
                "importance": float(
                    (b["importance"] - a["importance"]).abs().max() / a["importance"].abs().max().clamp_min(1e-30)
                ),
            }
            for k, v in diffs.items():
                row[k] = max(row.get(k, 0.0), v)
        res["precisions"][p] = row
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--models-dir", default=None)
    ap.add_argument("--precisions", default="bf16,fp16")
    ap.add_argument("--out", default=None, help="the JSON file (default: print only)")
    args = ap.parse_args(argv)
    res = errors(args.device, args.models_dir, args.precisions.split(","))
    res["torch"] = torch.__version__
    if args.device.startswith("cuda"):
        res["gpu"] = torch.cuda.get_device_name()
    text = json.dumps(res, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
