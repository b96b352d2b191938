"""``headscope survey --target text:PHRASE`` on a random-weight open_clip model: the faithfulness
table for a phrase (its case and spaces kept, LeGrad among the methods) holds the engine's test
on the same prepared pixels."""

from __future__ import annotations

import shutil

import pytest

pytest.importorskip("open_clip")

from headscope.survey.output import read_faithfulness  # noqa: E402
from helpers.cli import CLI_TIMEOUT_S, run_cli  # noqa: E402
from helpers.clip_models import MODEL_ID, shared_model  # noqa: E402

pytestmark = pytest.mark.timeout(4 * CLI_TIMEOUT_S)
PHRASE = "text:a Cat on a sofa"


@pytest.mark.surveys  # a whole survey or extract run (a model load, every picture): make test-long
def test_survey_for_a_phrase(tmp_path, samples):
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(samples["cat"], src / "cat.png")
    out = tmp_path / "out.parquet"
    opts = ("--faithfulness", "chefer,legrad", "--target", PHRASE, "--fractions", "0,0.5")
    r = run_cli("survey", str(src), "--out", str(out), "--model", MODEL_ID, "--quiet", *opts)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = read_faithfulness(out).to_pylist()
    assert {(x["method"], x["target"]) for x in rows} == {("chefer", PHRASE), ("legrad", PHRASE)}

    from headscope.config import Settings
    from headscope.engine.relevance import relevance
    from headscope.serving.pictures import Pictures

    lm = shared_model()
    px = Pictures.for_model(lm, Settings()).prepare((src / "cat.png").read_bytes()).pixels[None]
    y = relevance(lm, px, PHRASE, "chefer")[0].y
    assert all(x["y"] == pytest.approx(y, rel=1e-4, abs=1e-4) for x in rows)
    bad = run_cli(
        "survey",
        str(src),
        "--out",
        str(tmp_path / "b.parquet"),
        "--quiet",
        "--faithfulness",
        "chefer",
        "--target",
        "text:",
    )
    assert bad.returncode != 0 and "empty" in bad.stderr and "Traceback" not in bad.stderr
