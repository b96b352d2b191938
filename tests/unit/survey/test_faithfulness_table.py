"""The report's faithfulness table: means, t-based 95 % intervals, paired differences to random."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest

from headscope.survey import schema
from headscope.survey.faithfulness_table import Interval, markdown, summarise, t975


def test_t_quantiles_match_the_tables():
    # Student's t, 0.975 quantile (any statistics table): the tabulated range and the expansion beyond it
    for df, t in [(1, 12.7062), (2, 4.3027), (4, 2.7764), (10, 2.2281), (30, 2.0423), (40, 2.0211), (60, 2.0003),
                  (120, 1.9799), (1000, 1.9623)]:  # fmt: skip
        assert t975(df) == pytest.approx(t, abs=2e-4), df
    with pytest.raises(ValueError):
        t975(0)


def test_an_interval_is_the_mean_plus_minus_t_times_the_standard_error():
    v = np.array([0.2, 0.5, 0.3, 0.6, float("nan")])  # NaN (a target of 0) is left out
    iv = Interval.of(v)
    x = v[:4]
    half = 3.1824 * x.std(ddof=1) / 2
    assert iv.n == 4 and iv.mean == pytest.approx(x.mean())
    assert (iv.lo, iv.hi) == (pytest.approx(x.mean() - half, abs=1e-4), pytest.approx(x.mean() + half, abs=1e-4))
    one = Interval.of(np.array([0.4]))
    assert one.n == 1 and math.isnan(one.lo) and one.text() == "0.400"
    assert Interval.of(np.array([])).text() == "–"


def rows(aucs: dict[str, list[tuple[float | None, float | None]]]) -> pa.Table:
    out: dict[str, list] = {f.name: [] for f in schema.FAITHFULNESS}
    for method, values in aucs.items():
        for i, (pos, neg) in enumerate(values):
            for k, v in dict(image=f"p{i}.png", method=method, target="output", class_index=None, y=1.0,
                             auc_positive=pos, auc_negative=neg, fractions=[0.0], positive=[1.0], negative=[1.0],
                             removed=[0], num_patches=4, seed=None, box=None, protocol=None,
                             score0=1.0).items():  # fmt: skip
                out[k].append(v)
    n = max(len(v) for v in out.values())
    for v in out.values():  # columns this helper does not set (added to the schema later): null
        if not v:
            v.extend([None] * n)
    return pa.table(out, schema=schema.FAITHFULNESS)


def test_methods_are_compared_with_random_picture_by_picture():
    t = rows(
        {
            "chefer": [(0.3, 0.8), (0.5, 0.7), (None, None)],  # the third picture had y = 0
            "random": [(0.6, 0.6), (0.4, 0.65), (0.5, 0.6)],
        }
    )
    chefer, random = summarise(t)
    assert (chefer.method, chefer.images, random.method) == ("chefer", 3, "random")
    assert chefer.auc_positive.n == 2 and chefer.auc_positive.mean == pytest.approx(0.4)
    assert chefer.vs_random_positive is not None and chefer.vs_random_negative is not None
    assert chefer.vs_random_positive.mean == pytest.approx(((0.3 - 0.6) + (0.5 - 0.4)) / 2)
    assert chefer.vs_random_negative.mean == pytest.approx(((0.8 - 0.6) + (0.7 - 0.65)) / 2)
    assert chefer.beats_random == 1  # the first picture only: the second is worse on the positive curve
    assert random.vs_random_positive is None and random.beats_random is None
    text = markdown([chefer, random])
    assert text.splitlines()[0].startswith("| target | method | images | AUC+")
    assert "| output | chefer | 3 | 0.400 [" in text and "1 of 2" in text  # of the pictures with both AUCs


def test_the_papers_protocol_over_pictures_in_the_papers_units_beside_table_1():
    """A survey batch with protocol=paper (a tiny random classifier): each row is the engine's
    paper-protocol test of that picture; the summary is in percent and sits beside Table 1."""
    import torch

    from headscope.engine.faithfulness import faithfulness
    from headscope.engine.relevance import relevance
    from headscope.survey.faithfulness import FaithfulnessPlan
    from headscope.survey.faithfulness_table import PAPER_TABLE1, paper_markdown, paper_rows
    from headscope.survey.report import faithfulness_section
    from helpers.relevance_reference import load_vit

    lm, hw = load_vit()
    torch.manual_seed(3)
    x = torch.randn(3, 3, *hw)
    plan = FaithfulnessPlan.parse("rollout,attention,random", "top", None, "paper")
    assert plan.meta()["protocol"] == "paper" and FaithfulnessPlan.from_meta(plan.meta()) == plan
    assert "protocol" not in FaithfulnessPlan.parse("random").meta()  # live surveys' metadata as before
    assert plan.resolve(lm) == "top"
    table, failed = plan.table(lm, ["a", "b", "c"], x)
    assert not failed and set(table.column("protocol").to_pylist()) == {"paper"}
    rels = relevance(lm, x, "top", plan.methods)
    want = [faithfulness(lm, x[i], rels[i].maps, "top", protocol="paper") for i in range(3)]
    got = table.to_pylist()
    for r in got:
        w = want["abc".index(r["image"])]
        assert r["auc_positive"] == pytest.approx(w.methods[r["method"]].auc_positive)
        assert r["positive"] == w.methods[r["method"]].positive and r["score0"] == 1.0
    summaries = summarise(table)
    assert {s.protocol for s in summaries} == {"paper"}
    rollout = next(s for s in summaries if s.method == "rollout")
    mean = np.mean([w.methods["rollout"].auc_positive for w in want])
    assert rollout.auc_positive.mean == pytest.approx(mean) and 0 <= mean <= 90
    rows_ = paper_rows(summaries)
    # Headscope's rollout (every layer) is not the paper's (from layer 1): no figure beside it,
    # the paper's row listed apart under its own name; raw attention is the same rule: beside it
    assert rows_[0][:2] == ["top", "rollout"] and rows_[0][4] == rows_[0][6] == ""
    assert rows_[1][:2] == ["top", "attention"] and rows_[1][4] == "23.99" and rows_[1][6] == "45.55"
    assert ["(Table 1)", "transformer attribution (theirs)", "", "", "17.03", "", "54.16"] in rows_
    assert any(r[0] == "(Table 1)" and r[1].startswith("rollout (from layer 1") and r[4] == "20.05" for r in rows_)
    assert len(rows_) == 3 + len(PAPER_TABLE1) - 1  # attention alone is matched
    assert "Table 1 AUC+" in paper_markdown(summaries) and paper_markdown(summarise(rows({"x": [(0.1, 0.2)]}))) == ""
    assert 'id="faithfulness-paper"' in faithfulness_section(table)


def paper_summaries(target: str, methods: tuple[str, ...]) -> list:
    return summarise(paper_summaries_table(target, methods))


def test_table_1_figures_sit_beside_predicted_class_rows_only():
    """Table 1 reports the predicted class (target top); a class:N row is the paper's target-class
    run, another table: before, it was printed beside Table 1's predicted-class figures."""
    from headscope.survey.faithfulness_table import PAPER_TABLE1, paper_rows

    methods = ("chefer2021", "attention", "rollout", "random")
    top = paper_rows(paper_summaries("top", methods))
    by = {r[1]: r for r in top if r[0] == "top"}
    assert by["chefer2021"][4:] == ["17.03", "55.00 [-8.53, 118.53]", "54.16"]
    assert by["attention"][4] == "23.99" and by["rollout"][4] == "" and by["random"][4] == ""
    assert len(top) == 4 + len(PAPER_TABLE1) - 2  # chefer2021 and attention matched
    target = paper_rows(paper_summaries("class:3", methods))
    mine = [r for r in target if r[0] == "class:3"]
    assert len(mine) == 4 and all(r[4] == "" and r[6] == "" for r in mine)
    # every Table 1 row is still listed for reference, apart, under the paper's names
    assert [r[1] for r in target if r[0] == "(Table 1)"] == [name for name, *_ in PAPER_TABLE1]


def test_the_terminal_report_says_what_the_paper_table_cannot(tmp_path, capsys):
    """``headscope report`` prints the --protocol paper table with the page's caveat: Headscope
    has no labels, so its x = 0 is 1 where the paper's is the model's accuracy."""
    import pyarrow.parquet as pq
    from test_survey_output import rows as survey_rows

    from headscope import cli
    from headscope.survey.faithfulness_table import PAPER_CAVEAT
    from headscope.survey.report import faithfulness_section

    out = tmp_path / "s.parquet"
    out.mkdir()
    pq.write_table(survey_rows(["p0.png", "p1.png"], L=2, H=3), out / "part-00000.parquet")
    tests = paper_summaries_table("top", ("attention", "random"))
    faith = tmp_path / "s.faithfulness.parquet"
    faith.mkdir()
    pq.write_table(tests, faith / "part-00000.parquet")
    assert cli.main(["report", str(out), "--out", str(tmp_path / "r.html")]) == 0
    printed = capsys.readouterr().out
    assert "beside Chefer et al. 2021's Table 1" in printed and PAPER_CAVEAT in printed
    assert "Headscope has no labels: a hit is the model still predicting the target's class (for <code>top</code>" in (
        faithfulness_section(tests)
    )


def paper_summaries_table(target: str, methods: tuple[str, ...]) -> pa.Table:
    t = rows({m: [(20.0, 50.0), (30.0, 60.0)] for m in methods})
    t = t.set_column(t.schema.get_field_index("target"), "target", pa.array([target] * t.num_rows))
    return t.set_column(t.schema.get_field_index("protocol"), "protocol", pa.array(["paper"] * t.num_rows))
