"""Answers built on answer threads beside the worker thread (what CUDA does) are the very bytes
the worker thread builds (what the CPU does); an error in one answer fails that request alone;
results leave the device through `to_host` (pinned memory and a CUDA event on CUDA; ``.cpu()``
here)."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import threading

import numpy as np
import orjson
import pytest
import torch

from headscope.config import Settings
from headscope.engine.batching import BatchRunner
from headscope.engine.device import to_host
from headscope.engine.selection import SelectionError
from headscope.serving.admission import Admission
from headscope.serving.answers import Answers, AnswerSubject, built, selection
from headscope.serving.metrics import Metrics
from headscope.serving.params import AttentionParams
from headscope.serving.store import CachedCapture, FoundCapture
from headscope.serving.worker import ANSWER_THREADS, Worker

ASKED = [
    dict(),  # CLS rows of every layer and head, JSON
    dict(layers="0,-1", heads="1", query="all", format="npy"),
    dict(query="all", aggregate="rollout", format="safetensors", dtype="float16"),
    dict(layers="2", query="patch:1,2", aggregate="mean", drop="prefix"),
]


@pytest.fixture(scope="module")
def found(lm):
    raws = [
        torch.from_numpy(np.random.default_rng(s).integers(0, 256, (3, *lm.input_size), dtype=np.uint8)) for s in (0, 1)
    ]
    atts = BatchRunner(lm).capture(raws, materialise=True)
    return [
        FoundCapture(CachedCapture(lm.id, lm.captured(att, lm.input_size), lm.input_size, "fp32"), False, {})
        for att in atts
    ]


def _maps(data: bytes, fmt: str) -> bytes:
    """The maps of an encoded answer, as raw bytes (the metadata besides them differs in its timing)."""
    if fmt == "json":
        return np.asarray(orjson.loads(data)["attention"], dtype=np.float32).tobytes()
    if fmt == "npy":
        return np.load(io.BytesIO(data)).tobytes()
    from safetensors.numpy import load

    return b"".join(v.tobytes() for v in load(data).values())


def _bodies(worker: Worker, found: list[FoundCapture], asked: list[dict]) -> list[object]:
    settings = Settings()

    async def go() -> list[object]:
        await worker.start()
        try:
            answers = Answers(settings, worker, Admission(32, Metrics()))

            async def one(i: int, kw: dict) -> object:
                params = AttentionParams(**kw)
                a = await answers.answer(f"img{i}", None, found[i % len(found)], params)
                if a.stream is not None:
                    data = b"".join([bytes(p) async for p in a.stream])
                else:
                    data = b"".join(bytes(memoryview(b).cast("B")) for b in a.body)
                meta = {k: v for k, v in a.meta.items() if k != "timing_ms"}  # the time it took differs
                return meta, _maps(data, params.format)

            return await asyncio.gather(*(one(i, kw) for i, kw in enumerate(asked)), return_exceptions=True)
        finally:
            await worker.stop(1)

    return asyncio.run(go())


def test_the_default_is_chosen_by_device():
    assert Worker(torch.device("cpu")).overlap is False
    cuda = Worker(torch.device("cuda"))  # constructing it needs no GPU
    assert cuda.overlap is True and cuda._answers is not None and cuda._answers._max_workers == ANSWER_THREADS
    assert Worker(torch.device("cpu"), answer_threads=2).overlap is True
    assert Worker(torch.device("cuda"), answer_threads=0).overlap is False


def test_answers_on_answer_threads_are_the_worker_threads_bytes(found):
    asked = ASKED * 2  # several at once: the answer threads run them together
    on_worker = _bodies(Worker(torch.device("cpu")), found, asked)
    beside = _bodies(Worker(torch.device("cpu"), answer_threads=3), found, asked)
    assert all(isinstance(b, tuple) and len(b[1]) > 100 for b in on_worker)
    assert beside == on_worker


def test_an_error_in_one_answer_fails_that_request_alone(found):
    worker = Worker(torch.device("cpu"), answer_threads=2)
    good = [
        AnswerSubject(f"i{i}", None, found[0], AttentionParams(), selection(AttentionParams(), found[0].entry.image))
        for i in range(4)
    ]
    bad_sel = selection(AttentionParams(layers="0"), found[0].entry.image)
    bad_sel = dataclasses.replace(bad_sel, layers=[10_000])  # fails while the answer is built
    bad = AnswerSubject("bad", None, found[0], AttentionParams(layers="0"), bad_sel)
    threads: set[str] = set()

    def build(asked: AnswerSubject):
        threads.add(threading.current_thread().name)
        return built(asked)

    async def go():
        await worker.start()
        try:
            return await asyncio.gather(
                *(worker.run_answer(build, a) for a in [*good[:2], bad, *good[2:]]), return_exceptions=True
            )
        finally:
            await worker.stop(1)

    out = asyncio.run(go())
    assert isinstance(out[2], (IndexError, SelectionError, RuntimeError)), out[2]
    rest = [o for i, o in enumerate(out) if i != 2]
    assert all(not isinstance(o, BaseException) for o in rest)
    assert len({_maps(b"".join(bytes(memoryview(x).cast("B")) for x in o.body), "json") for o in rest}) == 1
    assert all(t.startswith("headscope-answer") for t in threads)


def test_to_host_on_the_cpu_is_the_tensor():
    t = torch.randn(2, 3)
    assert to_host(t) is t


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_to_host_on_cuda_is_pinned_and_equal():
    t = torch.randn(4, 5, device="cuda")
    h = to_host(t[:, 1:])  # a strided view too
    assert h.device.type == "cpu" and h.is_pinned() and torch.equal(h, t[:, 1:].cpu())
