"""Write tests/fixtures/parity.json: the calculations the page does in JavaScript, answered by
their Python twins on the same inputs.

    python scripts/make_parity_fixtures.py          # rewrite the fixture
    python scripts/make_parity_fixtures.py --check  # exit 1 if the fixture is not what it writes

The page repeats five server calculations in the browser (static/js): dropping key tokens
(sinks.js dropColumns vs analysis.drop_and_renormalise), the DINO mass mask (mask.js massMask vs
stats.mass_threshold_count / mass_threshold_mask), mean and max over heads (data.js fuseHeads vs
analysis.fuse_heads), the normalised entropy (data.js normEntropy vs stats.normalized_entropy),
and the download name of a binary answer (api.js downloadName vs encoders.download_stem).
tests/unit/test_parity.py checks the Python side against this file, tests/js/parity.test.mjs
the JavaScript side; a change to one side that the other does not follow fails one of them.
Inputs are float32 values (what the page holds in Float32Arrays); answers are computed in
float64 and compared with a float32 tolerance.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.engine import analysis, stats  # noqa: E402
from app.serving.encoders import download_stem  # noqa: E402

FIXTURE = ROOT / "tests" / "fixtures" / "parity.json"
SEED = 18
FRACTIONS = [0.1, 0.3, 0.6, 0.9, 1.0]
MARGIN = 1e-5  # no running share of a mass case lies this close to a threshold


def softmax_rows(g: torch.Generator, n_rows: int, n: int, scale: float = 3.0) -> torch.Tensor:
    rows = torch.softmax(torch.randn(n_rows, n, generator=g, dtype=torch.float64) * scale, -1)
    return rows.to(torch.float32).to(torch.float64)  # the values a Float32Array holds


def drop_cases(g: torch.Generator) -> list[dict]:
    rows = softmax_rows(g, 4, 13)
    token_sets = [[], [0], [0, 3, 7], list(range(12)), [5, 5, 12]]
    cases = []
    for i, tokens in enumerate(token_sets):
        row = rows[i % len(rows)]
        cases.append(
            {
                "row": row.tolist(),
                "tokens": tokens,
                "expected": analysis.drop_and_renormalise(row, sorted(set(tokens))).tolist(),
            }
        )
    return cases


def safe_for_mass(values: torch.Tensor) -> bool:
    """Whether every running share of ``values`` stays clear of every threshold tested."""
    s, _ = values.sort(descending=True)
    total = float(s.sum())
    if total <= 0:
        return True
    shares = (s.cumsum(0) / total).tolist()[:-1]  # the last share is 1: above every threshold
    return all(abs(share - (f - 1e-7)) > MARGIN for share in shares for f in FRACTIONS)


def mass_cases(g: torch.Generator) -> list[dict]:
    inputs: list[torch.Tensor] = []
    while len(inputs) < 4:
        v = softmax_rows(g, 1, 24, scale=2.0)[0]
        if safe_for_mass(v):
            inputs.append(v)
    inputs.append(torch.tensor([0.25, 0.125, 0.25, 0.125, 0.25], dtype=torch.float64))  # ties
    inputs.append(torch.zeros(6, dtype=torch.float64))  # no mass at all (a rollout before its start)
    cases = []
    for v in inputs:
        for f in FRACTIONS:
            count = int(stats.mass_threshold_count(v, f))
            mask = stats.mass_threshold_mask(v, f).to(torch.int64).tolist()
            cases.append({"values": v.tolist(), "fraction": f, "count": count, "mask": mask})
    return cases


def fuse_cases(g: torch.Generator) -> list[dict]:
    cases = []
    for L, H, N in [(2, 3, 7), (3, 6, 11)]:
        rows = softmax_rows(g, L * H, N).reshape(L, H, N)
        for how in ("mean", "max"):
            fused = torch.stack([analysis.fuse_heads(rows[layer], how) for layer in range(L)])  # L, N
            case = {"L": L, "H": H, "N": N, "how": how}
            cases.append({**case, "all": rows.flatten().tolist(), "expected": fused.flatten().tolist()})
    return cases


def entropy_cases(g: torch.Generator) -> list[dict]:
    rows = [*softmax_rows(g, 3, 17), torch.full((9,), 1 / 9, dtype=torch.float64)]
    one_hot = torch.zeros(8, dtype=torch.float64)
    one_hot[3] = 1
    with_zeros = torch.tensor([0.5, 0.0, 0.25, 0.0, 0.25], dtype=torch.float64)
    rows += [one_hot, with_zeros]
    return [{"row": r.tolist(), "expected": float(stats.normalized_entropy(r))} for r in rows]


def name_cases() -> list[dict]:
    image_id = "3f2c9a0b1d4e5f60718293a4b5c6d7e8f9012345"
    params = [
        {"query": "cls"},
        {"query": "all"},
        {"query": "patch:3,5"},
        {"query": "0,17,200", "layers": "2-5", "heads": "0,1"},
        {"query": "cls", "aggregate": "rollout", "layers": "4-11", "dtype": "float16"},
        {"query": "cls", "drop": "prefix,artifacts", "format": "npy"},
        {"query": "patch:2,3", "temperature": 0.316},
        {"query": "cls", "layers": "0-1", "temperature": 2.5},
        {"query": "cls", "temperature": 10},
    ]
    defaults = {
        "layers": "all",
        "heads": "all",
        "aggregate": "none",
        "drop": "none",
        "dtype": "float32",
        "temperature": 1.0,
    }
    cases = []
    for model in ("dinov2-s14-focus", "timm:vit_base_patch16_224.augreg_in21k"):
        for p in params:
            full = {**defaults, **p}
            ext = "npy" if full.get("format") == "npy" else "safetensors"
            stem = download_stem(image_id, model, SimpleNamespace(**full))
            cases.append({"image_id": image_id, "model": model, "params": p, "expected": f"{stem}.{ext}"})
    return cases


def build() -> dict:
    g = torch.Generator().manual_seed(SEED)
    return {
        "about": "Inputs and the Python answers of the calculations the page repeats in JavaScript; written by "
        "scripts/make_parity_fixtures.py, checked by tests/unit/test_parity.py and tests/js/parity.test.mjs.",
        "drop": drop_cases(g),
        "mass": mass_cases(g),
        "fuse": fuse_cases(g),
        "entropy": entropy_cases(g),
        "download_name": name_cases(),
    }


def render(data: dict) -> str:
    return json.dumps(data, indent=1) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="compare with the fixture instead of writing it")
    args = ap.parse_args()
    text = render(build())
    if args.check:
        same = FIXTURE.is_file() and FIXTURE.read_text() == text
        print("parity fixture is up to date" if same else f"{FIXTURE} differs from what this script writes")
        return 0 if same else 1
    FIXTURE.parent.mkdir(parents=True, exist_ok=True)
    FIXTURE.write_text(text)
    print(f"wrote {FIXTURE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
