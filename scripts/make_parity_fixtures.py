"""Write tests/fixtures/parity.json: the calculations the page does in JavaScript, answered by
their Python twins on the same inputs.

    python scripts/make_parity_fixtures.py          # rewrite the fixture
    python scripts/make_parity_fixtures.py --check  # exit 1 if the fixture is not what it writes (floats to 1e-12)

The page repeats eight server calculations in the browser (static/js): dropping key tokens
(sinks.js dropColumns vs analysis.drop_and_renormalise), the DINO mass mask (mask.js massMask vs
stats.mass_threshold_count / mass_threshold_mask), mean and max over heads (data.js fuseHeads vs
analysis.fuse_heads), the normalised entropy (data.js normEntropy vs stats.normalized_entropy),
the download name of a binary answer (api.js downloadName vs encoders.download_stem), the
softmax at a temperature (learn-math.js temperedSoftmax vs capture.temper_ + torch.softmax), the
cells of a Swin query's window (windows.js windowPieces vs windows.WindowIndex) and the query
grammar (state.js queryRows vs selection.parse_query).
tests/unit/test_parity.py checks the Python side against this file, tests/js/parity.test.mjs
the JavaScript side; a change to one side that the other does not follow fails one of them.
Inputs are float32 values (what the page holds in Float32Arrays); answers are computed in
float64 and compared with a float32 tolerance.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from headscope.engine import analysis, stats  # noqa: E402
from headscope.engine.block_capture import temper_  # noqa: E402
from headscope.engine.layout import TokenLayout  # noqa: E402
from headscope.engine.selection import SelectionError, parse_query  # noqa: E402
from headscope.engine.windows import WindowIndex  # noqa: E402
from headscope.serving.encoders import download_stem  # noqa: E402

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
        {"query": "cls", "ablate": "5:2,11:0", "drop": "prefix"},
        # Over 150 characters: every part kept, the longest shortened, the whole name's hash added.
        {"query": "patch:" + ";".join(f"{r},{c}" for r in range(8) for c in range(0, 16, 3)), "format": "npy"},
        {"query": "patch:" + ";".join(f"{r},{c}" for r in range(8) for c in range(0, 16, 3)), "layers": "-1"},
        {
            "query": "cls",
            "layers": ",".join(map(str, range(0, 12, 2))),
            "ablate": ",".join(f"{i}:{i % 6}" for i in range(40)),
        },
    ]
    defaults = {
        "layers": "all",
        "heads": "all",
        "aggregate": "none",
        "drop": "none",
        "dtype": "float32",
        "temperature": 1.0,
        "ablate": "",
    }
    cases = []
    for model in ("dinov2-s14-focus", "timm:vit_base_patch16_224.augreg_in21k"):
        for p in params:
            full = {**defaults, **p}
            ext = "npy" if full.get("format") == "npy" else "safetensors"
            stem = download_stem(image_id, model, SimpleNamespace(**full))
            cases.append({"image_id": image_id, "model": model, "params": p, "expected": f"{stem}.{ext}"})
    return cases


def temperature_cases(g: torch.Generator) -> list[dict]:
    """softmax(scores / T) as the API computes it (capture.temper_, then torch.softmax), float64."""
    rows = [
        (torch.randn(13, generator=g, dtype=torch.float64) * 4).tolist(),
        [2.0, 2.0, -1.0, 0.5, 2.0],  # ties at the top
        [1500.0, -300.0, 1499.0, 0.0],  # large scores: exp would overflow without the max
        [0.3, -100.0, 0.1, -100.0, 0.2, 0.25],  # a Swin shift mask's -100
    ]
    cases = []
    for scores in rows:
        for T in (0.001, 0.1, 0.316, 1.0, 2.5, 10.0, 1000.0):
            logits = torch.tensor(scores, dtype=torch.float64)
            expected = torch.softmax(temper_(logits, T), dim=-1)
            cases.append({"scores": scores, "T": T, "expected": expected.tolist()})
    return cases


def window_cases() -> list[dict]:
    """The cells of a query cell's window (the image's own grid, padding left out), for the cells
    at the corners, the middle and next to each window border of the rolled grid."""
    cases = []
    for grid, window, shift in [
        ((7, 7), (7, 7), (0, 0)),
        ((8, 8), (4, 4), (0, 0)),
        ((8, 8), (4, 4), (2, 2)),
        ((8, 12), (4, 4), (2, 2)),
        ((5, 9), (3, 4), (1, 2)),
        ((3, 5), (7, 7), (0, 0)),  # a window larger than the grid: one window, mostly padding
        ((14, 14), (7, 7), (3, 3)),
    ]:
        idx = WindowIndex.build(grid, window, shift, torch.device("cpu"))
        gh, gw = grid
        along = [
            sorted({0, n - 1, n // 2, *(((k * w + s) % n) for k in range(-(-n // w)) for s in (shift_, shift_ - 1))})
            for n, w, shift_ in ((gh, window[0], shift[0]), (gw, window[1], shift[1]))
        ]
        queries = []
        for r in along[0]:
            for c in along[1]:
                members = idx.cells[idx.window[r % gh * gw + c % gw]]
                queries.append({"cell": [r % gh, c % gw], "cells": sorted(int(t) for t in members if t >= 0)})
        cases.append({"grid": list(grid), "window": list(window), "shift": list(shift), "queries": queries})
    return cases


def query_cases() -> dict:
    """parse_query's rows for query specs on three layouts; null: every row; "error": a 422."""
    layouts = {
        "cls+16x24": TokenLayout(["cls"], (16, 24), (14, 14)),
        "cls+4reg+16x16": TokenLayout(["cls", "reg", "reg", "reg", "reg"], (16, 16), (14, 14)),
        "siglip 14x14": TokenLayout([], (14, 14), (16, 16)),
    }
    specs = [
        "cls",
        " CLS ",
        "",
        "all",
        "0",
        "3",
        "-1",
        "17",
        "2,2",
        "2,3",
        "0, 5 ,5",
        "384",
        "385",
        "-385",
        "-386",
        "patch:0,0",
        "patch:5,7",
        "patch:-1,-1",
        "patch:15,23",
        "patch:16,0",
        "patch:0,24",
        "patch: 3 , 4",
        "patch:1,2;1,2",
        "patch:1,2;3,4",
        "patch:1",
        "patch:a,b",
        "tok:2",
        "nonsense",
        "1.5",
        "+3",
        "0x1f",
        "9999999",
        "12345678",
    ]
    cases = []
    for name, layout in layouts.items():
        for spec in specs:
            try:
                rows: list[int] | str | None = parse_query(spec, layout)
            except SelectionError:
                rows = "error"
            cases.append({"layout": name, "spec": spec, "rows": rows})
    return {"layouts": {name: layout.as_dict() for name, layout in layouts.items()}, "cases": cases}


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
        "temperature": temperature_cases(g),
        "windows": window_cases(),
        "query": query_cases(),
    }


def _dump(o, depth: int = 0) -> str:
    """JSON with one item per line, except a list of plain values: on one line (a row, a mask)."""
    pad = " " * (depth + 1)
    if isinstance(o, dict) and o:
        items = ",\n".join(f"{pad}{json.dumps(k)}: {_dump(v, depth + 1)}" for k, v in o.items())
        return "{\n" + items + "\n" + " " * depth + "}"
    if isinstance(o, list) and any(isinstance(v, (dict, list)) for v in o):
        return "[\n" + ",\n".join(pad + _dump(v, depth + 1) for v in o) + "\n" + " " * depth + "]"
    return json.dumps(o)


def _same(a: object, b: object) -> bool:
    """The fixture's values equal, the floats to 1e-12 relative: torch's float64 exp takes other
    vector paths on other CPUs (AVX2, AVX-512), which differ in the last bit or two."""
    if isinstance(a, float) or isinstance(b, float):
        return (
            isinstance(a, (int, float))
            and isinstance(b, (int, float))
            and math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-300)
        )
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def render(data: dict) -> str:
    return _dump(data) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="compare with the fixture instead of writing it")
    args = ap.parse_args()
    text = render(build())
    if args.check:
        same = FIXTURE.is_file() and _same(json.loads(FIXTURE.read_text()), json.loads(text))
        print("parity fixture is up to date" if same else f"{FIXTURE} differs from what this script writes")
        return 0 if same else 1
    FIXTURE.parent.mkdir(parents=True, exist_ok=True)
    FIXTURE.write_text(text)
    print(f"wrote {FIXTURE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
