"""GET /api/v1/attention/{image_id}/zero-shot: which of a few labels a CLIP-style model finds."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from ...serving.zero_shot import ZeroShotParams, zero_shot_answer
from ..deps import AdmitHeavy, ImageIdDep, MetricsDep, RelevanceDep
from ..errors import JSONBody
from ..schemas import ERROR_RESPONSES, ZeroShotResponse
from ..service_calls import counted_as, measured

router = APIRouter(prefix="/api/v1", tags=["relevance"])


@router.get(
    "/attention/{image_id}/zero-shot",
    summary="Zero-shot: the probability of each label, as a CLIP-style model scores the picture",
    response_model=ZeroShotResponse,
    responses=ERROR_RESPONSES,
)
@counted_as("zero_shot")
async def get_zero_shot(
    relevance: RelevanceDep,
    metrics: MetricsDep,
    _: AdmitHeavy,
    image_id: ImageIdDep,
    params: Annotated[ZeroShotParams, Query()],
):
    """The labels ranked by probability: CLIP's softmax over the labels of its scores
    (`exp(logit_scale)` times the cosine of the image and text embeddings), SigLIP's sigmoid of
    each score (`rule`). One forward of the image tower; each label's text embedding is cached
    per model and phrase. `maps=true` adds each label's relevance map (`method`, as
    `…/relevance?target=text:LABEL`) and its tokens' relevance. A model without a text tower,
    an empty label, one over 300 characters or more than 64 labels: 422 `bad_text`."""
    return JSONBody(await measured(metrics, zero_shot_answer(relevance, image_id, params), "zero_shot"))
