"""``python -m bench.large_input`` runs, tiny: its rows give the same CLS rows and its JSON says
the ratios and the target (the timing itself is the benchmark's, not a test's)."""

from __future__ import annotations

import json

from bench.large_input import main
from helpers.server import ROOT


def test_the_large_input_bench_runs_tiny(tmp_path, capsys):
    out = tmp_path / "large.json"
    assert main(["--size", "56", "--rounds", "1", "--models-dir", str(ROOT / "models"), "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["input"] == "56x56, batch 1, 17 tokens"
    assert res["max_abs_diff"] <= 1e-5 and res["target"] == 1.5
    for key in ("headscope_speed_vs_bare", "timm_speed_vs_bare", "headscope_over_timm"):
        assert res[key]["n"] == 1 and res[key]["median"] > 0
    assert json.loads(capsys.readouterr().out) == res
