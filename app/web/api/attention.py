"""POST /api/v1/attention, GET /api/v1/attention/{image_id}, GET /api/v1/images/{image_id}."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response
from pydantic import ValidationError
from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException
from starlette.requests import ClientDisconnect

from ...config import Settings
from ...serving.admission import Ticket
from ...serving.answers import Answer
from ...serving.params import AttentionParams, StatsParams, validation_message
from ...serving.service import AttentionService
from ...serving.uploads import Upload, safe_filename
from ...serving.waiting import ClientGone
from ..deps import AdmitFollowUp, AdmitUpload, ImageIdDep, MetricsDep, ServiceDep, SettingsDep, meant
from ..errors import ApiError, JSONBody
from ..middleware import upload_too_large_message
from ..multipart import BodyTooSlow, is_multipart, multipart_error, read_form
from ..schemas import ERROR_RESPONSES, AttentionResponse, StatsResponse
from ..service_calls import counted_as, measured, respond

# Each text field of the form is small; the file is bounded by the body limit.
MAX_FIELD_BYTES = 64 * 1024

router = APIRouter(prefix="/api/v1", tags=["attention"])

_FORM_FIELDS = set(AttentionParams.model_fields)


def _form_schema() -> dict[str, dict]:
    """The form fields as AttentionParams describes them (type, allowed values, default, description):
    the same schema as the GET query parameters, so that /docs shows menus and numbers, not bare strings."""
    props = AttentionParams.model_json_schema()["properties"]
    return {name: {k: v for k, v in schema.items() if k != "title"} for name, schema in props.items()}


_PARAM_SCHEMA = _form_schema()
_OPENAPI_POST = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["image"],
                    "properties": {
                        "image": {
                            "type": "string",
                            "format": "binary",
                            "description": "PNG, JPEG, WebP, GIF, BMP or TIFF",
                        },
                        **_PARAM_SCHEMA,
                    },
                },
                "encoding": {"image": {"contentType": "image/*"}},
            }
        },
    },
    "responses": {
        "200": {
            "content": {
                "application/json": {
                    "example": {
                        "model": "dinov2-s14-focus",
                        "image_id": "3f2c…",
                        "shape": [12, 6, 1, 257],
                        "layers": [0, 1, "…"],
                        "heads": [0, 1, 2, 3, 4, 5],
                        "query": [0],
                        "tokens": {
                            "count": 257,
                            "num_prefix": 1,
                            "prefix": [{"index": 0, "kind": "cls"}],
                            "grid": [16, 16],
                            "patch_size": [14, 14],
                        },
                        "attention": [[[[0.0021, 0.0009, "…"]]]],
                    }
                },
                "application/octet-stream": {
                    "schema": {"type": "string", "format": "binary"},
                    "description": "format=safetensors or npy",
                },
            }
        }
    },
}


def _params(fields: dict) -> AttentionParams:
    try:
        return AttentionParams(**fields)
    except ValidationError as e:
        raise ApiError(422, "invalid_parameter", validation_message(e)) from None


@router.post(
    "/attention",
    summary="Attention maps for an uploaded image",
    response_model=AttentionResponse,
    responses=ERROR_RESPONSES,
    openapi_extra=_OPENAPI_POST,
)
@counted_as("post")
async def post_attention(
    request: Request, service: ServiceDep, settings: SettingsDep, metrics: MetricsDep, ticket: AdmitUpload
) -> Response:
    """Upload an image (multipart field `image`) and get the softmax attention of the selected
    layers, heads and query rows: `[layers, heads, queries, tokens]`. The answer's `image_id`
    lets later GETs ask for other slices without uploading again."""
    # Counted from here, the body's errors too (a 422 for a form field was not in requests_total).
    return respond(await measured(metrics, _post(request, service, settings, ticket), "post"))


async def _post(request: Request, service: AttentionService, settings: Settings, ticket: Ticket) -> Answer:
    """What ``POST /attention`` does once admitted: read the body, check it, compute."""
    registry = service.registry
    if not request.app.state.ready and registry.error(registry.default):
        raise ApiError(503, "model_unavailable", "the default model failed to load; see /readyz")
    if not is_multipart(request.headers.get("content-type", "")):
        raise ApiError(415, "not_multipart", "send multipart/form-data with the file in the field 'image'")
    try:
        # A few fields and one file more than there are, so that a repeated field or a second
        # image is named as such below (the body's size is bounded by BodyLimit either way).
        form = await read_form(
            request,
            max_files=2,
            max_fields=len(_FORM_FIELDS) + 4,
            max_part_size=MAX_FIELD_BYTES,
            timeout_s=ticket.remaining(),
            grace_s=settings.body_grace_s,
            min_rate=settings.min_body_bytes_per_s,
        )
    except MultiPartException as e:
        raise multipart_error(e, MAX_FIELD_BYTES) from None
    except BodyTooSlow as e:
        raise ApiError(
            408,
            "request_timeout",
            f"the upload arrived too slowly ({e}; after the first {settings.body_grace_s:g} s a body must average "
            f"{settings.min_body_bytes_per_s:,.0f} bytes/s)",
        ) from None
    except asyncio.TimeoutError:
        raise ApiError(
            408, "request_timeout", f"the upload did not arrive within {settings.request_timeout_s:g} s"
        ) from None
    except ClientDisconnect:
        raise ClientGone("the client closed the connection during the upload") from None
    try:
        fields, data, filename = await _read_fields(form)
    finally:
        await form.close()
    if len(data) > settings.max_upload_bytes:
        raise ApiError(413, "upload_too_large", upload_too_large_message(settings.max_upload_bytes))
    # The body had a deadline of its own; decoding and computing get a whole one.
    ticket.restart()
    params = _params(fields)
    fault = request.headers.get("x-headscope-fault") if settings.enable_fault_injection else None
    return await service.post(Upload(data, filename), params, fault=fault)


async def _read_fields(form) -> tuple[dict[str, str], bytes, str | None]:
    """The text fields, the file's bytes and its display name; 422 for what a form must not be."""
    counts = Counter(k for k, _ in form.multi_items())
    unknown = sorted(set(counts) - _FORM_FIELDS - {"image"})
    if unknown:
        takes = f"the form takes 'image' (the file) and {', '.join(sorted(_FORM_FIELDS))}"
        raise ApiError(
            422,
            "unknown_field",
            f"unknown form field(s): {', '.join(unknown)[:200]}{meant(unknown, _FORM_FIELDS)}; {takes}",
        )
    repeated = sorted(k for k, n in counts.items() if n > 1)
    if repeated:
        raise ApiError(
            422, "duplicate_field", f"form field(s) sent more than once: {', '.join(repeated)}; send each once"
        )
    file = form.get("image")
    if file is None:
        raise ApiError(422, "missing_image", "no file in the form field 'image'")
    if not isinstance(file, UploadFile):
        raise ApiError(422, "missing_image", "the field 'image' must be a file, not text")
    fields = {k: v for k, v in form.items() if k != "image"}
    if any(not isinstance(v, str) for v in fields.values()):
        raise ApiError(422, "invalid_parameter", "parameters must be text fields")
    return fields, await file.read(), safe_filename(file.filename)


@router.get(
    "/attention/{image_id}/stats",
    summary="Per-head statistics of an image already sent",
    response_model=StatsResponse,
    responses=ERROR_RESPONSES,
)
@counted_as("stats")
async def get_stats(
    service: ServiceDep,
    metrics: MetricsDep,
    _: AdmitFollowUp,
    image_id: ImageIdDep,
    params: Annotated[StatsParams, Query()],
):
    """Entropy, mean attention distance, attention to prefix and artifact tokens, head
    similarity, rank of the head outputs and mass-threshold sizes for every layer and head."""
    call = service.stats(image_id, params.model, params.mass, params.ablate)
    body = await measured(metrics, call, "stats")
    return JSONBody(body)


@router.get(
    "/attention/{image_id}",
    summary="More slices of an image already sent",
    response_model=AttentionResponse,
    responses=ERROR_RESPONSES,
)
@counted_as("get")
async def get_attention(
    service: ServiceDep,
    metrics: MetricsDep,
    _: AdmitFollowUp,
    image_id: ImageIdDep,
    params: Annotated[AttentionParams, Query()],
) -> Response:
    """The same selection as the POST, answered from the server's cache (LRU by bytes). 404 once
    the image has been evicted: upload it again."""
    call = service.attention(image_id, params)
    return respond(await measured(metrics, call, "get"))


@router.get(
    "/images/{image_id}",
    summary="The uploaded picture as PNG (for the page)",
    responses={200: {"content": {"image/png": {}}}, **{s: ERROR_RESPONSES[s] for s in (404, 413, 422, 429)}},
)
@counted_as("image")
async def get_image(image_id: ImageIdDep, service: ServiceDep, metrics: MetricsDep, _: AdmitFollowUp) -> Response:
    """Decoded within the decode budget (413/429 as for uploads), made once and kept in the cache."""
    png = await measured(metrics, service.display_png(image_id), "image")
    return Response(png, media_type="image/png", headers={"Cache-Control": "private, max-age=3600"})
