"""GET /docs (Swagger UI) and /redoc (ReDoc), rendered offline under the page's CSP.

FastAPI's own pages load their bundles from a CDN and start Swagger UI with an inline script;
``script-src 'self'`` blocks both, and the app must work offline anyway. Here the bundles come
from the ``fastapi-offline`` package (mounted at ``/docs-assets`` by ``create_app``) and Swagger
UI is started by a served file, ``static/js/swagger-init.js``, that reads the spec URL from the page.

ReDoc's side menu always draws Redocly's logo from their CDN (``cdn.redoc.ly``), a request to
another host on every visit that the CSP then blocks with a console error. Its bundle is served
here with that address dropped (an image with no source loads nothing, fails, and ReDoc hides it);
the "API docs by Redocly" link stays.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from ..deps import TemplatesDep
from ..errors import ApiError
from ..responses import cached_file

ASSETS_URL = "/docs-assets"
REDOC_BUNDLE = "redoc.standalone.js"
REDOC_LOGO_URL = "https://cdn.redoc.ly/redoc/logo-mini.svg"

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


@lru_cache(maxsize=1)
def redoc_bundle() -> bytes:
    """ReDoc's bundle without the address of Redocly's logo (see the module docstring)."""
    data = (assets_dir() / REDOC_BUNDLE).read_bytes()
    return data.replace(f'"{REDOC_LOGO_URL}"'.encode(), b'""')


@lru_cache(maxsize=1)
def redoc_etag() -> str:
    return f'"{hashlib.sha256(redoc_bundle()).hexdigest()[:32]}"'


# Registered before the /docs-assets mount (create_app), so this route answers for the file.
@router.get(f"{ASSETS_URL}/{REDOC_BUNDLE}")
async def redoc_js(request: Request) -> Response:
    headers = {"Cache-Control": "public, max-age=86400", "ETag": redoc_etag()}
    return cached_file(request.headers, Response(redoc_bundle(), media_type="text/javascript", headers=headers))


def guide_absent(docs_url: str) -> APIRouter:
    """``/guide/...`` where the checkout has no built documentation site: a 404 that says why and
    where the documentation is (``HEADSCOPE_DOCS_URL``, ``make docs``, the Markdown sources)."""
    where = (
        f"the documentation is at {docs_url} (HEADSCOPE_DOCS_URL)"
        if docs_url
        else "the documentation site is not built here: run `make docs` in the checkout (it is then served "
        "at /guide/), or read docs/*.md"
    )
    guide = APIRouter(include_in_schema=False)

    @guide.get("/guide")
    @guide.get("/guide/{path:path}")
    async def absent(path: str = "") -> Response:
        raise ApiError(404, "not_found", where)

    return guide
