"""Relevance maps and perturbed forwards as worker jobs (issue #40, item 5): concurrent requests are
collected like uploads, run in one batch per model, input size, ablation and target, give each
picture what it gets alone, and an error fails only its own request."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch

from headscope.engine.batching import BatchRunner
from headscope.engine.faithfulness import PerturbationTest, faithfulness
from headscope.engine.relevance import parse_target
from headscope.serving.faults import InjectedFault
from headscope.serving.relevance import BASE_METHODS, PerturbedWork, RelevanceWork
from headscope.serving.worker import Job, Worker
from helpers.relevance_reference import load_vit

SIZES = [(64, 64), (48, 80), (64, 64), (64, 64)]
FRACTIONS = [0.0, 0.3, 0.6]


@pytest.fixture(scope="module")
def vit():
    return load_vit()[0]


@pytest.fixture(scope="module")
def raws():
    gen = torch.Generator().manual_seed(7)
    return [torch.randint(0, 256, (3, h, w), generator=gen, dtype=torch.uint8) for h, w in SIZES]


def _run(worker: Worker, jobs: list[Job]) -> list:
    async def go():
        await worker.start()
        out = await asyncio.gather(*(worker.compute(j) for j in jobs), return_exceptions=True)
        await worker.stop(1)
        return out

    return asyncio.run(go())


def test_concurrent_relevance_requests_run_as_one_batch_per_size_and_equal_each_alone(vit, raws):
    target = parse_target("top", vit)
    methods = (*BASE_METHODS, "chefer2021", "attnlrp")
    deadline = time.monotonic() + 600
    w = Worker(torch.device("cpu"), max_batch_size=8, max_wait_ms=200)
    faults = [None, "raise", None, None]
    jobs = [
        Job(lm=vit, pixels=r, deadline=deadline, fault=f, work=RelevanceWork(target, methods))
        for r, f in zip(raws, faults)
    ]
    out = _run(w, jobs)
    assert isinstance(out[1], InjectedFault)  # its own error; the others answered
    # one batch per input size: the three 64 x 64 pictures in one forward
    assert w.max_batch_seen == 3 and w.batches_run == 1
    runner = BatchRunner(vit, None)
    for i in (0, 2, 3):
        rel, ms = out[i]
        alone = runner.relevance([raws[i]], target, methods)[0]
        assert rel.y == pytest.approx(alone.y, rel=1e-5, abs=1e-6) and rel.class_index == alone.class_index
        for m in methods:
            # the same tolerance as the engine's batch-versus-alone test: float rounding of a batched matmul
            torch.testing.assert_close(rel.maps[m], alone.maps[m], atol=1e-6, rtol=1e-4)


def test_a_relevance_batch_shares_one_forward(vit, raws):
    target = parse_target("top", vit)
    w = Worker(torch.device("cpu"), max_batch_size=8, max_wait_ms=200)
    deadline = time.monotonic() + 600
    same = [raws[0], raws[2], raws[3]]
    out = _run(w, [Job(lm=vit, pixels=r, deadline=deadline, work=RelevanceWork(target, BASE_METHODS)) for r in same])
    assert w.batches_run == 1 and w.max_batch_seen == 3
    assert not any(isinstance(r, BaseException) for r in out)
    # an error inside a batch: the batch reruns one job at a time, only the culprit fails
    w = Worker(torch.device("cpu"), max_batch_size=8, max_wait_ms=200)
    jobs = [
        Job(lm=vit, pixels=r, deadline=deadline, fault=f, work=RelevanceWork(target, BASE_METHODS))
        for r, f in zip(same, [None, "raise", None])
    ]
    again = _run(w, jobs)
    assert isinstance(again[1], InjectedFault)
    for a, b in zip((out[0], out[2]), (again[0], again[2])):
        torch.testing.assert_close(a[0].maps["chefer"], b[0].maps["chefer"], atol=1e-6, rtol=1e-4)


def test_perturbed_forwards_of_concurrent_tests_stack_and_give_each_test_its_curves(vit, raws):
    runner = BatchRunner(vit, None)
    rels = [runner.relevance([r], "top", ["chefer", "random"])[0] for r in raws[:3]]
    xs = [runner.inputs([r])[0] for r in raws[:3]]
    tests = [PerturbationTest(vit, x, rel.maps, rel.target, FRACTIONS) for x, rel in zip(xs, rels)]
    deadline = time.monotonic() + 600
    jobs = [Job(lm=vit, pixels=t.pixels, deadline=deadline, work=PerturbedWork(t, e)) for t in tests for e in t.queue]
    w = Worker(torch.device("cpu"), max_batch_size=8, max_wait_ms=200)
    out = _run(w, jobs)
    assert all(r is None for r in out)
    # tests 0 and 2 share an input size: their forwards stacked (fewer batches than test by test)
    per_test = sum(-(-t.total // 8) for t in tests)
    assert w.batches_run < per_test and w.max_batch_seen == 8
    for x, rel, t in zip(xs, rels, tests):
        got, alone = t.result(), faithfulness(vit, x, rel.maps, rel.target, FRACTIONS)
        for m in rel.maps:
            assert got.methods[m].positive == pytest.approx(alone.methods[m].positive, rel=1e-4, abs=1e-6)
            assert got.methods[m].negative == pytest.approx(alone.methods[m].negative, rel=1e-4, abs=1e-6)
