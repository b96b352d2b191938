"""What a Swin capture keeps per image, against dense stage maps; and its time against the bare forward.

Usage: python scripts/swin_capture.py  (random weights; sizes of timm's Swin-T and Swin v2-T)
"""

from __future__ import annotations

import statistics
import time

import torch

from headscope.engine.forward import forward_capture
from headscope.zoo.ids import ModelSpec
from headscope.zoo.loaders import load_random

CASES = [
    ("swin_tiny_patch4_window7_224", (224, 224)),
    ("swin_tiny_patch4_window7_224", (224, 336)),  # the 451 x 300 cat
    ("swinv2_tiny_window8_256", (256, 256)),
]


def main(rounds: int = 12) -> None:
    for arch, hw in CASES:
        lm = load_random(ModelSpec.parse("random:" + arch))
        x = torch.randn(1, 3, *hw)
        (att,) = forward_capture(lm, x)
        kept = att.nbytes() / 2**20
        probs = sum(p.numel() * p.element_size() for p in att.probs) / 2**20
        tokens = sum(x.numel() * x.element_size() for x in att.inputs) / 2**20
        masks = sum(m.untyped_storage().nbytes() for m in {id(m): m for m in att.masks if m is not None}.values())
        dense = sum(att.heads_at(i) * att.tokens_at(i) ** 2 * 4 for i in range(att.num_layers)) / 2**20
        times: dict[str, list[float]] = {"bare": [], "capture": []}
        with torch.inference_mode():
            for i in range(rounds):  # interleaved, alternating order
                for kind in ("bare", "capture") if i % 2 else ("capture", "bare"):
                    t = time.perf_counter()
                    lm.model.forward_features(x) if kind == "bare" else forward_capture(lm, x)
                    times[kind].append(time.perf_counter() - t)
        bare, cap = (statistics.median(times[k][2:]) for k in ("bare", "capture"))
        print(
            f"{arch} {hw[0]}x{hw[1]}: capture keeps {kept:.1f} MiB per image (window softmax {probs:.1f} MiB, "
            f"windows' tokens for temperature and explain {tokens:.1f} MiB, shift masks {masks / 2**20:.1f} MiB; "
            f"dense stage maps would be {dense:.0f} MiB); forward {bare * 1e3:.0f} ms bare, "
            f"{cap * 1e3:.0f} ms with the capture ({cap / bare:.2f}x)"
        )


if __name__ == "__main__":
    main()
