"""Relevance rows: one ``chefer`` map against a plain forward, and one method's perturbed
forwards against as many plain forwards at batch 8.

Timed interleaved (``run_interleaved``), the astronaut at 224 x 224, target ``output``:

* *chefer map*: what ``GET …/relevance?method=chefer`` computes: one forward that keeps every
  softmax map in the autograd graph (the unfused attention branch), the saliency decoder, one
  backward to the maps and the final tokens, and Chefer's rule (``app.engine.relevance``).
* *plain forward*: the backbone (fused attention) and the decoder in inference mode, batch 1.
* *perturbed forwards*: ``app.engine.faithfulness.PerturbationTest`` for one method's map: 20
  pictures (10 fractions x positive and negative; 0.05 .. 0.5, none at 0) built and run at batch
  8 (8 + 8 + 4), the curves and AUCs; the unperturbed output given, so exactly 20 forwards.
* *plain forwards*: 20 copies of the picture through the same model at batch 8 (8 + 8 + 4).

* *data set* (issue #40): the perturbation test of each of the four sample photos (224 x 224,
  each its own ``chefer`` map; 10 fractions x positive and negative = 20 perturbed forwards per
  photo plus its unperturbed one) run as ``survey --faithfulness`` runs it
  (``app.engine.faithfulness.run_tests``: every photo's forwards stacked across photos at batch
  8), the curves and AUCs included; against *plain forwards, data set*: the same count of
  forwards of the photos themselves at batch 8. Speed ratio = plain / data set (target >= 0.9x).
  Beside them, *each photo's test alone* (``PerturbationTest.step`` photo by photo: what ran
  before, 8 + 8 + 5 forwards a photo).
* *chefer2021 map* and *attnlrp map* (issue #40): the CVPR 2021 rule (one forward under the LRP
  rules, a gradient backward to the maps over its graph, then the relevance backward to the
  maps) and AttnLRP (one forward under its rules, one backward to the patch embedding).
* *plain gradient*: the model's own forward with the autograd graph and one backward to the
  pixels, no rule: what "a forward and a backward" costs on the device (AttnLRP's floor).

All ratios are paired per round (time over time: lower is faster). Targets (issues #27, #40):
<= 3x for the chefer map, <= 4x for chefer2021, <= 2x for attnlrp, <= 1.15x for the perturbed
forwards.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from headscope.engine.faithfulness import PerturbationTest, run_tests
from headscope.engine.model import LoadedModel
from headscope.engine.output import head_output
from headscope.engine.relevance import relevance

from .common import BenchFailure, Variant, paired, run_interleaved, summary
from .inproc import SAMPLES, Checks

MAP_TARGET = 3.0  # chefer map / plain forward (time)
LRP_TARGETS = {"chefer2021": 4.0, "attnlrp": 2.0}  # each LRP map / plain forward (time)
PERTURBED_TARGET = 1.15  # perturbed forwards / plain forwards at batch 8 (time)
DATASET_TARGET = 0.9  # plain forwards / the data set's perturbation tests, same count (speed: higher is faster)
BATCH = 8
FORWARDS = 20
SMOKE_FORWARDS = 4  # --smoke: one batch each, the mechanics only


def _pixels(lm: LoadedModel, device, name: str = "astronaut.png") -> torch.Tensor:
    from headscope.config import Settings
    from headscope.serving.pictures import Pictures

    pictures = Pictures.for_model(lm, Settings(resize="square"))
    return pictures.prepare((SAMPLES / name).read_bytes()).pixels[None].to(device)


PHOTOS = ("astronaut.png", "cat.png", "coffee.png", "rocket.jpg")


def variants(lm: LoadedModel, x: torch.Tensor, forwards: int, last: dict[str, Any]) -> list[Variant]:
    """The timed rows; each keeps its latest result in ``last`` (for the checks)."""
    hw = (int(x.shape[-2]), int(x.shape[-1]))
    fractions = [0.05 * (i + 1) for i in range(forwards // 2)]  # none at 0: every point a forward
    with torch.inference_mode():
        reference = head_output(lm, lm.model.forward_features(x), hw, logits=True)  # type: ignore[operator]
    chefer_map = relevance(lm, x, "output", ["chefer"])[0].maps["chefer"]
    copies = x.expand(forwards, -1, -1, -1).contiguous()

    def keep(key, fn):
        def call(_):
            last[key] = fn()
            return last[key]

        return call

    def one_map():
        return relevance(lm, x, "output", ["chefer"])[0]

    def lrp_map(method):
        return lambda: relevance(lm, x, "output", [method])[0]

    def one_forward():
        with torch.inference_mode():
            return head_output(lm, lm.model.forward_features(x), hw)  # type: ignore[operator]

    def one_gradient():  # what "one forward and one backward" costs before any rule
        with torch.inference_mode(False), torch.enable_grad():
            xg = x.detach().clone().requires_grad_(True)
            out = head_output(lm, lm.model.forward_features(xg), hw, logits=True)  # type: ignore[operator]
            return torch.autograd.grad(out.flatten(1).mean(1).sum(), xg)[0]

    def perturbed():
        test = PerturbationTest(
            lm, x[0], {"chefer": chefer_map}, "output", fractions, batch_size=BATCH, reference=reference
        )
        while test.step():
            pass
        return test

    def plain_forwards(images: torch.Tensor) -> torch.Tensor:  # the reference rows: forwards at batch 8
        outs = []
        with torch.inference_mode():
            for i in range(0, int(images.shape[0]), BATCH):
                chunk = images[i : i + BATCH]
                outs.append(head_output(lm, lm.model.forward_features(chunk), hw).flatten(1).mean(1))  # type: ignore[operator]
        return torch.cat(outs)

    def plain():
        return plain_forwards(copies)

    photos = torch.cat([_pixels(lm, x.device, name) for name in PHOTOS])  # P, 3, H, W
    photo_maps = [r.maps for r in relevance(lm, photos, "output", ["chefer"])]
    data_fractions = [0.0] + fractions  # 0: the unperturbed forward, as a survey runs it

    def data_set():
        tests = [
            PerturbationTest(lm, p, m, "output", data_fractions, batch_size=BATCH) for p, m in zip(photos, photo_maps)
        ]
        return run_tests(tests, BATCH)

    def data_alone():  # before issue #40's item 5: each photo's own test, its own part-full batches
        out = []
        for p, m in zip(photos, photo_maps):
            test = PerturbationTest(lm, p, m, "output", data_fractions, batch_size=BATCH)
            while test.step():
                pass
            out.append(test.result())
        return out

    count = len(PHOTOS) * (forwards + 1)
    data_copies = photos.repeat_interleave(forwards + 1, 0)  # count, 3, H, W

    def data_plain():
        return plain_forwards(data_copies)

    rows = [
        ("map", "chefer map (forward with maps + backward)", one_map),
        ("forward", "plain forward (batch 1)", one_forward),
        ("gradient", "plain gradient (forward with the graph + backward to the pixels)", one_gradient),
        ("perturbed", f"{forwards} perturbed forwards, one method (batch {BATCH})", perturbed),
        ("plain", f"{forwards} plain forwards (batch {BATCH})", plain),
        ("chefer2021", "chefer2021 map (CVPR 2021: gradients + LRP)", lrp_map("chefer2021")),
        ("attnlrp", "attnlrp map (one LRP forward + backward)", lrp_map("attnlrp")),
        ("dataset", f"data set: {len(PHOTOS)} photos' tests, {count} forwards (batch {BATCH})", data_set),
        ("dataset_plain", f"data set: {count} plain forwards (batch {BATCH})", data_plain),
        ("dataset_alone", "data set: each photo's test alone (batch 8 each)", data_alone),
    ]
    return [Variant(key, label, keep(key, fn), group="relevance") for key, label, fn in rows]


def run(
    lm: LoadedModel,
    device,
    iters: int,
    warmup: int,
    checks: Checks,
    verbose: bool = True,
    smoke: bool = False,
    sync: Callable[[], None] = lambda: None,
) -> dict[str, Any]:
    """Time the rows and check their results; the results dict."""
    x = _pixels(lm, device)
    forwards = SMOKE_FORWARDS if smoke else FORWARDS
    last: dict[str, Any] = {}
    vs = variants(lm, x, forwards, last)
    run_interleaved(vs, lambda: None, 1, iters, warmup, verbose, sync)
    rel, test = last["map"], last["perturbed"]
    m = rel.maps["chefer"]
    if m.shape != (16, 16) or abs(float(m.sum()) - 1) > 1e-4:
        raise BenchFailure(f"chefer map of shape {tuple(m.shape)} summing to {float(m.sum()):.4f}")
    res = test.result()
    curve = res.methods["chefer"]
    if test.total != forwards or not all(math.isfinite(v) for v in curve.positive + curve.negative):
        checks.fail(f"perturbation test: {test.total} forwards (expected {forwards}), curves {curve.positive}")
    results = last["dataset"]
    if len(results) != len(PHOTOS) or any(isinstance(r, BaseException) for r in results):
        checks.fail(f"data set perturbation tests: {results}")
    t = {v.key: v.times for v in vs}
    return {
        "image": "astronaut.png at 224 x 224",
        "target": "output",
        "rounds": iters,
        "forwards": forwards,
        "batch": BATCH,
        "rows": {v.key: {"label": v.label, "ms": summary([s * 1000 for s in v.times])} for v in vs},
        "map_vs_forward": paired(t["map"], t["forward"]),
        "perturbed_vs_plain": paired(t["perturbed"], t["plain"]),
        **{f"{m}_vs_forward": paired(t[m], t["forward"]) for m in LRP_TARGETS},
        "gradient_vs_forward": paired(t["gradient"], t["forward"]),
        "attnlrp_vs_gradient": paired(t["attnlrp"], t["gradient"]),
        # speed, not time: plain forwards' time over the data set's tests' time (higher is faster)
        "dataset_speed_vs_plain": paired(t["dataset_plain"], t["dataset"]),
        "dataset_alone_speed_vs_plain": paired(t["dataset_plain"], t["dataset_alone"]),
        "dataset_photos": len(PHOTOS),
        "auc_positive": curve.auc_positive,
        "auc_negative": curve.auc_negative,
    }


def table(res: dict[str, Any]) -> list[str]:
    """The printed rows."""
    W = 50
    lines = [
        "",
        f"Relevance, {res['image']}, target {res['target']} (ratio: paired per round, time over time: lower is faster)",
        f"{'':<{W}} {'ms p50':>9} {'[p10-p90]':>19}",
    ]
    for row in res["rows"].values():
        ms = row["ms"]
        span = f"[{ms['p10']:.0f}-{ms['p90']:.0f}]"
        lines.append(f"  {row['label']:<{W - 2}} {ms['median']:>9.1f} {span:>19}")
    mf, pp = res["map_vs_forward"], res["perturbed_vs_plain"]
    lines += [
        f"  chefer map / plain forward: {mf['median']:.2f}x [{mf['p10']:.2f}-{mf['p90']:.2f}] "
        f"(target <= {MAP_TARGET:.2f}x)",
        f"  {res['forwards']} perturbed / {res['forwards']} plain forwards at batch {res['batch']}: "
        f"{pp['median']:.2f}x [{pp['p10']:.2f}-{pp['p90']:.2f}] (target <= {PERTURBED_TARGET:.2f}x)",
    ]
    ds = res.get("dataset_speed_vs_plain")
    if ds:
        lines.append(
            f"  data set's perturbation tests, speed vs as many plain forwards: {ds['median']:.2f}x "
            f"[{ds['p10']:.2f}-{ds['p90']:.2f}] (target >= {DATASET_TARGET:.2f}x)"
        )
        al = res["dataset_alone_speed_vs_plain"]
        lines.append(
            f"  (each photo's test alone, speed vs as many plain forwards: {al['median']:.2f}x "
            f"[{al['p10']:.2f}-{al['p90']:.2f}])"
        )
    for m, target in LRP_TARGETS.items():
        r = res.get(f"{m}_vs_forward")
        if r:
            span = f"[{r['p10']:.2f}-{r['p90']:.2f}]"
            lines.append(f"  {m} map / plain forward: {r['median']:.2f}x {span} (target <= {target:.2f}x)")
    for key, text in (
        ("gradient_vs_forward", "plain gradient / plain forward"),
        ("attnlrp_vs_gradient", "attnlrp map / plain gradient"),
    ):
        r = res.get(key)
        if r:
            lines.append(f"  {text}: {r['median']:.2f}x [{r['p10']:.2f}-{r['p90']:.2f}]")
    return lines


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.relevance``: these rows alone (the full bench runs them too)."""
    import argparse
    import json
    import os
    from pathlib import Path

    from headscope.serving.malloc import tune_malloc
    from headscope.zoo.loaders import load_embedded

    p = argparse.ArgumentParser(prog="python -m bench.relevance", description=__doc__)
    p.add_argument("--rounds", type=int, default=5, help="interleaved timed rounds (default 5)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--models-dir", type=Path, default=SAMPLES.parent.parent / "models")
    p.add_argument("--out", type=Path, default=None, help="also write the results as JSON")
    a = p.parse_args(argv)
    tune_malloc()
    lm = load_embedded(a.models_dir)
    lm.to(a.device)
    checks = Checks()
    load = os.getloadavg()
    res = run(lm, torch.device(a.device), a.rounds, 1, checks)
    res["load_average"] = {"before": load[0], "after": os.getloadavg()[0]}  # a shared machine: say how busy
    print("\n".join(table(res)))
    if a.out:
        a.out.write_text(json.dumps(res, indent=1) + "\n")
    return 1 if checks.failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
