"""GET …/output (the model's own output, with heads removed), …/importance and …/pruning (with
their …/progress)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import Response

from ...serving.params import ImportanceParams, ImportanceQuery, OutputParams, PruningParams, PruningQuery
from ..deps import AblationDep, AdmitDep, AdmitHeavy, ImageIdDep, MetricsDep
from ..errors import JSONBody
from ..responses import PartsResponse
from ..schemas import ERROR_RESPONSES, ImportanceResponse, OutputResponse, ProgressResponse, PruningResponse
from ..service_calls import counted_as, measured
from ..service_calls import long_answer as _long_answer

router = APIRouter(prefix="/api/v1", tags=["ablation"])

_OUTPUT_CONTENT = {
    "application/json": {},
    "application/octet-stream": {
        "schema": {"type": "string", "format": "binary"},
        "description": "format=safetensors (tensors `output` and, with ablate, `baseline`) or npy (`output`); "
        "metadata in the X-Headscope-Meta header",
    },
}


@router.get(
    "/attention/{image_id}/output",
    summary="The model's own output, with heads removed",
    response_model=OutputResponse,
    responses={**ERROR_RESPONSES, 200: {"content": _OUTPUT_CONTENT}},
)
@counted_as("output")
async def get_output(
    ablation: AblationDep,
    metrics: MetricsDep,
    _: AdmitDep,
    image_id: ImageIdDep,
    params: Annotated[OutputParams, Query()],
) -> Response:
    """What the model predicts for an image already sent: `saliency` (the default model: where
    people look, `[h][w]` at the model's input size, 0..1), `classes` (a classifier: top 5 with
    ImageNet names and the full probability vector) or `embedding` (neither: the pooled
    embedding and its norm). With `ablate`, the output of the model with those heads removed,
    and its `change` against the unablated output."""
    call = ablation.output(image_id, params.model, params.ablate, params.format)
    answer = await measured(metrics, call, "output")
    return PartsResponse(answer.body, media_type=answer.media_type, headers=answer.headers)


@router.get(
    "/attention/{image_id}/importance",
    summary="How much each head matters for the model's output",
    response_model=ImportanceResponse,
    responses={**ERROR_RESPONSES, 202: {"model": ProgressResponse, "description": "`wait` ran out: the progress"}},
)
@counted_as("importance")
async def get_importance(
    ablation: AblationDep,
    metrics: MetricsDep,
    _: AdmitHeavy,
    image_id: ImageIdDep,
    params: Annotated[ImportanceParams, Query()],
):
    """`importance[l][h]` for every layer and head. `ablation` (exact): the output change when
    that head alone is removed (saliency: mean |difference|; classes: the drop of the unablated
    top class's log-probability, with `kl` beside; embedding: relative L2 change). `gradient`:
    Michel et al.'s |d loss / d m_h| at m = 1 (`loss` says which loss). Computed once per image
    and cached; takes seconds: `…/importance/progress` reports how far it is."""
    call = ablation.importance(image_id, params.model, params.method, params.wait)
    return _long_answer(await measured(metrics, call, "importance"))


@router.get(
    "/attention/{image_id}/importance/progress",
    summary="How far the importance computation is",
    response_model=ProgressResponse,
    responses={404: ERROR_RESPONSES[404], 422: ERROR_RESPONSES[422]},
)
async def get_importance_progress(
    ablation: AblationDep, image_id: ImageIdDep, params: Annotated[ImportanceQuery, Query()]
):
    """Poll this while `GET …/importance` runs: `state` (`idle`, `running`, `done`), `done` of
    `total` units of work, `fraction`, `eta_s`. Takes no worker time and no admission slot."""
    return JSONBody(ablation.progress("importance", image_id, params.model, params.method))


@router.get(
    "/attention/{image_id}/pruning",
    summary="Output change as heads are removed, least important first",
    response_model=PruningResponse,
    responses={**ERROR_RESPONSES, 202: {"model": ProgressResponse, "description": "`wait` ran out: the progress"}},
)
@counted_as("pruning")
async def get_pruning(
    ablation: AblationDep,
    metrics: MetricsDep,
    _: AdmitHeavy,
    image_id: ImageIdDep,
    params: Annotated[PruningParams, Query()],
):
    """The pruning curve (Michel et al., fig. 2, for one image): heads ordered by `method`'s
    importance, least important first; `change[i]` is the output change with the first
    `removed[i]` of `order` removed together. Computes the importance first if needed."""
    call = ablation.pruning(image_id, params.model, params.method, params.points, params.wait)
    return _long_answer(await measured(metrics, call, "pruning"))


@router.get(
    "/attention/{image_id}/pruning/progress",
    summary="How far the pruning curve is",
    response_model=ProgressResponse,
    responses={404: ERROR_RESPONSES[404], 422: ERROR_RESPONSES[422]},
)
async def get_pruning_progress(
    ablation: AblationDep,
    image_id: ImageIdDep,
    params: Annotated[PruningQuery, Query()],
):
    """As `…/importance/progress`, for `GET …/pruning` (while its importance is computed first,
    `stage` says so)."""
    return JSONBody(ablation.progress("pruning", image_id, params.model, params.method, params.points))
