"""GET /api/v1/attention/{image_id}/explain: one head's whole computation, from the cache."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from ...serving.explain import ExplainParams, explain
from ..deps import AdmitDep, MetricsDep, ServiceDep
from ..errors import ApiError
from ..responses import PartsResponse
from ..schemas import ERROR_RESPONSES, ExplainResponse
from .attention import ImageIdP, _check_id, _run

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
async def get_explain(
    request: Request,
    service: ServiceDep,
    metrics: MetricsDep,
    _: AdmitDep,
    image_id: ImageIdP,
    params: Annotated[ExplainParams, Query()],
) -> Response:
    """The query token's q, every key and value, the scores before the softmax (with any
    bias), the softmax row, the head's output, each head's share of the output projection and
    the projection's output, for an image already sent. No forward pass when the image's
    capture is cached; 404 once it has been evicted."""
    _check_id(image_id)
    answer = await _run(metrics, explain(service, image_id, params, request.is_disconnected), "explain")
    if answer is None:
        raise ApiError(404, "image_not_found", f"image {image_id} is not (or no longer) cached; POST it again")
    return PartsResponse(answer.body, media_type=answer.media_type, headers=answer.headers)
