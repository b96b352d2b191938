"""GET / (the page) and the vendored Plotly bundle, served from the installed plotly package."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, HTMLResponse, Response

from ...engine.capture_base import SUPPORTED_FAMILIES
from ..deps import RegistryDep, SettingsDep, TemplatesDep
from ..responses import cached_file
from ..static_files import drop_unreadable_range

router = APIRouter(include_in_schema=False)

VENDOR_MAX_AGE_S = 24 * 3600  # the Plotly bundle changes only with the installed plotly package


@lru_cache
def plotly_js() -> Path:
    import plotly

    path = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    if not path.is_file():
        raise FileNotFoundError("plotly.min.js is missing from the installed plotly package")
    return path


@router.get("/", response_class=HTMLResponse)
async def index(request: Request, templates: TemplatesDep, registry: RegistryDep, settings: SettingsDep):
    return templates.TemplateResponse(
        request,
        "index.html",
        {
            "default_model": registry.default,
            "max_upload_bytes": settings.max_upload_bytes,
            "docs_url": request.app.state.docs_url,
            "supported_families": SUPPORTED_FAMILIES,  # the one list (engine/capture_base.py)
        },
    )


@router.get("/vendor/plotly.min.js")
async def plotly_bundle(request: Request) -> Response:
    path = plotly_js()
    drop_unreadable_range(request.scope)  # as the static mounts do
    file = FileResponse(
        path,
        media_type="text/javascript",
        headers={"Cache-Control": f"public, max-age={VENDOR_MAX_AGE_S}"},
        stat_result=path.stat(),  # the ETag is set now, for the check below
    )
    return cached_file(request.headers, file)
