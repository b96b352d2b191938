"""``python -m bench.graph_probe`` (CUDA graphs of the relevance passes, measured on the next GPU
lease) runs its eager rows on the CPU: one row per call, the ratios to the forward, no capture."""

from __future__ import annotations

import json

from bench.graph_probe import main


def test_the_graph_probe_runs_its_eager_rows_on_the_cpu(tmp_path):
    out = tmp_path / "probe.json"
    assert (
        main(["--device", "cpu", "--batch", "1", "--rounds", "1", "--methods", "chefer,attnlrp", "--out", str(out)])
        == 0
    )
    res = json.loads(out.read_text())
    assert res["device"] == "cpu" and res["batch"] == 1
    rows = res["rows"]
    assert set(rows) == {"forward", "chefer", "attnlrp"}
    assert rows["forward"]["eager_x"] == 1.0
    for row in rows.values():
        assert row["eager_ms"] > 0 and row["captured"] is None and "replay_ms" not in row
