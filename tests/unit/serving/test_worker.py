"""The worker's batching and failure isolation, on a tiny model."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import torch

from headscope.serving.admission import FOLLOW_UP, UPLOAD, Admission
from headscope.serving.faults import InjectedFault
from headscope.serving.metrics import Metrics
from headscope.serving.worker import Job, OutOfMemory, Worker
from helpers.waiting import until, wait_until


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
        await until(lambda: w.inflight, 30, "job 0 on the worker")
        f1 = w.submit(jobs[1])
        f1.cancel()  # the client went away while queued
        await f0
        await until(lambda: not w.depth and not w.inflight, 30, "the worker to reach the cancelled job")
        await w.stop(1)
        return w.jobs_computed

    assert asyncio.run(go()) == 1


def _cancelled_count(metrics) -> float:
    return metrics.rejections.labels("cancelled_before_compute")._value.get()


def test_jobs_given_up_leave_the_queue_at_once_and_count_as_the_job_says(lm):
    """A faithfulness test given up cancels its queued perturbed forwards (counted=False: the test
    counts once, not 75 times) and takes them out of the queue at once (no depth left behind);
    a request's own job still counts."""

    async def go():
        metrics = Metrics()
        w = Worker(torch.device("cpu"), max_batch_size=1, metrics=metrics)
        await w.start()
        blocker = w.submit(jobs_for(lm, ["sleep:0.3"])[0])
        await until(lambda: w.inflight, 30, "the first job on the worker")
        perturbed = jobs_for(lm, [None] * 5)
        for j in perturbed:
            j.counted = False
        own = jobs_for(lm, [None])[0]
        futs = [w.submit(j) for j in [*perturbed, own]]
        assert w.depth == 6
        for f in futs:
            f.cancel()
        w.drop_cancelled()
        assert w.depth == 0 and metrics.queue_depth._value.get() == 0
        assert _cancelled_count(metrics) == 1  # the request's own job; the test counts itself once
        await blocker
        await w.stop(1)
        return w.jobs_computed

    assert asyncio.run(go()) == 1


def test_statistics_wait_for_the_uploads_queued_before_them(lm):
    """run_after_forwards: forwards queued before it run first (the priority queue; see the
    priority tests below for forwards that arrive while it waits)."""

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
        await until(lambda: w.inflight and w.depth == 2, 30, "forward 0 running, 1 and 2 queued")
        run = w.run_after_forwards

        async def stats() -> None:
            # Recorded on the loop like the forwards' done-callbacks: appending on the worker
            # thread could run before the loop has handled the last forward's completion.
            await run(lambda: None)
            order.append("stats")

        await asyncio.gather(stats(), *futs)
        await w.stop(1)
        return order

    assert asyncio.run(go(True)) == ["forward 0", "forward 1", "forward 2", "stats"]


# -- priorities and deadlines ------------------------------------------------------------------
def test_calls_run_by_priority_then_arrival_and_an_upload_forward_overtakes_follow_ups(lm):
    """While the thread is busy, an upload's forward (priority 0) queued after follow-up calls
    (priority 1) runs before them; calls of one priority keep their order."""
    order = []

    async def go():
        w = Worker(torch.device("cpu"), max_batch_size=4, admission=Admission(8, Metrics()))
        await w.start()
        adm = w.admission
        release = threading.Event()
        blocker = asyncio.create_task(w.run_in_worker(release.wait, 30))  # occupies the thread
        await until(lambda: w.inflight, 30, "the blocker on the thread")

        def record(what: str) -> None:
            # Follow-up 0 runs first after the forward; it holds the thread until the upload's
            # encode is queued too (follow-ups 1 and 2 and the encode), so the order below is the
            # queue's, not how fast the event loop hands the encode over on a loaded machine.
            if what == "follow-up 0":
                wait_until(lambda: w.depth >= 3, 60, "the upload's encode queued too")
            order.append(what)

        async def follow_up(i):
            with adm.admit(FOLLOW_UP):
                await w.run_in_worker(record, f"follow-up {i}")

        async def upload():
            with adm.admit(UPLOAD) as t:
                job = jobs_for(lm, [None])[0]
                job.priority = t.priority
                await w.submit(job)
                await w.run_in_worker(order.append, "upload encode")

        tasks = []
        for i in range(3):
            tasks.append(asyncio.create_task(follow_up(i)))
            await asyncio.sleep(0)  # queued in this order
        await until(lambda: w.depth >= 3, 30, "the three follow-ups queued")
        tasks.append(asyncio.create_task(upload()))
        await until(lambda: w.depth >= 4, 30, "the upload's forward queued")
        release.set()
        await asyncio.gather(blocker, *tasks)
        await w.stop(1)

    # Recorded on the worker thread as the forward runs (the future's callback may come later).
    hook = lm.model.patch_embed.register_forward_pre_hook(lambda *_: order.append("upload forward"))
    try:
        asyncio.run(go())
    finally:
        hook.remove()
    assert order[0] == "upload forward", order
    assert order.index("upload encode") < order.index("follow-up 2")
    follow_ups = [x for x in order if x.startswith("follow-up")]
    assert follow_ups == ["follow-up 0", "follow-up 1", "follow-up 2"]


def test_a_call_whose_deadline_passes_while_queued_is_dropped_not_run():
    ran = []

    async def go():
        w = Worker(torch.device("cpu"), admission=Admission(8, Metrics(), timeout_s=0.2))
        await w.start()
        release = threading.Event()
        blocker = asyncio.create_task(w.run_in_worker(release.wait, 30))
        await until(lambda: w.inflight, 30, "the blocker on the thread")
        asyncio.get_running_loop().call_later(0.5, release.set)
        with w.admission.admit(FOLLOW_UP), pytest.raises(asyncio.TimeoutError):
            await w.run_in_worker(ran.append, 1)
        await blocker
        await until(lambda: not w.depth, 300, "the worker to reach the dropped call")
        await w.stop(1)
        return w.metrics

    metrics = asyncio.run(go())
    assert ran == []
    dropped = sum(
        metrics.rejections.labels(r)._value.get() for r in ("cancelled_before_compute", "deadline_before_compute")
    )
    assert dropped == 1


def test_a_batch_computes_its_answers_maps_at_once_equal_to_each_alone(lm):
    """Jobs that ask one selection get its maps computed for the batch at once (one product per
    layer), bit for bit each capture's own; a job alone, one that asks another selection, one
    whose selection fails or is too large to keep get none (their answers compute them)."""
    from headscope.engine import analysis
    from headscope.serving.answers import selection
    from headscope.serving.params import AttentionParams

    cls_rows, patch = AttentionParams(), AttentionParams(layers="0", query="patch:1,1")

    def asking(params):
        return lambda att: selection(params, lm.captured(att, lm.input_size))

    def failing(att):
        raise ValueError("a bad selection")

    jobs = jobs_for(lm, [None] * 5)
    for j, ask in zip(jobs, [asking(cls_rows), asking(cls_rows), asking(patch), failing, None]):
        j.answer = ask
    out = run(Worker(torch.device("cpu"), max_batch_size=8, max_wait_ms=200), jobs)
    assert [c.maps is not None for c in out] == [True, True, False, False, False]
    sel = selection(cls_rows, lm.captured(out[0].att, lm.input_size))
    for c in out[:2]:
        assert c.maps[0] == sel
        assert torch.equal(c.maps[1], analysis.attention_tensor(c.att, sel))

    # Every row of every layer: L x H x N x N floats a picture, kept up to the limit only.
    import headscope.serving.worker as worker_mod

    N = out[0].att.tokens_at(0)
    n = lm.num_layers * lm.num_heads * N * N
    limit = worker_mod.ANSWER_MAPS_MAX_FLOATS
    try:
        for cap, computed in ((n, True), (n - 1, False)):
            worker_mod.ANSWER_MAPS_MAX_FLOATS = cap
            big = jobs_for(lm, [None, None])
            for j in big:
                j.answer = asking(AttentionParams(query="all"))
            got = run(Worker(torch.device("cpu"), max_batch_size=8, max_wait_ms=200), big)
            assert [c.maps is not None for c in got] == [computed] * 2
    finally:
        worker_mod.ANSWER_MAPS_MAX_FLOATS = limit


def test_a_batch_waits_only_for_uploads_yet_to_queue_their_forward(lm):
    """Four uploads of a burst, three to a batch: the fourth starts at once, though the first
    three still hold their slots to send answers already computed (it waited the whole
    max_wait for them); an upload still decoding is waited for, and one over without a forward
    (a cached picture) ends the wait at once."""
    wait_s = 60.0  # far longer than any step here takes: a wait for company shows as a timeout

    async def go():
        adm = Admission(8, Metrics())
        w = Worker(torch.device("cpu"), max_batch_size=3, max_wait_ms=wait_s * 1000, admission=adm)
        await w.start()
        answered = asyncio.Event()
        queued = {}

        async def upload(i: int, job: Job, hold: bool) -> None:
            with adm.admit(UPLOAD):
                queued[i] = w.submit(job)
                await queued[i]
                if hold:  # computed; still sending its answer
                    await answered.wait()

        jobs = jobs_for(lm, [None] * 4)
        burst = [asyncio.create_task(upload(i, j, hold=i < 3)) for i, j in enumerate(jobs)]
        await asyncio.wait_for(asyncio.gather(burst[3]), wait_s / 4)
        assert w.batches_run == 2 and w.max_batch_seen == 3
        answered.set()
        await asyncio.gather(*burst)

        # One upload queued, one still decoding: they share a forward.
        late = asyncio.Event()
        a, b = jobs_for(lm, [None, None])

        async def decoding_then_queued() -> None:
            with adm.admit(UPLOAD):
                await late.wait()
                await w.submit(b)

        second = asyncio.create_task(decoding_then_queued())
        await asyncio.sleep(0)
        first = asyncio.create_task(upload(4, a, hold=False))
        await until(lambda: 4 in queued, 30, "the first upload queued")
        await asyncio.sleep(0.2)
        assert not queued[4].done()  # waiting for its company
        late.set()
        await asyncio.wait_for(asyncio.gather(first, second), wait_s / 4)
        assert w.batches_run == 3  # one forward for both

        # The company it waits for ends without a forward (a cached picture): it starts at once.
        gone = asyncio.Event()

        async def cached() -> None:
            with adm.admit(UPLOAD):
                await gone.wait()

        third = asyncio.create_task(cached())
        await asyncio.sleep(0)
        (c,) = jobs_for(lm, [None])
        alone = asyncio.create_task(upload(5, c, hold=False))
        await until(lambda: 5 in queued, 30, "the upload queued")
        gone.set()
        await asyncio.wait_for(asyncio.gather(alone, third), wait_s / 4)
        assert w.batches_run == 4
        await w.stop(1)

    asyncio.run(go())


def test_queue_depth_forgets_work_given_up_while_the_worker_is_busy(lm):
    """A job or call cancelled while another call holds the worker (its client gone) leaves the
    queue and the gauge at once, not when the worker would have reached it."""

    async def go():
        metrics = Metrics()
        w = Worker(torch.device("cpu"), max_batch_size=1, metrics=metrics)
        await w.start()
        release = threading.Event()
        blocker = asyncio.create_task(w.run_in_worker(release.wait, 30))
        await until(lambda: w.inflight, 30, "the blocker on the thread")
        futs = [w.submit(j) for j in jobs_for(lm, [None] * 3)]
        call = asyncio.create_task(w.run_in_worker(lambda: None))
        await until(lambda: w.depth == 4, 30, "the jobs and the call queued")
        assert metrics.queue_depth._value.get() == 4
        for f in futs:
            f.cancel()
        call.cancel()
        await until(lambda: metrics.queue_depth._value.get() == 0, 30, "the gauge at 0")
        assert w.depth == 0 and _cancelled_count(metrics) == 4
        release.set()
        await blocker
        await w.stop(1)
        return w.jobs_computed

    assert asyncio.run(go()) == 0
