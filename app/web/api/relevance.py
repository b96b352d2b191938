"""GET …/relevance (why the output: one relevance map) and …/faithfulness (with its …/progress)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import Response

from ...serving.params import FaithfulnessParams, FaithfulnessQuery, RelevanceParams
from ..deps import AdmitHeavy, ImageIdDep, MetricsDep, RelevanceDep
from ..errors import JSONBody
from ..schemas import ERROR_RESPONSES, FaithfulnessResponse, ProgressResponse, RelevanceResponse
from ..service_calls import counted_as, long_answer, measured, respond

router = APIRouter(prefix="/api/v1", tags=["relevance"])

_RELEVANCE_RESPONSES: dict[int | str, dict[str, Any]] = {
    **ERROR_RESPONSES,
    200: {
        "content": {
            "application/octet-stream": {
                "schema": {"type": "string", "format": "binary"},
                "description": "format=npy (the [rows, cols] float32 map) or safetensors (tensor `relevance`); "
                "metadata in the X-Headscope-Meta header (and the safetensors header)",
            }
        }
    },
}


# Admission: a relevance map costs a forward that keeps every layer's softmax maps in the autograd
# graph and a backward through them (about 2.5 forwards, and L x H x N^2 floats twice over in
# memory); the test runs tens of forwards. Both take the heavy class: few at once, after uploads
# and follow-ups on the worker.
@router.get(
    "/attention/{image_id}/relevance",
    summary="Why the output: how much each patch contributes to one scalar of it",
    response_model=RelevanceResponse,
    responses=_RELEVANCE_RESPONSES,
)
@counted_as("relevance")
async def get_relevance(
    relevance: RelevanceDep,
    metrics: MetricsDep,
    _: AdmitHeavy,
    image_id: ImageIdDep,
    params: Annotated[RelevanceParams, Query()],
) -> Response:
    """A relevance map on the patch grid (`relevance[rows][cols]`, summing to 1) for one
    `target` of the model's output (saliency: `output` or a `box`; classes: `top` or `class:N`;
    embedding: `embedding`) by one `method`. One forward that keeps the attention maps and one
    backward give every method's map of the target: they are cached together, so another
    method of the same target answers from the cache. `start_layer` (chefer2021 only, 0..L-1,
    default 1): the first layer of its product, part of its cache key and echoed in the answer;
    with another method or outside the layers, 422 `bad_start_layer`. Windowed models (Swin): 422
    `relevance_unsupported`."""
    return respond(await measured(metrics, relevance.relevance(image_id, params), "relevance"))


@router.get(
    "/attention/{image_id}/faithfulness",
    summary="How faithful each relevance map is: the perturbation test",
    response_model=FaithfulnessResponse,
    responses={**ERROR_RESPONSES, 202: {"model": ProgressResponse, "description": "`wait` ran out: the progress"}},
)
@counted_as("faithfulness")
async def get_faithfulness(
    relevance: RelevanceDep,
    metrics: MetricsDep,
    _: AdmitHeavy,
    image_id: ImageIdDep,
    params: Annotated[FaithfulnessParams, Query()],
):
    """For each method, remove the most relevant part first (`positive`: the target should
    fall, lower is better) and the least relevant first (`negative`: it should hold, higher is
    better) at each fraction. protocol=live: each point is score(most relevant patches removed) /
    score0 at each fraction (see `score`: a class's softmax probability for `top` and `class:N`,
    else the target y itself; null when score0 = 0); protocol=paper: 1 where the top-1 prediction
    is still the target's class, else 0 (pixels of the upsampled map removed, not patches); with
    each curve's area (`auc_positive`, `auc_negative`; paper: in percent). `start_layer` is
    chefer2021's first layer (only with chefer2021 among the methods). The perturbed pictures run
    in batches on the worker; takes seconds: `…/faithfulness/progress` reports how far it is.
    Cached per image, model, target, methods, fractions, seed, protocol, chefer2021's start_layer
    and ablation set."""
    call = relevance.faithfulness(image_id, params)
    return long_answer(await measured(metrics, call, "faithfulness"))


@router.get(
    "/attention/{image_id}/faithfulness/progress",
    summary="How far the faithfulness test is",
    response_model=ProgressResponse,
    responses={404: ERROR_RESPONSES[404], 422: ERROR_RESPONSES[422]},
)
async def get_faithfulness_progress(
    relevance: RelevanceDep, image_id: ImageIdDep, params: Annotated[FaithfulnessQuery, Query()]
):
    """Poll this while `GET …/faithfulness` runs, with the same parameters (less `wait`):
    `state` (`idle`, `running`, `done`), `done` of `total` forwards, `fraction`, `eta_s`,
    `stage`. Takes no worker time and no admission slot."""
    return JSONBody(relevance.progress(image_id, params))
