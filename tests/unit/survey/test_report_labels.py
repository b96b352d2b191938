"""Which heads the report's "heads at a glance" scatter names: those that stand apart, never one
name on another (app/survey/report.py ``_outlier_labels``)."""

from __future__ import annotations

import numpy as np

from headscope.survey.report import _outlier_labels


def names(n: int) -> list[str]:
    return [f"p{i}" for i in range(n)]


def test_a_crowd_gets_no_names_and_a_lone_point_gets_its_own():
    rng = np.random.default_rng(0)
    x = np.concatenate([0.8 + 0.01 * rng.standard_normal(40), [0.1]])
    y = np.concatenate([100 + 1.0 * rng.standard_normal(40), [20.0]])
    # The ranges are set by the lone point: the crowd is a dense blob at one end.
    text = _outlier_labels(x, y, names(41))
    assert text[40] == "p40"
    assert all(t == "" for t in text[:40])


def test_a_small_tight_group_is_named_once_by_all_its_members():
    x = np.array([0.10, 0.105, 0.11, 0.9, 0.5, 0.91, 0.89])
    y = np.array([20.0, 20.5, 19.8, 140.0, 80.0, 139.0, 141.0])
    text = _outlier_labels(x, y, names(7))
    group = [t for t in text[:3] if t]
    assert len(group) == 1 and set(group[0].split(", ")) == {"p0", "p1", "p2"}
    assert text[4] == "p4"  # alone in the middle
    top = [t for t in (text[3], text[5], text[6]) if t]
    assert len(top) == 1 and set(top[0].split(", ")) == {"p3", "p5", "p6"}


def test_at_most_so_many_names_and_none_for_missing_values():
    x = np.linspace(0, 1, 30)
    y = np.linspace(0, 1, 30) ** 2
    x[3] = np.nan
    text = _outlier_labels(x, y, names(30), most=5)
    assert sum(bool(t) for t in text) <= 5
    assert text[3] == ""
    assert _outlier_labels(np.array([0.5]), np.array([1.0]), ["only"]) == [""]


def test_the_page_says_which_sections_the_survey_did_not_measure(tmp_path):
    """A survey without --ranks, --similarity and --faithfulness: the page names the flags, where
    the charts were left out without a word (and a model without CLS rows had no similar heads)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from test_survey_output import rows

    from headscope.survey.report import build_report

    def page(table: pa.Table) -> str:
        folder = tmp_path / f"s{len(list(tmp_path.iterdir()))}"
        folder.mkdir()
        pq.write_table(table, folder / "part-00000.parquet")
        return build_report(folder)

    plain = rows(["a.png", "b.png"], L=2, H=3)
    html = page(plain)
    said = html[html.index("<h2>Not in this survey</h2>") :]
    assert "<code>--ranks</code>" in said and "<code>--faithfulness</code>" in said
    assert "--similarity" not in said  # the CLS rows' cosine stands in: the section is drawn
    no_cls = plain.set_column(
        plain.schema.get_field_index("cls_cosine"), "cls_cosine", pa.nulls(plain.num_rows, pa.list_(pa.float32()))
    )
    said = page(no_cls)
    assert "the most similar head pairs: survey with <code>--similarity</code>" in said
