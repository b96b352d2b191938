"""The request path (AttentionService) on a tiny model: cache accounting, device memory on OOM."""

from __future__ import annotations

import torch

from headscope.serving.cache import CaptureKey
from headscope.serving.worker import Worker


def test_service_charges_batch_mates_once_and_gives_device_memory_back_on_oom(lm, tmp_path):
    from headscope.config import Settings
    from headscope.serving.service import AttentionService
    from headscope.serving.store import CachedCapture

    w = Worker(torch.device("cpu"))
    svc = AttentionService(Settings(models_dir=tmp_path), registry=None, worker=w, metrics=w.metrics)
    with torch.inference_mode():
        with lm.capture.capturing():
            lm.model.forward_features(torch.randn(2, 3, *lm.input_size))
        host = lm.capture.results()
        with lm.capture.capturing():
            lm.model.forward_features(torch.randn(1, 3, *lm.input_size))
        device = lm.capture.results(to="meta")  # stands in for a GPU
    for i, att in enumerate(host):
        svc.cache.put(
            CaptureKey(str(i), lm.id),
            CachedCapture(lm.id, lm.captured(att, lm.input_size), lm.input_size),
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
        CachedCapture(lm.id, lm.captured(device[0], lm.input_size), lm.input_size),
        4096,
        shared=device[0].storages(),
    )
    assert svc.free_device_memory() > 0 and len(svc.cache) == 2


def test_a_cached_picture_is_no_company_a_batch_waits_for(lm, tmp_path):
    """An upload whose capture is cached has no forward: while its answer is built it holds its
    slot, but a batch does not wait for it (it waited the whole max_wait)."""
    import asyncio

    from headscope.config import Settings
    from headscope.serving.admission import UPLOAD, Admission
    from headscope.serving.metrics import Metrics
    from headscope.serving.service import AttentionService
    from headscope.serving.store import CachedCapture

    adm = Admission(8, Metrics())
    w = Worker(torch.device("cpu"), admission=adm)
    svc = AttentionService(Settings(models_dir=tmp_path), registry=None, worker=w, metrics=w.metrics)
    with torch.inference_mode(), lm.capture.capturing():
        lm.model.forward_features(torch.randn(1, 3, *lm.input_size))
    (att,) = lm.capture.results()
    svc.cache.put(CaptureKey("cached", lm.id), CachedCapture(lm.id, lm.captured(att, lm.input_size), lm.input_size), 0)

    async def go() -> tuple[int, int]:
        with adm.admit(UPLOAD):
            before = adm.uploads_to_queue
            found = await svc.store.get("cached", lm)
            assert found.cached
            return before, adm.uploads_to_queue  # still answering, holding its slot

    assert asyncio.run(go()) == (1, 0)
