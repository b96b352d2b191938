"""GET /api/v1/attention/{image_id}/explain: one head's whole computation, from the cache."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import Response

from ...serving.explain import explain
from ...serving.params import ExplainParams
from ..deps import AdmitDep, ImageIdDep, MetricsDep, ServiceDep
from ..schemas import ERROR_RESPONSES, ExplainResponse
from ..service_calls import counted_as, measured, respond

router = APIRouter(prefix="/api/v1", tags=["attention"])

_RESPONSES: dict[int | str, dict[str, Any]] = {
    **ERROR_RESPONSES,
    200: {
        "content": {
            "application/octet-stream": {
                "schema": {"type": "string", "format": "binary"},
                "description": "format=safetensors: every tensor by its JSON name, the rest in __metadata__",
            }
        }
    },
}


@router.get(
    "/attention/{image_id}/explain",
    summary="Inside a head: one head's whole computation for one query token",
    response_model=ExplainResponse,
    responses=_RESPONSES,
)
@counted_as("explain")
async def get_explain(
    service: ServiceDep,
    metrics: MetricsDep,
    _: AdmitDep,
    image_id: ImageIdDep,
    params: Annotated[ExplainParams, Query()],
) -> Response:
    """The query token's q, every key and value, the scores before the softmax (with any
    bias), the softmax row, the head's output, each head's share of the output projection and
    the projection's output, for an image already sent. No forward pass when the image's
    capture is cached; 404 once it has been evicted."""
    return respond(await measured(metrics, explain(service, image_id, params), "explain"))
