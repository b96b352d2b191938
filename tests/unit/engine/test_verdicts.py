"""Verdicts against the random map (app/engine/verdicts.py): the rule, the margins, the words,
curves above 1, and that a perturbation test's answer carries them for any list of methods."""

from __future__ import annotations

import math

import pytest
import torch

from headscope.engine.faithfulness import faithfulness
from headscope.engine.relevance import relevance
from headscope.engine.verdicts import NARROW, beats, narrow_margin, verdict_of, verdicts
from helpers.relevance_reference import load_vit

RANDOM = {"positive": [1.0, 0.8, 0.5], "negative": [1.0, 0.9, 0.7], "auc_positive": 0.5, "auc_negative": 0.6}


def curves(pos: float, neg: float, positive=(1.0, 0.7, 0.4), negative=(1.0, 0.95, 0.9)) -> dict:
    return {"positive": list(positive), "negative": list(negative), "auc_positive": pos, "auc_negative": neg}


@pytest.mark.parametrize(
    "pos,neg,want,words",
    [
        (0.4, 0.7, "both", "better than random on both curves"),
        (0.4, 0.5, "positive", "better than random on the positive curve only"),
        (0.6, 0.7, "negative", "better than random on the negative curve only"),
        (0.6, 0.5, "neither", "not better than random on either curve"),
        (0.5, 0.6, "neither", "not better"),  # a tie is not better
    ],
)
def test_the_rule_and_its_words(pos, neg, want, words):
    v = verdict_of("chefer", curves(pos, neg), RANDOM)
    assert v.verdict == want and v.text.startswith(words)
    assert v.margin_positive == pytest.approx(0.5 - pos) and v.margin_negative == pytest.approx(neg - 0.6)
    assert beats(pos, neg, 0.5, 0.6) == (want in ("both", "positive"), want in ("both", "negative"))


def test_the_margins_are_said_with_their_sign():
    v = verdict_of("attention", curves(0.55, 0.75), RANDOM)
    assert v.verdict == "negative"
    assert "AUC+ higher by 0.050: 0.550 against 0.500" in v.text
    assert "AUC− higher by 0.150: 0.750 against 0.600" in v.text
    narrow = verdict_of("chefer", curves(0.48, 0.9), RANDOM)
    assert "AUC+ lower by 0.020 (narrowly)" in narrow.text and "AUC− higher by 0.300:" in narrow.text


def test_a_curve_above_one_is_explained_where_it_occurs():
    flat = verdict_of("chefer", curves(0.4, 0.7), RANDOM)
    assert not flat.above_one and "above 1" not in flat.text
    high = verdict_of("chefer", curves(1.2, 0.7, positive=(1.0, 1.35, 1.1)), RANDOM)
    assert high.above_one and high.max_ratio == pytest.approx(1.35)
    assert "Its positive curve rises to 1.35x the unperturbed target" in high.text
    assert "a curve above 1 means the model's output moved elsewhere" in high.text
    assert "negative curve rises" not in high.text
    # a hair above 1 (a target that barely moves) is not worth a sentence
    assert "rises" not in verdict_of("chefer", curves(0.4, 0.7, negative=(1.0, 1.004, 0.9)), RANDOM).text


def test_baseline_untested_and_undefined():
    both = verdicts({"chefer": curves(0.4, 0.7), "random": RANDOM})
    assert list(both) == ["chefer", "random"]
    assert both["random"].verdict == "baseline" and both["random"].margin_positive is None
    alone = verdicts({"chefer": curves(0.4, 0.7)})
    assert alone["chefer"].verdict == "untested" and "random map was not tested" in alone["chefer"].text
    nan = verdicts({"chefer": curves(math.nan, math.nan), "random": curves(math.nan, math.nan)})
    assert nan["chefer"].verdict == "undefined" and nan["chefer"].margin_negative is None
    # any method list, any names: nothing is keyed on the methods Headscope ships
    other = verdicts({"new_method": curves(0.3, 0.8), "random": RANDOM})
    assert other["new_method"].verdict == "both"


def test_a_tests_answer_carries_a_verdict_per_method_from_its_own_aucs():
    lm, hw = load_vit()
    torch.manual_seed(0)
    x = torch.randn(3, *hw)
    rel = relevance(lm, x[None], "top", ["chefer", "attention", "random"])[0]
    res = faithfulness(lm, x, rel.maps, rel.target, [0.0, 0.25, 0.5])
    body = res.as_dict()
    assert list(body["verdicts"]) == ["chefer", "attention", "random"]
    r = res.methods["random"]
    for name in ("chefer", "attention"):
        c, v = res.methods[name], body["verdicts"][name]
        on = (c.auc_positive < r.auc_positive, c.auc_negative > r.auc_negative)
        want = {(True, True): "both", (True, False): "positive", (False, True): "negative"}.get(on, "neither")
        assert v["verdict"] == want
        assert v["margin_positive"] == pytest.approx(r.auc_positive - c.auc_positive)
        assert v["margin_negative"] == pytest.approx(c.auc_negative - r.auc_negative)
        assert v["max_ratio"] == pytest.approx(max(c.positive + c.negative))
    assert body["verdicts"]["random"]["verdict"] == "baseline"


def test_the_narrow_margin_is_in_the_protocols_units():
    """Paper AUCs are percent (trapz x 100 over 0/1 hits): a 3-point margin there is as narrow as
    0.03 is live. Before, the live 0.05 was applied to them, so no paper margin was ever narrow."""
    assert narrow_margin("live") == NARROW == 0.05 and narrow_margin("paper") == pytest.approx(5.0)
    with pytest.raises(ValueError, match="protocol"):
        narrow_margin("ours")
    hits = {"positive": [1.0, 1.0, 0.0], "negative": [1.0, 1.0, 1.0]}
    random = {**hits, "auc_positive": 60.0, "auc_negative": 80.0}
    close = {**hits, "auc_positive": 57.0, "auc_negative": 90.0}  # 3 points lower, 10 higher
    paper = verdicts({"chefer": close, "random": random}, protocol="paper")["chefer"]
    assert paper.verdict == "both" and "AUC+ lower by 3.000 (narrowly)" in paper.text
    assert "AUC− higher by 10.000:" in paper.text and "10.000 (narrowly)" not in paper.text
    live = verdicts({"chefer": close, "random": random})["chefer"]  # the same numbers read as live ones
    assert "(narrowly)" not in live.text
    assert "(narrowly)" in verdict_of("chefer", curves(0.48, 0.9), RANDOM, protocol="live").text


def test_a_paper_protocol_answer_judges_its_margins_in_percent():
    from headscope.engine.faithfulness import Curves, Faithfulness

    def result(protocol: str) -> Faithfulness:
        c = Curves([1.0, 0.0], [1.0, 1.0], auc_positive=47.0, auc_negative=90.0, removed=[0, 1])
        r = Curves([1.0, 0.0], [1.0, 1.0], auc_positive=50.0, auc_negative=88.0, removed=[0, 1])
        return Faithfulness([0.0, 0.9], "top", 1.0, {"chefer": c, "random": r}, 4, 3, 8, protocol=protocol)

    assert "AUC+ lower by 3.000 (narrowly)" in result("paper").as_dict()["verdicts"]["chefer"]["text"]
    assert "(narrowly)" not in result("live").verdicts()["chefer"].text
