"""The perturbation test's parts (fractions, counts, order and ties, zeroing, AUC) and its running:
batches, deduplication, progress, cancellation, and the same curves at any batch size."""

from __future__ import annotations

import math

import pytest
import torch

from headscope.engine.faithfulness import (
    DEFAULT_FRACTIONS,
    MAX_FRACTIONS,
    Cancelled,
    FractionsError,
    PerturbationTest,
    auc,
    faithfulness,
    mean_aucs,
    parse_fractions,
    perturbed,
    removal_order,
    removed_count,
)
from headscope.engine.relevance import TargetError, relevance
from headscope.web.errors import to_api_error
from helpers.relevance_reference import FAMILIES, load_family

FAMILY = {f[0]: f for f in FAMILIES}


@pytest.fixture(scope="module")
def classifier():
    _, arch, kwargs, classes, hw = FAMILY["vit"]
    lm = load_family(arch, kwargs, classes)
    torch.manual_seed(0)
    x = torch.randn(3, *hw)
    return lm, x, relevance(lm, x[None], "top", ["chefer", "attention", "random"])[0]


# -- parts ---------------------------------------------------------------------------------
def test_default_fractions_are_the_tests_own():
    assert parse_fractions(None) == parse_fractions("") == DEFAULT_FRACTIONS
    assert DEFAULT_FRACTIONS == (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


def test_fractions_parse_from_text_or_a_sequence():
    assert parse_fractions("0, 0.25,.5,0.75") == (0.0, 0.25, 0.5, 0.75)
    assert parse_fractions([0.1, 0.2]) == (0.1, 0.2)
    assert parse_fractions("1e-1,0.5") == (0.1, 0.5)
    assert parse_fractions(["0", " 0.5"]) == (0.0, 0.5)  # strings read as the string form reads them
    assert parse_fractions(torch.tensor([0.0, 0.25])) == (0.0, 0.25)  # a tensor's elements are numbers
    assert len(parse_fractions([i / MAX_FRACTIONS for i in range(MAX_FRACTIONS)])) == 50


@pytest.mark.parametrize(
    "spec,says",
    [
        ("0,1", r"outside \[0, 1\)"),
        ("0,1.5", "outside"),
        ("-0.1,0.2", r"-0.1 is outside \[0, 1\)"),  # readable, out of range: said so
        (["-0.1", 0.2], r"-0.1 is outside \[0, 1\)"),
        ([-0.1, 0.2], "outside"),
        ("0.5,0.2", "not strictly ascending"),
        ("0.2,0.2", "not strictly ascending"),
        ([0.1, math.nan], "outside"),
        ([0.1, math.inf], "outside"),
        ("0.1,abc", "cannot read"),
        ("0.1,,0.2", "cannot read"),
        ([], "none given"),
        (",".join(str(i / 60) for i in range(51)), "at most 50"),
        # a sequence of what is not a number: before, float()'s raw ValueError / TypeError
        (["a"], "cannot read 'a'"),
        ([0.1, "x"], "cannot read 'x'"),
        ([0.1, None], "cannot read 'None'"),
        ([0.1, [0.2]], "cannot read"),
        ([False, 0.5], "cannot read 'False'"),
        (0.5, "as a sequence or a string"),
        (object(), "as a sequence or a string"),
    ],
)
def test_bad_fractions_are_422_bad_fractions(spec, says):
    with pytest.raises(FractionsError, match=says) as e:
        parse_fractions(spec)
    api = to_api_error(e.value)
    assert (api.status, api.code) == (422, "bad_fractions")


def test_removed_count_is_the_floor_of_f_times_p():
    assert [removed_count(f, 256) for f in DEFAULT_FRACTIONS] == [0, 25, 51, 76, 102, 128, 153, 179, 204, 230]
    assert removed_count(0.29, 100) == 29  # 0.29 * 100 = 28.999999999999996 in binary
    assert removed_count(0.999, 16) == 15 and removed_count(0.06, 16) == 0


def test_removal_order_breaks_ties_by_the_lower_patch_index_either_way():
    m = torch.tensor([0.1, 0.3, 0.3, 0.1, 0.2, 0.3])
    assert removal_order(m, "positive").tolist() == [1, 2, 5, 4, 0, 3]
    assert removal_order(m, "negative").tolist() == [0, 3, 4, 1, 2, 5]
    assert removal_order(torch.zeros(2, 3), "positive").tolist() == [0, 1, 2, 3, 4, 5]
    with pytest.raises(ValueError):
        removal_order(m, "up")


def test_auc_is_the_trapezoid_with_the_point_at_zero():
    assert auc([0.0, 0.5], [1.0, 0.0]) == pytest.approx(0.25)
    assert auc([0.5], [0.0]) == pytest.approx(0.25)  # (0, 1) added
    assert auc([0.2, 0.6], [0.5, 0.5]) == pytest.approx(0.2 * 0.75 + 0.4 * 0.5)
    assert auc(list(DEFAULT_FRACTIONS), [1.0] * 10) == pytest.approx(0.9)


@pytest.mark.parametrize("hw", [(8, 12), (10, 13)])  # the second has pixels beyond the last patch
def test_perturbed_zeroes_exactly_the_removed_patches(hw):
    torch.manual_seed(1)
    x = torch.randn(3, *hw) + 5  # no zeros of its own
    grid, patch = (2, 3), (4, 4)
    removed = torch.tensor([[False, True, False, False, False, True], [True] * 6])
    out = perturbed(x, removed, grid, patch)
    assert out.shape == (2, 3, *hw)
    want = x.clone()
    want[:, 0:4, 4:8] = 0  # patch 1: row 0, column 1
    want[:, 4:8, 8:12] = 0  # patch 5: row 1, column 2
    assert torch.equal(out[0], want)
    all_gone = torch.zeros_like(x)
    all_gone[:, 8:, :] = x[:, 8:, :]
    all_gone[:, :, 12:] = x[:, :, 12:]
    assert torch.equal(out[1], all_gone)


# -- running -------------------------------------------------------------------------------
def test_curves_start_at_one_and_the_forwards_are_counted(classifier):
    lm, x, rel = classifier
    res = faithfulness(lm, x, rel.maps, "top", [0.0, 0.3, 0.6])
    assert res.forwards == 1 + 3 * 2 * 2 and res.num_patches == 16 and res.class_index == rel.class_index
    assert res.y == pytest.approx(rel.y, rel=1e-4)
    for c in res.methods.values():
        assert c.positive[0] == c.negative[0] == 1.0 and c.removed == [0, 4, 9]
        assert c.auc_positive == pytest.approx(auc([0.0, 0.3, 0.6], c.positive))
    d = res.as_dict()
    assert set(d["methods"]["chefer"]) == {"positive", "negative", "auc_positive", "auc_negative", "removed"}
    assert d["fractions"] == [0.0, 0.3, 0.6] and d["target"] == "top"


def test_the_batch_size_does_not_change_the_curves(classifier):
    lm, x, rel = classifier
    a = faithfulness(lm, x, rel.maps, "top", batch_size=1)
    b = faithfulness(lm, x, rel.maps, "top", batch_size=8)
    c = faithfulness(lm, x[None], rel.maps, "top", batch_size=64)
    for m in rel.maps:
        for other in (b, c):
            # probabilities of logits of tens of units: batch rounding of 1e-6 in a logit moves them 1e-5
            assert a.methods[m].positive == pytest.approx(other.methods[m].positive, rel=1e-4, abs=1e-6)
            assert a.methods[m].negative == pytest.approx(other.methods[m].negative, rel=1e-4, abs=1e-6)


def test_equal_perturbations_run_once(classifier):
    lm, x, rel = classifier
    one = PerturbationTest(lm, x, {"chefer": rel.maps["chefer"]}, "top")
    two = PerturbationTest(lm, x, {"chefer": rel.maps["chefer"], "again": rel.maps["chefer"].clone()}, "top")
    assert one.total == two.total == 1 + 2 * 9
    res = faithfulness(lm, x, {"a": rel.maps["chefer"], "b": rel.maps["chefer"] * 3}, "top")
    assert res.methods["a"] == res.methods["b"]


def test_a_given_reference_saves_the_unperturbed_forward(classifier):
    lm, x, rel = classifier
    with torch.no_grad():
        ref = lm.model.forward_head(lm.model.forward_features(x[None]))
    test = PerturbationTest(lm, x, rel.maps, "top", [0.0, 0.5], reference=ref)
    assert test.total == 3 * 2
    while test.step():
        pass
    got = test.result()
    want = faithfulness(lm, x, rel.maps, "top", [0.0, 0.5])
    for m in rel.maps:
        assert got.methods[m].positive == pytest.approx(want.methods[m].positive, rel=1e-5)
    with pytest.raises(RuntimeError):
        PerturbationTest(lm, x, rel.maps, "top").result()  # before its steps


def test_progress_is_reported_after_each_batch_and_cancellation_stops_between_batches(classifier):
    lm, x, rel = classifier
    seen: list[tuple[int, int]] = []
    faithfulness(lm, x, rel.maps, "top", batch_size=8, progress=lambda d, t: seen.append((d, t)))
    total = PerturbationTest(lm, x, rel.maps, "top").total  # 1 + 3 * 2 * 9 less equal sets of 16 patches
    assert 40 < total <= 55
    assert seen == [(min(i, total), total) for i in range(8, total + 8, 8)]
    calls = []

    def cancelled() -> bool:
        calls.append(1)
        return len(calls) > 2

    done: list[int] = []
    with pytest.raises(Cancelled, match=f"after 16 of {total}"):
        faithfulness(lm, x, rel.maps, "top", progress=lambda d, t: done.append(d), cancelled=cancelled)
    assert done == [8, 16]


def test_bad_arguments(classifier):
    lm, x, rel = classifier
    with pytest.raises(TargetError):
        faithfulness(lm, x, rel.maps, "output")
    with pytest.raises(FractionsError):
        faithfulness(lm, x, rel.maps, "top", "0.5,0.1")
    with pytest.raises(ValueError, match="4 values"):
        faithfulness(lm, x, {"small": torch.ones(4)}, "top")
    with pytest.raises(ValueError, match="one picture"):
        faithfulness(lm, torch.stack([x, x]), rel.maps, "top")
    with pytest.raises(ValueError, match="batch_size"):
        faithfulness(lm, x, rel.maps, "top", batch_size=0)


def test_removing_patches_the_map_ranks_high_moves_the_logit_first(classifier):
    """Sanity on a real relevance map: the positive curve of the top logit falls below the
    negative one for chefer on this picture (not a law, but this picture is fixed)."""
    lm, x, rel = classifier
    res = faithfulness(lm, x, rel.maps, "top")
    assert res.methods["chefer"].auc_positive < res.methods["chefer"].auc_negative
    means = mean_aucs([res, res])
    assert means["chefer"]["n"] == 2
    assert means["chefer"]["auc_positive"] == pytest.approx(res.methods["chefer"].auc_positive)


# -- the sign of a logit (issue #40) --------------------------------------------------------
def test_a_negative_logit_target_is_scored_by_its_probability(classifier):
    """A non-top class with a negative logit: the curve is p(class | perturbed) / p(class), from an
    independent forward with a softmax written out, so it keeps its meaning (a falling curve means
    the class lost ground) whatever the logit's sign; y stays the logit."""
    from helpers.relevance_reference import curves, forward, probability_of

    lm, x, _ = classifier
    with torch.no_grad():
        logits = forward(lm.model, x[None])[2][0]
    negative = [int(c) for c in torch.argsort(logits) if logits[c] < -0.5]
    assert negative, "the fixture has no clearly negative logit"
    c = negative[0]
    rel = relevance(lm, x[None], f"class:{c}", ["chefer", "random"])[0]
    assert rel.y < 0
    fractions = [0.0, 0.25, 0.5, 0.75]
    res = faithfulness(lm, x, rel.maps, rel.target, fractions)
    assert res.y == pytest.approx(float(logits[c]), rel=1e-4) and res.y < 0
    assert res.score == "probability"
    p0 = float(torch.softmax(logits.double(), -1)[c])
    assert res.score0 == pytest.approx(p0, rel=1e-4) and res.score0 > 0
    want = curves(lambda t: forward(lm.model, t)[2], x, rel.maps["chefer"], None, fractions, rel.grid,
                  lm.patch_size, score=probability_of(c))  # fmt: skip
    got = res.methods["chefer"]
    assert got.positive == pytest.approx(want["positive"], rel=1e-4, abs=1e-6)
    assert got.negative == pytest.approx(want["negative"], rel=1e-4, abs=1e-6)
    # the old ratio of logits would differ: the perturbed logits divided by a negative number
    ratio = [float(forward(lm.model, x[None])[2][0, c]) / float(logits[c])]
    assert ratio == [pytest.approx(1.0)]
    assert all(v >= 0 for v in got.positive + got.negative)
    assert res.as_dict()["score"] == "probability"


def test_a_class_less_likely_than_a_uniform_guess_gets_no_verdict(classifier):
    """The review's case: a class the model gives 1.8e-16 rose 13,604-fold on the negative curve and
    was rated 'both'. Under 1/classes no method is rated; the top class always is."""
    lm, x, _ = classifier
    with torch.no_grad():
        p = lm.model(x[None])[0].double().softmax(-1)
    classes = p.numel()
    unlikely = int(p.argmin())
    assert float(p[unlikely]) < 1 / classes
    rel = relevance(lm, x[None], f"class:{unlikely}", ["chefer", "random"])[0]
    res = faithfulness(lm, x, rel.maps, rel.target, [0.0, 0.5])
    v = res.verdicts()["chefer"]
    assert res.classes == classes and v.verdict == "undefined" and v.margin_positive is None
    assert f"less than a uniform guess among its {classes:,} classes" in v.text and "(top)" in v.text
    assert res.as_dict()["verdicts"]["random"]["verdict"] == "baseline"
    rel = relevance(lm, x[None], "top", ["chefer", "random"])[0]
    top = faithfulness(lm, x, rel.maps, rel.target, [0.0, 0.5]).verdicts()["chefer"]
    assert top.verdict in ("both", "positive", "negative", "neither")


def test_saliency_and_embedding_curves_divide_the_target_itself():
    from headscope.engine.relevance import Target

    out = torch.tensor([[0.2, 0.3], [0.5, 0.1]])[:, None]
    assert torch.equal(Target("output").score(out, out), Target("output").value(out, out))
    assert Target("embedding").score_name == "target" and Target("top").score_name == "probability"


# -- the paper's protocol (issue #40) -------------------------------------------------------
def _paper_reference(lm, x01, vis, cls, fractions, negative):
    """Chefer et al.'s ``pertubation_eval_from_hdf5.py`` loop for one picture, written out: the
    patch map upsampled with ``interpolate(scale_factor=patch, mode="bilinear")``, ``topk`` of the
    map (or of its negation) over ``int(H W f)`` pixels set to 0 in the [0, 1] picture, then
    normalised; a hit where the perturbed top-1 is the class. The forward is the hand-written one."""
    import numpy as np

    from helpers.relevance_reference import forward

    mean = torch.tensor(lm.mean)[:, None, None]
    std = torch.tensor(lm.std)[:, None, None]
    up = torch.nn.functional.interpolate(vis[None, None].double(), scale_factor=lm.patch_size[0], mode="bilinear")
    v = -up.flatten() if negative else up.flatten()
    H, W = x01.shape[-2:]
    with torch.no_grad():
        hits = [float(forward(lm.model, ((x01 - mean) / std)[None])[2][0].argmax() == cls)]
        for f in fractions[1:]:
            idx = torch.topk(v, int(H * W * f)).indices
            d = x01.clone().reshape(3, -1)
            d[:, idx] = 0
            hits.append(float(forward(lm.model, ((d.reshape(3, H, W) - mean) / std)[None])[2][0].argmax() == cls))
    return hits, float(np.trapezoid(hits, fractions) * 100)


@pytest.mark.parametrize("spelling", ["top", "class:second"])
def test_the_paper_protocol_equals_the_papers_loop(classifier, spelling):
    lm, _, _ = classifier
    torch.manual_seed(5)
    x01 = torch.rand(3, 64, 64)
    x = (x01 - torch.tensor(lm.mean)[:, None, None]) / torch.tensor(lm.std)[:, None, None]
    with torch.no_grad():
        logits = lm.model.forward_head(lm.model.forward_features(x[None]))[0]
    top, second = int(logits.argmax()), int(logits.argsort()[-2])
    target = "top" if spelling == "top" else f"class:{second}"
    cls = top if spelling == "top" else second
    maps = {"a": torch.rand(4, 4), "b": torch.rand(4, 4)}
    fractions = list(DEFAULT_FRACTIONS)
    res = faithfulness(lm, x, maps, target, fractions, protocol="paper", batch_size=5)
    assert res.protocol == "paper" and res.score == "top1" and res.as_dict()["protocol"] == "paper"
    assert res.score0 == float(cls == top)
    assert res.methods["a"].removed == [int(64 * 64 * f) for f in fractions]
    for name, vis in maps.items():
        for direction in ("positive", "negative"):
            hits, area = _paper_reference(lm, x01, vis, cls, fractions, direction == "negative")
            got = res.methods[name]
            assert getattr(got, direction) == hits, (name, direction)
            assert getattr(got, f"auc_{direction}") == pytest.approx(area, abs=1e-9)


def test_the_paper_protocol_fills_black_and_removes_pixels_not_patches(classifier):
    from headscope.engine.faithfulness import black, blacked, pixel_map

    lm, x, _ = classifier
    fill = black(lm, "cpu", torch.float32)
    assert torch.allclose(fill[:, 0, 0] * torch.tensor(lm.std) + torch.tensor(lm.mean), torch.zeros(3), atol=1e-6)
    removed = torch.zeros(1, 64, 64, dtype=torch.bool)
    removed[0, 3, 5] = True
    out = blacked(x, removed, fill)[0]
    assert torch.equal(out[:, 3, 5], fill[:, 0, 0]) and (out != x).sum() == 3
    m = torch.rand(4, 4)
    up = pixel_map(m, (4, 4), (16, 16))
    want = torch.nn.functional.interpolate(m[None, None].double(), scale_factor=16, mode="bilinear")[0, 0]
    assert torch.equal(up, want) and up.shape == (64, 64)


def test_the_paper_protocol_needs_a_class_target_and_protocols_are_named():
    from headscope.engine.faithfulness import ProtocolError, parse_protocol

    assert parse_protocol(None) == parse_protocol("") == "live" and parse_protocol("paper") == "paper"
    # exact names only, as the REST API and the survey's --protocol take them (one behaviour everywhere)
    for spelling in ("chefer", "Paper", " paper ", "LIVE", "papr"):
        with pytest.raises(ProtocolError, match="unknown") as e:
            parse_protocol(spelling)
        assert to_api_error(e.value).code == "bad_protocol"
    for other in (1, 0.5, ["paper"], b"paper"):  # before: AttributeError ('int' object has no attribute 'strip')
        with pytest.raises(ProtocolError, match="protocol is a string") as e:
            parse_protocol(other)
        assert to_api_error(e.value).code == "bad_protocol"
    _, arch, kwargs, classes, hw = FAMILY["dinov2"]
    lm = load_family(arch, kwargs, classes)  # an embedding model
    x = torch.randn(3, *hw)
    with pytest.raises(ProtocolError, match="class target") as e:
        faithfulness(lm, x, {"r": torch.rand(16)}, "embedding", protocol="paper")
    assert to_api_error(e.value).status == 422 and to_api_error(e.value).code == "bad_protocol"
