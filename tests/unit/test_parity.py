"""The calculations the page repeats in JavaScript agree with their Python twins.

tests/fixtures/parity.json (scripts/make_parity_fixtures.py) holds inputs and the Python
answers; this file checks the Python side against it, tests/js/parity.test.mjs the JavaScript
side (run here through ``node --test``, so ``pytest`` covers both).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from headscope.engine import analysis, stats
from headscope.engine.block_capture import temper_
from headscope.engine.layout import TokenLayout
from headscope.engine.selection import SelectionError, parse_query
from headscope.engine.windows import WindowIndex
from headscope.serving.encoders import download_stem

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "parity.json"
JS_TESTS = ROOT / "tests" / "js"
NAME_DEFAULTS = {
    "layers": "all",
    "heads": "all",
    "aggregate": "none",
    "drop": "none",
    "dtype": "float32",
    "temperature": 1.0,
    "ablate": "",
}


@pytest.fixture(scope="module")
def fixture() -> dict:
    return json.loads(FIXTURE.read_text())


def t64(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def test_drop_and_renormalise_gives_the_fixture_answers(fixture):
    for case in fixture["drop"]:
        got = analysis.drop_and_renormalise(t64(case["row"]), sorted(set(case["tokens"])))
        torch.testing.assert_close(got, t64(case["expected"]), rtol=1e-12, atol=1e-15)
        if case["tokens"]:
            assert float(got[case["tokens"]].abs().sum()) == 0.0
        assert abs(float(got.sum()) - 1) < 1e-12


def test_mass_threshold_gives_the_fixture_answers(fixture):
    for case in fixture["mass"]:
        v = t64(case["values"])
        assert int(stats.mass_threshold_count(v, case["fraction"])) == case["count"], case
        assert stats.mass_threshold_mask(v, case["fraction"]).to(torch.int64).tolist() == case["mask"], case


def test_fuse_heads_gives_the_fixture_answers(fixture):
    for case in fixture["fuse"]:
        L, H, N = case["L"], case["H"], case["N"]
        rows = t64(case["all"]).reshape(L, H, N)
        got = torch.stack([analysis.fuse_heads(rows[layer], case["how"]) for layer in range(L)])
        torch.testing.assert_close(got.flatten(), t64(case["expected"]), rtol=1e-12, atol=1e-15)


def test_normalized_entropy_gives_the_fixture_answers(fixture):
    for case in fixture["entropy"]:
        got = float(stats.normalized_entropy(t64(case["row"])))
        assert got == pytest.approx(case["expected"], rel=1e-12, abs=1e-15)


def test_download_stem_gives_the_fixture_names(fixture):
    for case in fixture["download_name"]:
        p = {**NAME_DEFAULTS, **case["params"]}
        ext = "npy" if p.get("format") == "npy" else "safetensors"
        assert f"{download_stem(case['image_id'], case['model'], SimpleNamespace(**p))}.{ext}" == case["expected"]


def test_tempered_softmax_gives_the_fixture_answers(fixture):
    for case in fixture["temperature"]:
        got = torch.softmax(temper_(t64(case["scores"]), case["T"]), dim=-1)
        torch.testing.assert_close(got, t64(case["expected"]), rtol=1e-12, atol=1e-300)
        # an independent spelling: softmax of scores / T, in float64 with exact rationals where T is huge
        ref = torch.softmax(t64(case["scores"]) / case["T"], dim=-1)
        torch.testing.assert_close(got, ref, rtol=1e-9, atol=1e-12)


def test_window_index_gives_the_fixture_cells(fixture):
    for case in fixture["windows"]:
        grid, window, shift = (tuple(case[k]) for k in ("grid", "window", "shift"))
        idx = WindowIndex.build(grid, window, shift, torch.device("cpu"))
        gh, gw = grid
        for q in case["queries"]:
            r, c = q["cell"]
            members = idx.cells[idx.window[r * gw + c]]
            assert sorted(int(t) for t in members if t >= 0) == q["cells"], (case["grid"], q["cell"])
            # independently: the cells whose rolled position falls in the same window as the query's
            rolled = lambda i, n, s, w: ((i - s) % n) // w  # noqa: E731
            same = [
                rr * gw + cc
                for rr in range(gh)
                for cc in range(gw)
                if rolled(rr, gh, shift[0], window[0]) == rolled(r, gh, shift[0], window[0])
                and rolled(cc, gw, shift[1], window[1]) == rolled(c, gw, shift[1], window[1])
            ]
            assert same == q["cells"]


def test_parse_query_gives_the_fixture_rows(fixture):
    layouts = {
        name: TokenLayout([p["kind"] for p in t["prefix"]], tuple(t["grid"]), tuple(t["patch_size"]))
        for name, t in fixture["query"]["layouts"].items()
    }
    for case in fixture["query"]["cases"]:
        layout = layouts[case["layout"]]
        if case["rows"] == "error":
            with pytest.raises(SelectionError):
                parse_query(case["spec"], layout)
        else:
            assert parse_query(case["spec"], layout) == case["rows"], case


def test_the_fixture_is_what_the_script_writes():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "make_parity_fixtures.py"), "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_javascript_tests_pass():
    """`node --test tests/js/*.test.mjs`: the page's modules (parity, queries, names) in Node."""
    node = shutil.which("node")
    if node is None:
        why = (
            "node is not installed (Debian: apt install nodejs; `make test` installs it); "
            "the JavaScript tests did not run"
        )
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(why)  # CI runs `make test`, which installs node: a missing one is a broken setup
        pytest.skip(why)
    files = sorted(str(p) for p in JS_TESTS.glob("*.test.mjs"))
    assert files, "no JavaScript tests found"
    proc = subprocess.run([node, "--test", *files], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
