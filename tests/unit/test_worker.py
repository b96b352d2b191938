"""The worker's batching and failure isolation, on a tiny model."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch

from app.serving.admission import Admission, QueueFullError
from app.serving.cache import ByteLRU, CaptureKey
from app.serving.faults import InjectedFault
from app.serving.metrics import Metrics
from app.serving.worker import Job, OutOfMemory, Worker
from app.zoo.registry import Registry


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    return Registry(["random:test_vit"], tmp_path_factory.mktemp("m")).get()


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


def test_admission_refuses_at_once_when_every_slot_is_taken_and_frees_slots_on_error():
    adm = Admission(2, Metrics())
    with adm.slot(), adm.slot():
        assert adm.full
        with pytest.raises(QueueFullError), adm.slot():
            pass
    with pytest.raises(ValueError), adm.slot():
        raise ValueError("the request failed")
    assert adm.in_use == 0 and not adm.full
    assert adm.metrics.rejections.labels("queue_full")._value.get() == 1


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


def test_byte_lru_evicts_least_recent():
    c = ByteLRU(100)
    c.put("a", 1, 40)
    c.put("b", 2, 40)
    assert c.get("a") == 1  # a is now the most recent
    c.put("c", 3, 40)
    assert c.get("b") is None and c.get("a") == 1 and c.nbytes == 80
    assert not c.put("huge", 0, 101) and c.get("huge") is None


def test_byte_lru_charges_a_shared_buffer_once_and_frees_it_with_its_last_user():
    c = ByteLRU(250)
    c.put("a", 1, 10, shared={"batch": 100})
    c.put("b", 2, 10, shared={"batch": 100})  # a batch-mate: same buffer
    assert c.nbytes == 120
    c.put("c", 3, 10, shared={"other": 100})
    assert c.nbytes == 230
    # 280 > 250: evicting a frees only its own 10 bytes (b still uses the batch), so b goes too
    c.put("d", 4, 50)
    assert c.get("a") is None and c.get("b") is None and c.nbytes == 160 and len(c) == 2
    c.put("c", 3, 10, shared={"other": 100})  # replacing a value does not charge twice
    assert c.nbytes == 160
    assert c.evict_where(lambda v: v == 3) == 110 and c.nbytes == 50 and len(c) == 1
    assert not c.put("e", 5, 10, shared={"x": 250}) and c.nbytes == 50


def test_service_charges_batch_mates_once_and_gives_device_memory_back_on_oom(lm, tmp_path):
    from app.config import Settings
    from app.serving.service import AttentionService, Capture

    w = Worker(torch.device("cpu"))
    svc = AttentionService(Settings(models_dir=tmp_path), registry=None, worker=w, metrics=w.metrics)
    with torch.inference_mode():
        with lm.capture.capturing():
            lm.model.forward_features(torch.randn(2, 3, *lm.input_size))
        host = lm.capture.results()
        with lm.capture.capturing():
            lm.model.forward_features(torch.randn(1, 3, *lm.input_size))
        device = lm.capture.results(to="meta")  # stands in for a GPU
    layout = lm.layout(lm.input_size)
    for i, att in enumerate(host):
        svc.cache.put(
            CaptureKey(str(i), lm.id),
            Capture(lm.id, att, layout, lm.input_size, lm.input_size),
            4096,
            shared=att.storages(),
        )
    alive = {
        (t.untyped_storage().data_ptr()): t.untyped_storage().nbytes()
        for att in host
        for t in (*att.q, *att.k, *att.head_out, att.last_norms)
    }
    assert svc.cache.nbytes == 2 * 4096 + sum(alive.values())
    assert svc.free_device_memory() == 0 and len(svc.cache) == 2  # host captures stay
    svc.cache.put(
        CaptureKey("gpu", lm.id),
        Capture(lm.id, device[0], layout, lm.input_size, lm.input_size),
        4096,
        shared=device[0].storages(),
    )
    assert svc.free_device_memory() > 0 and len(svc.cache) == 2
