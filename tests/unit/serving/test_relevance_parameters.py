"""The REST API's relevance and faithfulness parameters, resolved as the routes resolve them
(app/serving/relevance.py) without a server: chefer2021's ``start_layer`` (checked, refused
without chefer2021, part of every cache and batch key that holds a chefer2021 map), the protocol
parsed by the engine (422 ``bad_protocol`` for any other spelling, as the Python API), and the
faithfulness route's OpenAPI description (what the curves are, what the cache key holds)."""

from __future__ import annotations

import pytest
import torch

from headscope.engine.faithfulness import ProtocolError
from headscope.engine.relevance import StartLayerError, Target
from headscope.serving.params import FaithfulnessParams, FaithfulnessQuery, RelevanceParams
from headscope.serving.relevance import (
    BASE_METHODS,
    FaithfulnessSpec,
    RelevanceWork,
    faithfulness_spec,
    resolved_start,
)
from headscope.web.errors import to_api_error
from helpers.relevance_reference import load_vit


@pytest.fixture(scope="module")
def vit():
    return load_vit()[0]  # 3 layers, 10 classes


def test_start_layer_is_resolved_checked_and_refused_without_chefer2021(vit):
    spec = faithfulness_spec(vit, FaithfulnessQuery(methods="chefer2021,random", target="top", start_layer=0))
    assert spec.start_layer == 0
    assert faithfulness_spec(vit, FaithfulnessQuery(methods="chefer2021", target="top")).start_layer == 1
    assert faithfulness_spec(vit, FaithfulnessQuery(methods="chefer,random", target="top")).start_layer is None
    for q, says in [
        (FaithfulnessQuery(methods="chefer,random", start_layer=1), "only chefer2021 takes it"),
        (FaithfulnessQuery(methods="chefer2021", start_layer=3), "0..2"),
        (FaithfulnessQuery(methods="chefer2021", start_layer=-1), "not counted from the end"),
    ]:
        with pytest.raises(StartLayerError, match=says) as e:
            faithfulness_spec(vit, q)
        assert (to_api_error(e.value).status, to_api_error(e.value).code) == (422, "bad_start_layer")
    assert RelevanceParams(method="chefer2021", start_layer=2).start_layer == 2
    assert RelevanceParams().start_layer is None and FaithfulnessParams().start_layer is None


def test_two_start_layers_never_share_a_cached_answer_or_a_batch(vit):
    def spec(start: int | None, methods: tuple[str, ...] = ("chefer2021", "random")) -> FaithfulnessSpec:
        return FaithfulnessSpec(methods, Target("top"), (0.0, 0.5), 0, (), "live", start)

    k0, k1 = spec(0).key("i", "m"), spec(1).key("i", "m")
    assert k0 != k1 and (k0.start_layer, k1.start_layer) == (0, 1)
    assert spec(None).key("i", "m") == k1  # the default spelt out: left out and asked for share one
    other = spec(None, ("chefer", "random")).key("i", "m")
    assert other.methods == ("chefer", "random") and other.start_layer is None  # as before
    assert resolved_start(BASE_METHODS, 0) is None and resolved_start(("attnlrp",), None) is None
    assert resolved_start(("chefer2021",), 0) == 0 and resolved_start(("chefer2021",), None) == 1
    work = [RelevanceWork(Target("top"), ("chefer2021",), s) for s in (0, 1)]
    assert work[0].key != work[1].key  # the worker batches jobs of one key into one call


def test_the_protocol_is_parsed_by_the_engine_so_a_bad_one_is_bad_protocol(vit):
    """Before, the query model's Literal answered 422 invalid_parameter for ``Paper`` and
    ``papr``, where the Python API took ``Paper`` and raised bad_protocol for ``papr``."""
    assert faithfulness_spec(vit, FaithfulnessQuery(target="top", protocol="paper")).protocol == "paper"
    for empty in ("", None):
        assert faithfulness_spec(vit, FaithfulnessQuery(target="top", protocol=empty)).protocol == "live"
    for bad in ("Paper", "papr", " paper", "LIVE"):
        with pytest.raises(ProtocolError, match="unknown") as e:
            faithfulness_spec(vit, FaithfulnessQuery(target="top", protocol=bad))
        assert (to_api_error(e.value).status, to_api_error(e.value).code) == (422, "bad_protocol")


def test_the_faithfulness_description_says_what_the_curves_and_the_cache_key_are():
    from headscope.web.main import create_app

    op = create_app().openapi()["paths"]["/api/v1/attention/{image_id}/faithfulness"]["get"]
    text = " ".join(op["description"].split())
    assert "y(perturbed) / y" not in text  # the live class curves are a probability ratio; paper's 0/1 hits
    assert "score(most relevant patches removed) / score0" in text and "1 where the top-1 prediction" in text
    assert "fractions, seed, protocol, chefer2021's start_layer and ablation set" in text
    params = {p["name"]: p for p in op["parameters"]}
    assert "enum" not in params["protocol"]["schema"] and "bad_protocol" in params["protocol"]["description"]
    assert "start_layer" in params and "bad_start_layer" in params["start_layer"]["description"]


def test_a_worker_batch_passes_its_start_layer_to_the_engine(vit):
    from headscope.engine.batching import BatchRunner
    from headscope.engine.relevance import relevance

    torch.manual_seed(0)
    raw = torch.randint(0, 256, (3, 64, 64), dtype=torch.uint8)
    runner = BatchRunner(vit, None)

    class _Job:
        pixels, ablate = raw, ()

    ((got, _),) = RelevanceWork(Target("top"), ("chefer2021",), 0).run(runner, [_Job()])
    want = relevance(vit, runner.inputs([raw]), "top", ["chefer2021"], chefer2021_start=0)[0]
    assert got.start_layer == 0 and torch.equal(got.maps["chefer2021"], want.maps["chefer2021"])
