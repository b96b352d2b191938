"""The calculations the page repeats in JavaScript agree with their Python twins.

tests/fixtures/parity.json (scripts/make_parity_fixtures.py) holds inputs and the Python
answers; this file checks the Python side against it, tests/js/parity.test.mjs the JavaScript
side (run here through ``node --test``, so ``pytest`` covers both).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from app.engine import analysis, stats
from app.serving.encoders import download_stem

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


def test_javascript_tests_pass():
    """`node --test tests/js/*.test.mjs`: the page's modules (parity, queries, names) in Node."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed (Debian: apt install nodejs); the JavaScript tests did not run")
    files = sorted(str(p) for p in JS_TESTS.glob("*.test.mjs"))
    assert files, "no JavaScript tests found"
    proc = subprocess.run([node, "--test", *files], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
