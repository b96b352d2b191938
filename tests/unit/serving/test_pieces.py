"""The request path's pieces work without a server: in plain Python (no worker thread, no
asyncio) they give the answers the service gives, number for number."""

from __future__ import annotations

import asyncio

import numpy as np
import orjson
import torch
from PIL import Image

from headscope.config import Settings
from headscope.engine.forward import forward_capture
from headscope.serving import answers
from headscope.serving.explain import ExplainParams, explain, explained
from headscope.serving.params import AttentionParams
from headscope.serving.pictures import Pictures
from headscope.serving.service import AttentionService
from headscope.serving.store import CachedCapture, FoundCapture
from headscope.serving.uploads import Upload, image_id_of
from headscope.serving.worker import Worker
from headscope.zoo.registry import Registry
from helpers.api import png

TIMING = ("timing_ms", "cached")  # how an answer was got, not what it says


def _json(answer: answers.Answer) -> dict:
    body = orjson.loads(b"".join(bytes(part) for part in answer.body))
    return {k: v for k, v in body.items() if k not in TIMING}


def test_the_pieces_answer_as_the_service_does(tmp_path):
    registry = Registry(["random:test_vit"], tmp_path)
    lm = registry.get()
    settings = Settings(models_dir=tmp_path)
    data = png(Image.fromarray(np.random.default_rng(3).integers(0, 256, (60, 90, 3), dtype=np.uint8)))
    params = AttentionParams(layers="-1,0", heads="1,0", query="patch:1,2", temperature=0.5, drop="prefix", stats=True)
    how = ExplainParams(layer=-1, head=1, query="patch:2,3")

    # Plain Python: decode and prepare as the server does, one forward, then the answers.
    prep = Pictures.for_model(lm, settings).prepare(data)
    att = forward_capture(lm, prep.pixels[None])[0]
    found = FoundCapture(CachedCapture(lm.id, lm.captured(att, prep.input_size), prep.image_size), False, {})
    image_id = image_id_of(data)
    sel = answers.selection(params, found.entry.image)
    plain = _json(answers.built(answers.AnswerSubject(image_id, "x.png", found, params, sel)))
    plain_explain = _json(explained(image_id, None, lm, found, how))  # a follow-up: no uploader's name
    plain_stats = answers.stats_body(image_id, found, found.entry.stats(0.4))

    async def served():
        worker = Worker(torch.device("cpu"))
        await worker.start()
        svc = AttentionService(settings, registry, worker, worker.metrics)
        try:
            answer = await svc.post(Upload(data, "x.png"), params)
            stats = await svc.stats(image_id, None, 0.4)
            return _json(answer), _json(await explain(svc, image_id, how)), stats
        finally:
            await worker.stop(1)

    answer, explain_answer, stats = asyncio.run(served())
    assert plain["image_id"] == answer["image_id"] == image_id
    assert plain == answer
    assert plain_explain == explain_answer
    assert plain_stats == stats
    assert np.asarray(plain["attention"]).shape == (2, 2, 1, lm.layout(prep.input_size).count)
