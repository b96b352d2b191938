"""GET /docs (Swagger UI) and /redoc (ReDoc), rendered offline under the page's CSP.

FastAPI's own pages load their bundles from a CDN and start Swagger UI with an inline script;
``script-src 'self'`` blocks both, and the app must work offline anyway. Here the bundles come
from the ``fastapi-offline`` package (mounted at ``/docs-assets`` by ``create_app``) and Swagger
UI is started by a served file, ``static/js/swagger-init.js``, that reads the spec URL from the page.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from ..deps import TemplatesDep

ASSETS_URL = "/docs-assets"

router = APIRouter(include_in_schema=False)


def assets_dir() -> Path:
    """The folder of Swagger UI's and ReDoc's bundles inside the installed fastapi-offline."""
    import fastapi_offline

    path = Path(fastapi_offline.__file__).parent / "static"
    if not (path / "swagger-ui-bundle.js").is_file():
        raise FileNotFoundError(f"Swagger UI's bundle is missing from fastapi-offline ({path})")
    return path


def _context(request: Request, title: str) -> dict[str, str]:
    root = request.scope.get("root_path", "")
    return {
        "title": f"{request.app.title} - {title}",
        "openapi_url": root + (request.app.openapi_url or "/openapi.json"),
        "assets_url": root + ASSETS_URL,
        "static_url": root + "/static",
    }


@router.get("/docs", response_class=HTMLResponse)
async def swagger_ui(request: Request, templates: TemplatesDep):
    return templates.TemplateResponse(request, "swagger.html", _context(request, "Swagger UI"))


@router.get("/redoc", response_class=HTMLResponse)
async def redoc(request: Request, templates: TemplatesDep):
    return templates.TemplateResponse(request, "redoc.html", _context(request, "ReDoc"))
