"""``GET …/zero-shot?maps=true``: every label's map is computed under the request's one deadline.
Each took a fresh one (``deadline=None``: 60 s from that label on), so 64 labels held a heavy
slot for minutes, past the 504 the docs promise. In-process, with stand-ins for the service."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import numpy as np

from headscope.serving import zero_shot as zs


class Service:
    """The parts of the relevance service the answer uses; each deadline asked for is later."""

    worker = SimpleNamespace(amp_dtype=None, precision="fp32")
    device = "cpu"
    uploads = SimpleNamespace(require=lambda image_id: "upload")

    def __init__(self):
        self.now = 100.0
        self.deadlines: list[float | None] = []

    def deadline(self) -> float:
        self.now += 10
        return self.now

    async def model(self, model_id):
        return SimpleNamespace(id="clip", stages=None)  # global attention: not refused as windowed

    async def prepared(self, upload, lm):
        return SimpleNamespace(input_size=(224, 224))

    async def piece(self, fn):
        return {"logits": [1.0, 2.0, 3.0], "probabilities": [0.2, 0.3, 0.5], "rule": "softmax"}

    async def maps(self, image_id, lm, ablate, target, prep, upload=None, deadline=None):
        self.deadlines.append(deadline)
        return SimpleNamespace(relevance=SimpleNamespace(text_tokens=[], grid=(2, 2))), False


def test_every_labels_map_has_the_requests_one_deadline(monkeypatch):
    tower = SimpleNamespace(check=lambda phrase: None, logit_scale=1.0, logit_bias=None)
    monkeypatch.setattr(zs, "require_text", lambda lm: tower)
    monkeypatch.setattr(zs, "parse_method", lambda method, target, lm: "chefer")
    monkeypatch.setattr(zs, "method_map", lambda maps, method: np.zeros((2, 2)))
    rel = Service()
    ans = asyncio.run(zs.zero_shot_answer(rel, "id", zs.ZeroShotParams(labels="a dog,a cat,a car", maps=True)))
    assert [r["label"] for r in ans["labels"]] == ["a car", "a cat", "a dog"]
    assert rel.deadlines == [110.0] * 3  # the one taken as the request began
