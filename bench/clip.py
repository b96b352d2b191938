"""Phrases and zero-shot on an open_clip model (issue #42), timed interleaved in one process.

``python -m bench.clip [--model open_clip:ViT-B-32] [--iters 10] [--out FILE.json]``
(random weights by default: the speed does not depend on them; the astronaut at the model's
input size).

* *phrase relevance*: what ``GET …/relevance?target=text:PHRASE`` computes: one forward of the
  image tower keeping every softmax map in the autograd graph, one forward of the text tower
  keeping its maps, one backward, every method's map (chefer, grad_attention, rollout, attention,
  random, LeGrad with its two extra backwards through the last blocks) and the tokens' relevance
  (``app.engine.text_relevance.text_relevance``).
* *both towers*: one plain forward of the image tower and one of the text tower (inference mode).
* *zero-shot, 10 labels*: ``app.engine.text_relevance.zero_shot``: one image forward, the labels'
  embeddings from the cache (filled in the warm-up, as a server's cache is after the first ask).
* *image + 10 texts*: one image forward plus the ten labels' text forwards, uncached.

Ratios are paired per round (time over time). Targets (issue #42): phrase relevance <= 3x both
towers; zero-shot for 10 labels <= 1.5x one image forward plus the text forwards.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
from pathlib import Path

import torch

from headscope.engine.text_relevance import text_relevance, zero_shot
from headscope.zoo.ids import ModelSpec
from headscope.zoo.loaders import build

from .common import Variant, run_interleaved, summary
from .inproc import SAMPLES

LABELS = [f"a photo of a {w}" for w in ("dog", "cat", "car", "tree", "house", "bird", "boat", "plane", "cup", "chair")]
PHRASE = "a photo of an astronaut"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="open_clip:ViT-B-32")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    torch.set_num_threads(torch.get_num_threads())
    lm = build(ModelSpec.parse(a.model), Path("models"))
    from headscope.config import Settings
    from headscope.serving.pictures import Pictures

    x = Pictures.for_model(lm, Settings()).prepare((SAMPLES / "astronaut.png").read_bytes()).pixels[None]
    tower = lm.text
    m = lm.model
    ids1 = tower.tokenize([PHRASE])
    ids10 = tower.tokenize(LABELS)

    def both(_):
        with torch.inference_mode():
            m.forward_head(m.forward_features(x))  # type: ignore[operator]
            tower.forward(ids1)

    def image_and_texts(_):
        with torch.inference_mode():
            m.forward_head(m.forward_features(x))  # type: ignore[operator]
            tower.forward(ids10)

    variants = [
        Variant("phrase", "phrase relevance (every method, tokens)", lambda _: text_relevance(lm, x, f"text:{PHRASE}")),
        Variant("both", "both towers, one forward each", both),
        Variant("zero_shot", "zero-shot, 10 labels (cached texts)", lambda _: zero_shot(lm, x, LABELS)),
        Variant("image_texts", "image + 10 text forwards", image_and_texts),
    ]
    zero_shot(lm, x, LABELS)  # the cache, as after a server's first ask
    load_before = os.getloadavg()  # the machine may be shared: the load goes beside the ratios
    run_interleaved(variants, lambda: None, 1, a.iters, a.warmup)
    load_after = os.getloadavg()
    t = {v.key: v.times for v in variants}
    phrase_ratio = statistics.median(p / b for p, b in zip(t["phrase"], t["both"]))
    zs_ratio = statistics.median(z / b for z, b in zip(t["zero_shot"], t["image_texts"]))
    res = {
        "model": a.model,
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "threads": torch.get_num_threads(),
            "load_average_1_5_15_before": [round(v, 2) for v in load_before],
            "load_average_1_5_15_after": [round(v, 2) for v in load_after],
        },
        "seconds": {v.key: summary(v.times) for v in variants},
        "ratios": {
            "phrase_relevance_over_both_towers": {"median": phrase_ratio, "target": 3.0, "ok": phrase_ratio <= 3.0},
            "zero_shot_10_over_image_plus_texts": {"median": zs_ratio, "target": 1.5, "ok": zs_ratio <= 1.5},
        },
    }
    print(json.dumps(res["ratios"], indent=1))
    print(f"load average before {load_before}, after {load_after}")
    for v in variants:
        print(f"{v.label:45s} median {statistics.median(v.times) * 1000:8.1f} ms")
    if a.out:
        a.out.write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
