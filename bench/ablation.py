"""Head-importance rows: the exact sweep against L x H whole-model forwards, and the gradient
method's rank correlation with the sweep.

Timed interleaved (``run_interleaved``), one image at 224 x 224:

* *exact sweep*: what ``GET …/importance`` runs: one unablated forward keeping each block's
  input and head outputs, then for each block the batch of its H heads from that block's output
  projection on, the final norm and the model's output (the saliency decoder for the default
  model).
* *L x H whole-model forwards*: the same L x H outputs the plain way: every head removed in a
  whole forward of backbone and decoder, batched by H as the sweep is (L calls of a batch of H).
* *backbone only*: the same two without the output head (forward_features only), to compare
  with the arithmetic sum_l (L - l) / L^2 (0.54 for L = 12).
* *gradient*: one forward and backward pass for every head (Michel et al.), beside one whole
  forward.

The sweep's exactness against the whole forwards is checked (max |difference|), and the
gradient ranking is compared with the sweep's (Spearman) on the four sample photos.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from headscope.engine import importance as imp
from headscope.engine.model import LoadedModel
from headscope.engine.output import change, head_output

from .common import BenchFailure, Variant, paired, run_interleaved, summary
from .inproc import SAMPLES, Checks

SWEEP_TARGET = 0.60  # (0.54 backbone + 0.22 decoder) / (1 + 0.22): docs/bench.md, "Head importance"


def _pixels(lm: LoadedModel, name: str, square: bool, device) -> torch.Tensor:
    from headscope.config import Settings
    from headscope.serving.pictures import Pictures

    pictures = Pictures.for_model(lm, Settings(resize="square" if square else "aspect"))
    return pictures.prepare((SAMPLES / name).read_bytes()).pixels[None].to(device)


def variants(lm: LoadedModel, x: torch.Tensor, last: dict[str, Any]) -> list[Variant]:
    """The timed rows; each keeps its latest result in ``last`` (for the checks)."""
    L, H = lm.num_layers, lm.num_heads
    hw = (int(x.shape[-2]), int(x.shape[-1]))
    singles = [[((layer, h),) for h in range(H)] for layer in range(L)]

    def keep(key, fn):
        def call(_):
            last[key] = fn()
            return last[key]

        return call

    def sweep():
        base = imp.baseline(lm, x)
        return torch.stack([imp.sweep_block(lm, base, layer)["change"] for layer in range(L)])

    def whole():
        outs = []
        base = imp.masked_outputs(lm, x, [()])
        for sets in singles:
            outs.append(change(lm.output_kind, base, imp.masked_outputs(lm, x, sets)).cpu())
        return torch.stack(outs)

    def sweep_backbone():
        base = imp.baseline(lm, x)
        return [imp.sweep_features(lm, base, layer) for layer in range(L)]

    def whole_backbone():
        from headscope.engine.ablation import batch_masks, heads_masked

        out = []
        with torch.inference_mode():
            lm.model.forward_features(x)
            for sets in singles:
                with heads_masked(lm.model, batch_masks(sets, H, x.device)):
                    out.append(lm.model.forward_features(x.expand(H, -1, -1, -1)))
        return out

    def gradient():
        return imp.gradient_importance(lm, x)[0]

    def one_forward():
        with torch.inference_mode():
            return head_output(lm, lm.model.forward_features(x), hw)

    rows = [
        ("sweep", "exact sweep (from block l's projection on)", sweep),
        ("whole", f"L x H whole-model forwards ({L} x batch {H})", whole),
        ("sweep_bb", "exact sweep, backbone only", sweep_backbone),
        ("whole_bb", "L x H backbone forwards, backbone only", whole_backbone),
        ("gradient", "gradient: one forward + backward", gradient),
        ("forward", "one whole-model forward (batch 1)", one_forward),
    ]
    return [Variant(key, label, keep(key, fn), group="ablation") for key, label, fn in rows]


def run(
    lm: LoadedModel,
    device,
    iters: int,
    warmup: int,
    checks: Checks,
    verbose: bool = True,
    all_samples: bool = True,
    sync: Callable[[], None] = lambda: None,
) -> dict[str, Any]:
    """Time the rows, check the sweep, rank-correlate the gradient; the results dict.

    Args:
        all_samples: also rank-correlate on the four sample photos at their own sizes (else
            only the timed image, from the timed calls' own results).
    """
    x = _pixels(lm, "astronaut.png", True, device)  # 512 x 512 -> 224 x 224
    last: dict[str, Any] = {}
    vs = variants(lm, x, last)
    run_interleaved(vs, lambda: None, 1, iters, warmup, verbose, sync)
    got, want = last["sweep"], last["whole"]
    err = float((got - want).abs().max())
    checks.values["ablation_sweep_vs_whole_forwards"] = err
    if got.shape != (lm.num_layers, lm.num_heads) or err > 1e-4:
        checks.fail(f"ablation sweep differs from whole forwards by {err:.2e} (shape {tuple(got.shape)})")
    t = {v.key: v.times for v in vs}
    res: dict[str, Any] = {
        "image": "astronaut.png at 224 x 224",
        "layers": lm.num_layers,
        "heads": lm.num_heads,
        "kind": lm.output_kind,
        "rounds": iters,
        "rows": {v.key: {"label": v.label, "ms": summary([s * 1000 for s in v.times])} for v in vs},
        "sweep_vs_whole": paired(t["sweep"], t["whole"]),
        "sweep_vs_whole_backbone": paired(t["sweep_bb"], t["whole_bb"]),
        "gradient_vs_forward": paired(t["gradient"], t["forward"]),
        "sweep_vs_lh_single_forwards": paired(t["sweep"], [f * lm.num_layers * lm.num_heads for f in t["forward"]]),
        "arithmetic_backbone": sum(lm.num_layers - la for la in range(lm.num_layers)) / lm.num_layers**2,
        "max_abs_diff_vs_whole": err,
    }
    # the gradient method's ranking against the exact sweep
    rho = {f"astronaut.png {tuple(x.shape[-2:])}": imp.spearman(last["gradient"], last["sweep"])}
    if all_samples:
        for path in sorted(p for p in SAMPLES.iterdir() if p.suffix in (".png", ".jpg")):
            xs = _pixels(lm, path.name, False, device)
            if tuple(xs.shape) == tuple(x.shape):
                continue  # the timed image
            base = imp.baseline(lm, xs)
            exact = torch.stack([imp.sweep_block(lm, base, la)["change"] for la in range(lm.num_layers)])
            rho[f"{path.name} {tuple(xs.shape[-2:])}"] = imp.spearman(imp.gradient_importance(lm, xs)[0], exact)
    if not all(-1 <= r <= 1 for r in rho.values()):
        raise BenchFailure(f"rank correlations out of range: {rho}")
    res["gradient_spearman"] = rho
    res["gradient_spearman_mean"] = sum(rho.values()) / len(rho)
    return res


def table(res: dict[str, Any]) -> list[str]:
    """The printed rows."""
    W = 50
    L, H = res["layers"], res["heads"]
    lines = [
        "",
        f"Head importance, {res['image']}, {L} x {H} heads, output {res['kind']} "
        "(ratio: paired per round, time over time: lower is faster)",
        f"{'':<{W}} {'ms p50':>9} {'[p10-p90]':>19}",
    ]
    for row in res["rows"].values():
        ms = row["ms"]
        span = f"[{ms['p10']:.0f}-{ms['p90']:.0f}]"
        lines.append(f"  {row['label']:<{W - 2}} {ms['median']:>9.1f} {span:>19}")
    sw, bb = res["sweep_vs_whole"], res["sweep_vs_whole_backbone"]
    lines += [
        f"  exact sweep / L x H whole-model forwards: {sw['median']:.2f}x [{sw['p10']:.2f}-{sw['p90']:.2f}]"
        f"  (backbone only {bb['median']:.2f}x [{bb['p10']:.2f}-{bb['p90']:.2f}]; "
        f"arithmetic {res['arithmetic_backbone']:.2f}x)",
        f"  exact sweep / {L * H} single-image whole forwards (batch 1): "
        f"{res['sweep_vs_lh_single_forwards']['median']:.2f}x",
        f"  gradient (forward + backward) / one whole forward: {res['gradient_vs_forward']['median']:.2f}x",
        f"  sweep max |difference| to whole forwards: {res['max_abs_diff_vs_whole']:.1e}",
        "  gradient vs exact sweep, Spearman rank correlation: "
        + ", ".join(f"{k} {v:.2f}" for k, v in res["gradient_spearman"].items())
        + f" (mean {res['gradient_spearman_mean']:.2f})",
    ]
    return lines


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.ablation``: these rows alone (the full bench runs them too)."""
    import argparse
    import json
    from pathlib import Path

    from headscope.serving.malloc import tune_malloc
    from headscope.zoo.loaders import load_embedded

    p = argparse.ArgumentParser(prog="python -m bench.ablation", description=__doc__)
    p.add_argument("--rounds", type=int, default=5, help="interleaved timed rounds (default 5)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--models-dir", type=Path, default=SAMPLES.parent.parent / "models")
    p.add_argument("--out", type=Path, default=None, help="also write the results as JSON")
    p.add_argument("--quick", action="store_true", help="rank correlation on the timed image only")
    a = p.parse_args(argv)
    tune_malloc()
    lm = load_embedded(a.models_dir)
    lm.to(a.device)
    checks = Checks()
    res = run(lm, torch.device(a.device), a.rounds, 1, checks, all_samples=not a.quick)
    print("\n".join(table(res)))
    if a.out:
        a.out.write_text(json.dumps(res, indent=1) + "\n")
    return 1 if checks.failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
