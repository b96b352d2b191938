"""``python -m bench.model_load``: both constructions timed, in paired rounds."""

from __future__ import annotations

import json


def test_the_model_load_bench_runs_tiny(tmp_path):
    from bench import model_load

    out = tmp_path / "load.json"
    assert model_load.main(["--rounds", "2", "--archs", "test_vit", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    for key in ("embedded", "local:test_vit"):
        row = res[key]
        assert len(row["meta_s"]) == len(row["usual_s"]) == 2
        assert row["meta_s_p50"] > 0 and row["usual_s_p50"] > 0 and row["speedup_min"] > 0
    assert res["local:test_vit"]["params_m"] > 0
