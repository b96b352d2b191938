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
                             removed=[0], num_patches=4, seed=None, box=None).items():  # fmt: skip
                out[k].append(v)
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
