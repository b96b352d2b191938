"""Perturbation tests of many pictures at once (issue #40, item 5): the perturbed forwards of every
picture stacked across pictures in full batches (:func:`run_tests`, ``BatchRunner.faithfulness_many``)
give each picture the curves its own test gives, for pictures of different sizes, with the
out-of-memory split and a failure kept with its own picture."""

from __future__ import annotations

import math

import pytest
import torch

from headscope.engine import faithfulness as faith
from headscope.engine.batching import BatchRunner, split_on_oom
from headscope.engine.faithfulness import PerturbationTest, faithfulness, run_tests
from headscope.engine.relevance import relevance
from helpers.relevance_reference import FAMILIES, load_family

FAMILY = {f[0]: f for f in FAMILIES}
SIZES = [(64, 64), (48, 80), (64, 64), (32, 48), (48, 80)]  # three input sizes, two of them twice
METHODS = ["chefer", "attention", "random"]
FRACTIONS = [0.0, 0.2, 0.5, 0.8]
# The same picture's logits from a forward of another batch composition differ by float rounding
# alone (a matmul blocks a batch of 3 and one of 8 differently: about 1e-6 of a logit); the
# probabilities of logits of a few units then move by about 1e-6 relative; rel 1e-4 leaves margin.
# Top-1 hits (protocol paper) are compared exactly.
REL, ABS = 1e-4, 1e-6


@pytest.fixture(scope="module")
def lm():
    _, arch, kwargs, classes, _ = FAMILY["vit"]
    return load_family(arch, kwargs, classes)


@pytest.fixture(scope="module")
def pictures(lm):
    gen = torch.Generator().manual_seed(3)
    xs = [torch.randn(3, h, w, generator=gen) for h, w in SIZES]
    rels = [relevance(lm, x[None], "top", METHODS, seed=2)[0] for x in xs]
    return xs, rels


def _tests(lm, xs, rels, protocol="live", batch_size=8, target="top"):
    return [
        PerturbationTest(lm, x, r.maps, target, FRACTIONS, batch_size=batch_size, protocol=protocol)
        for x, r in zip(xs, rels)
    ]


def _same(a: faith.Faithfulness, b: faith.Faithfulness, exact: bool = False) -> None:
    assert a.fractions == b.fractions and a.forwards == b.forwards and a.class_index == b.class_index
    assert a.y == pytest.approx(b.y, rel=REL, abs=ABS)
    for m in METHODS:
        ca, cb = a.methods[m], b.methods[m]
        assert ca.removed == cb.removed
        if exact:
            assert (ca.positive, ca.negative) == (cb.positive, cb.negative)
        else:
            assert ca.positive == pytest.approx(cb.positive, rel=REL, abs=ABS)
            assert ca.negative == pytest.approx(cb.negative, rel=REL, abs=ABS)
            assert ca.auc_positive == pytest.approx(cb.auc_positive, rel=REL, abs=ABS)


@pytest.mark.parametrize("protocol", ["live", "paper"])
def test_many_pictures_of_several_sizes_equal_each_picture_alone(lm, pictures, protocol):
    xs, rels = pictures
    calls: list[list[tuple[int, int]]] = []

    def run(fn, items):
        shapes = {tuple(tests[t].pixels.shape) for t, _ in items}
        assert len(shapes) == 1  # one input size per forward
        calls.append([(t, -1 if e is None else e) for t, e in items])
        return fn(items)

    tests = _tests(lm, xs, rels, protocol)
    together = run_tests(tests, 8, run=run)
    for x, r, got in zip(xs, rels, together):
        assert not isinstance(got, BaseException)
        alone = faithfulness(lm, x, r.maps, "top", FRACTIONS, batch_size=8, protocol=protocol)
        _same(got, alone, exact=protocol == "paper")
    # full batches across pictures: per input size, ceil(its forwards / 8) forwards, all but the last full
    per_size: dict[tuple, int] = {}
    for t in tests:
        per_size[t.input_hw] = per_size.get(t.input_hw, 0) + t.total
    assert len(calls) == sum(math.ceil(n / 8) for n in per_size.values())
    assert sum(len(c) for c in calls) == sum(t.total for t in tests)
    assert sum(len({t for t, _ in c}) > 1 for c in calls) >= 1  # some forward held two pictures


def test_outputs_that_come_before_the_unperturbed_one_wait_for_it(lm, pictures):
    """``take`` in any order (a server batches work of several requests as it comes)."""
    xs, rels = pictures
    test = _tests(lm, xs[:1], rels[:1])[0]
    queue = test.queue
    assert queue[0] is None
    order = queue[3:] + queue[:3]  # the reference in the second forward
    for part in (order[:4], order[4:]):
        test.take(part, faith.forward_outputs(lm, test.inputs(part), None, ()))
    _same(test.result(), faithfulness(lm, xs[0], rels[0].maps, "top", FRACTIONS))


def test_out_of_memory_splits_the_stacked_batch_and_the_curves_stay(lm, pictures):
    xs, rels = pictures
    sizes: list[int] = []

    def fn_oom(fn):
        def run(items):
            sizes.append(len(items))
            if len(items) > 3:
                raise RuntimeError("CUDA out of memory (simulated)")
            return fn(items)

        return run

    tests = _tests(lm, xs, rels)
    got = run_tests(tests, 8, run=lambda fn, items: split_on_oom(fn_oom(fn), items, torch.device("cpu")))
    assert max(sizes) == 8 and any(s <= 3 for s in sizes)
    for x, r, res in zip(xs, rels, got):
        _same(res, faithfulness(lm, x, r.maps, "top", FRACTIONS))


def test_a_failure_stays_with_its_picture(lm, pictures):
    xs, rels = pictures
    tests = _tests(lm, xs, rels)
    bad = tests[1]

    def broken(entries):
        raise ValueError("this picture's perturbation broke")

    bad.inputs = broken  # type: ignore[method-assign]
    got = run_tests(tests, 8, run=lambda fn, items: split_on_oom(fn, items, torch.device("cpu")))
    assert isinstance(got[1], ValueError)
    for i in (0, 2, 3, 4):
        _same(got[i], faithfulness(lm, xs[i], rels[i].maps, "top", FRACTIONS))


def test_progress_counts_every_forward_and_cancel_stops_between_batches(lm, pictures):
    xs, rels = pictures
    seen: list[tuple[int, int]] = []
    tests = _tests(lm, xs, rels)
    run_tests(tests, 8, progress=lambda d, t: seen.append((d, t)))
    total = sum(t.total for t in tests)
    assert seen[-1] == (total, total) and all(a[0] < b[0] for a, b in zip(seen, seen[1:]))
    with pytest.raises(faith.Cancelled):
        run_tests(_tests(lm, xs, rels), 8, cancelled=lambda: True)


def test_the_runner_takes_uint8_pictures_of_any_size_and_keeps_errors_per_picture(lm):
    gen = torch.Generator().manual_seed(5)
    raws = [torch.randint(0, 256, (3, h, w), generator=gen, dtype=torch.uint8) for h, w in SIZES[:4]]
    runner = BatchRunner(lm, None, batch_size=8)
    rels = [runner.relevance([r], "top", METHODS, seed=2)[0] for r in raws]
    maps = [r.maps for r in rels]
    maps[2] = {"chefer": torch.ones(3)}  # the wrong number of patches: that picture's error alone
    got = runner.faithfulness_many(raws, maps, [r.target for r in rels], FRACTIONS)
    assert isinstance(got[2], ValueError) and "patches" in str(got[2])
    for i in (0, 1, 3):
        _same(got[i], runner.faithfulness(raws[i], maps[i], rels[i].target, FRACTIONS))
