"""Every answer says its precision: the attention answer (JSON, the X-Headscope-Meta header and
the safetensors header of binary answers), the statistics and relevance, whose result is built in one place
(``uniform`` a bool, as the REST schema has it)."""

from __future__ import annotations

import json
import struct

import numpy as np
import orjson
from PIL import Image

from headscope.config import Settings
from headscope.engine.batching import BatchRunner
from headscope.engine.relevance import parse_target
from headscope.serving import answers
from headscope.serving.params import AttentionParams
from headscope.serving.pictures import Pictures
from headscope.serving.relevance import relevance_answer, relevance_maps, relevance_meta
from headscope.serving.store import CachedCapture, FoundCapture
from helpers.api import png


def _prep(lm):
    data = png(Image.fromarray(np.random.default_rng(4).integers(0, 256, (48, 64, 3), dtype=np.uint8)))
    return Pictures.for_model(lm, Settings()).prepare(data)


def test_attention_answers_say_their_precision(lm):
    prep = _prep(lm)
    with lm.lock:
        att = BatchRunner(lm).capture([prep.raw])[0]
    for precision in ("fp32", "bf16"):
        found = FoundCapture(
            CachedCapture(lm.id, lm.captured(att, prep.input_size), prep.image_size, precision), False, {}
        )
        assert answers.stats_body("abc", found, {})["precision"] == precision
        for fmt in ("json", "safetensors", "npy"):
            params = AttentionParams(format=fmt)
            answer = answers.built(
                answers.AnswerSubject("abc", None, found, params, answers.selection(params, found.entry.image))
            )
            body = b"".join(bytes(p) for p in answer.body)
            if fmt == "json":
                assert orjson.loads(body)["precision"] == precision
            else:
                assert json.loads(answer.headers["X-Headscope-Meta"])["precision"] == precision
            if fmt == "safetensors":
                (n,) = struct.unpack("<Q", body[:8])
                header = json.loads(body[8 : 8 + n])
                assert json.loads(header["__metadata__"]["headscope"])["precision"] == precision


def test_relevance_results_are_built_once_with_precision(lm):
    prep = _prep(lm)
    target = parse_target(None, lm)
    maps = relevance_maps(lm, prep, target)
    assert maps.precision == "fp32"
    meta = relevance_meta("abc", lm, maps, "chefer")
    assert meta["precision"] == "fp32" and isinstance(meta["uniform"], bool)
    body = orjson.loads(b"".join(bytes(p) for p in relevance_answer("abc", lm, maps, "chefer").body))
    assert {k: v for k, v in body.items() if k not in ("relevance", "cached", "timing_ms")} == meta
