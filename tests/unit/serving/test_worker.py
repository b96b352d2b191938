"""The worker's batching and failure isolation, on a tiny model."""

from __future__ import annotations

import asyncio
import time

import torch

from app.serving.faults import InjectedFault
from app.serving.worker import Job, OutOfMemory, Worker


def jobs_for(lm, faults):
    size = lm.input_size
    return [Job(lm=lm, pixels=torch.randn(3, *size), deadline=time.monotonic() + 30, fault=f) for f in faults]


def run(worker, jobs):
    async def go():
        await worker.start()
        futs = [worker.submit(j) for j in jobs]
        out = await asyncio.gather(*futs, return_exceptions=True)
        await worker.stop(1)
        return out

    return asyncio.run(go())


def test_batches_form_and_match_single_runs(lm):
    w = Worker(torch.device("cpu"), max_batch_size=4, max_wait_ms=50)
    jobs = jobs_for(lm, [None] * 6)
    out = run(w, jobs)
    assert w.max_batch_seen == 4 and w.batches_run == 2
    single = run(
        Worker(torch.device("cpu"), max_batch_size=1),
        [Job(lm=lm, pixels=j.pixels, deadline=time.monotonic() + 30) for j in jobs],
    )
    for a, b in zip(out, single):
        for layer in range(a.att.num_layers):
            torch.testing.assert_close(a.att.rows(layer), b.att.rows(layer), atol=1e-6, rtol=0)


def test_an_error_fails_only_its_request(lm):
    w = Worker(torch.device("cpu"), max_batch_size=4, max_wait_ms=50)
    out = run(w, jobs_for(lm, [None, "raise", None]))
    assert isinstance(out[1], InjectedFault)
    assert not isinstance(out[0], Exception) and not isinstance(out[2], Exception)


def test_oom_splits_the_batch_and_retries(lm):
    w = Worker(torch.device("cpu"), max_batch_size=4, max_wait_ms=50)
    out = run(w, jobs_for(lm, [None, "oom", None, "oom-always"]))
    assert isinstance(out[3], OutOfMemory)
    assert all(not isinstance(r, Exception) for r in out[:3])
    assert w.metrics.oom_splits._value.get() >= 1


def test_oom_first_evicts_what_the_cache_keeps_on_the_device_then_retries_once(lm):
    w = Worker(torch.device("cpu"), max_batch_size=4, max_wait_ms=50)
    freed = []
    w.on_out_of_memory(lambda: freed.append(1) or 1000)
    out = run(w, jobs_for(lm, ["oom-always"]))
    assert isinstance(out[0], OutOfMemory) and freed == [1]  # one eviction, one retry, no loop
    nothing = Worker(torch.device("cpu"), max_batch_size=4, max_wait_ms=50)
    nothing.on_out_of_memory(lambda: freed.append(2) or 0)  # nothing to free: split at once
    out = run(nothing, jobs_for(lm, [None, "oom", None]))
    assert all(not isinstance(r, Exception) for r in out) and nothing.metrics.oom_splits._value.get() >= 1


def test_cancelled_jobs_are_not_computed(lm):
    async def go():
        w = Worker(torch.device("cpu"), max_batch_size=1)
        await w.start()
        jobs = jobs_for(lm, ["sleep:0.3", None])
        f0 = w.submit(jobs[0])
        await asyncio.sleep(0.05)
        f1 = w.submit(jobs[1])
        f1.cancel()  # the client went away while queued
        await f0
        await asyncio.sleep(0.05)
        await w.stop(1)
        return w.jobs_computed

    assert asyncio.run(go()) == 1


def test_statistics_wait_for_the_uploads_queued_before_them(lm):
    """run_after_forwards: forwards queued (or arriving) while it waits run first; run_in_worker
    would have slipped in right after the running forward."""

    async def go(defer: bool):
        w = Worker(torch.device("cpu"), max_batch_size=1)
        await w.start()
        order: list[str] = []
        jobs = jobs_for(lm, ["sleep:0.3", None, None])
        futs = []
        for i, j in enumerate(jobs):
            f = w.submit(j)
            f.add_done_callback(lambda _f, i=i: order.append(f"forward {i}"))
            futs.append(f)
        await asyncio.sleep(0.05)  # forward 0 is running; 1 and 2 are queued
        run = w.run_after_forwards if defer else w.run_in_worker
        await asyncio.gather(run(lambda: order.append("stats")), *futs)
        await w.stop(1)
        return order

    assert asyncio.run(go(True)) == ["forward 0", "forward 1", "forward 2", "stats"]
    assert asyncio.run(go(False)).index("stats") < 3  # FIFO on the worker thread: ahead of a queued upload


def test_deferred_statistics_are_not_starved(lm):
    async def go():
        w = Worker(torch.device("cpu"), max_batch_size=1)
        await w.start()
        futs = [w.submit(j) for j in jobs_for(lm, ["sleep:0.5"] * 4)]  # two seconds of forwards
        await w.run_after_forwards(lambda: None, max_defer_s=0.2)
        done = sum(f.done() for f in futs)
        await asyncio.gather(*futs)
        await w.stop(1)
        return done

    assert asyncio.run(go()) < 4  # it ran while uploads were still queued
