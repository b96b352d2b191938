"""GET /api/v1/models; the catalogue of models a page may load on demand, and their loads."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query
from starlette.concurrency import run_in_threadpool

from ...serving.params import Int
from ...zoo import catalog
from ...zoo.download import cached_weights
from ..deps import ModelLoadsDep, RegistryDep, SettingsDep
from ..errors import ApiError, JSONBody
from ..schemas import ERROR_RESPONSES, CatalogResponse, ErrorBody, LoadStatus, ModelsResponse

router = APIRouter(prefix="/api/v1", tags=["models"])

NameP = Annotated[
    str,
    Path(
        max_length=128,
        description="a name from the catalogue: timm's pretrained name, e.g. vit_small_patch16_224.augreg_in21k, "
        "or open_clip's ARCH/PRETRAINED, e.g. ViT-B-32/openai (a name only: never a URL or a path)",
        examples=["vit_small_patch16_224.augreg_in21k"],
    ),
]
_CATALOG_ERRORS: dict[int | str, dict[str, Any]] = {k: ERROR_RESPONSES[k] for k in (403, 404, 422, 503)}


def _require_any_model(settings) -> None:
    if not settings.any_model:
        raise ApiError(
            403,
            "any_model_off",
            "this server offers only its configured models; start it with `headscope serve --any-model` "
            "(or HEADSCOPE_ANY_MODEL=1) to load any pretrained timm model from the page",
        )


@router.get("/models", response_model=ModelsResponse, summary="Models this server offers")
async def list_models(registry: RegistryDep, settings: SettingsDep) -> dict:
    """Every model id with its source and, once loaded, layers, heads, patch and input size and
    prefix tokens. The server's configuration decides which models exist, plus, with `any_model`,
    the catalogue models loaded on demand."""
    return {
        "default": registry.default,
        "models": registry.info(),
        "any_model": settings.any_model,
        "max_loaded_models": settings.max_loaded_models,
    }


@router.get(
    "/models/catalog",
    response_model=CatalogResponse,
    summary="Search the pretrained timm and open_clip models this server can load on demand",
    responses=_CATALOG_ERRORS,
)
async def search_catalog(
    registry: RegistryDep,
    settings: SettingsDep,
    q: Annotated[
        str,
        Query(
            max_length=200,
            description="words that must all appear in the name (case-insensitive); empty lists every model",
            examples=["vit_small", "dinov2 reg4", "swin"],
        ),
    ] = "",
    limit: Annotated[Int, Query(ge=1, le=catalog.MAX_LIMIT, description="at most this many names")] = 50,
) -> JSONBody:
    """`timm.list_models(pretrained=True)` cut to the families Headscope captures (vit, deit,
    eva, beit, swin, swinv2) and to weights on the Hugging Face hub: an exact name first, then
    names that start with the query, then the rest by name. With the `clip` extra it also lists
    open_clip's pretrained ViTs (CLIP, SigLIP) as `ARCH/PRETRAINED` (id `open_clip:ARCH/PRETRAINED`,
    family `clip` or `siglip`; the words match the id too, so `open_clip` finds them all); without it
    `note` says why they are absent. 403 `any_model_off` unless the server runs with `--any-model`."""
    _require_any_model(settings)
    total, hits = catalog.search(q, limit)
    cached = await run_in_threadpool(lambda: [cached_weights(e) is not None for e in hits])
    rows = []
    for e, c in zip(hits, cached):
        mid = e.model_id
        rows.append({**e.as_dict(), "offered": mid in registry.ids, "loaded": registry.is_loaded(mid), "cached": c})
    note = None if catalog.open_clip_entries() is not None else catalog.NO_OPEN_CLIP_NOTE
    return JSONBody({"query": q, "total": total, "models": rows, "note": note})


@router.post(
    "/models/catalog/{name:path}/load",
    response_model=LoadStatus,
    status_code=202,
    summary="Load a catalogue model (download, then build), or join its load",
    responses={
        **_CATALOG_ERRORS,
        507: {"model": ErrorBody, "description": "insufficient_storage: the disk lacks room for the download"},
    },
)
async def load_model(name: NameP, loads: ModelLoadsDep, settings: SettingsDep) -> JSONBody:
    """Starts the download of the weights into the server's Hugging Face cache (one at a time)
    and the build; poll `GET` of the same path for the progress. Once `ready`, the model is in
    `GET /api/v1/models` and every endpoint's `model` parameter takes its `id`. 404
    `unknown_model` for a name outside the catalogue; 503 `hub_unreachable` at once when the
    weights are not cached and the hub cannot be reached; 422 `model_too_large` for a model over
    the server's cap (`HEADSCOPE_CATALOG_MAX_PARAMS` parameters, `HEADSCOPE_CATALOG_MAX_BYTES`
    of weights) and 507 `insufficient_storage` when the disk lacks room, both before any
    download."""
    _require_any_model(settings)
    return JSONBody(await loads.start(name), status_code=202)


@router.get(
    "/models/catalog/{name:path}/load",
    response_model=LoadStatus,
    summary="Progress of a catalogue model's load",
    responses=_CATALOG_ERRORS,
)
async def load_progress(name: NameP, loads: ModelLoadsDep, settings: SettingsDep) -> JSONBody:
    """`idle` (never asked for), `queued`, `downloading` (with `bytes_done` / `bytes_total`),
    `loading`, `ready` or `failed` (with the error the API answers for it)."""
    _require_any_model(settings)
    return JSONBody(loads.state(name))
