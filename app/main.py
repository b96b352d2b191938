"""create_app(): the lifespan builds the registry and the worker; routers and static files."""
from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager

import torch
from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates

from . import errors
from .config import Settings, get_settings
from .device import resolve_device
from .malloc import tune_malloc
from .metrics import Metrics
from .registry import Registry
from .service import AttentionService
from .worker import Worker

log = logging.getLogger("headscope")

CSP = ("default-src 'self'; img-src 'self' data: blob:; style-src 'self' 'unsafe-inline'; "
       "script-src 'self'; object-src 'none'; base-uri 'self'; frame-ancestors 'none'; form-action 'self'")


class BodyLimit:
    """Refuse request bodies over ``limit`` bytes with 413, checked while they are read.

    A declared Content-Length over the limit is refused before a byte is read; a chunked body is
    counted as it streams and cut off at the limit.
    """

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            return await self._refuse(send)
        seen = 0
        started = False

        async def counted_receive():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise _TooLarge()
            return message

        async def tracking_send(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counted_receive, tracking_send)
        except _TooLarge:
            if not started:
                await self._refuse(send)

    async def _refuse(self, send):
        resp = errors.error_response(413, "upload_too_large", f"request body over the {self.limit:,}-byte limit")
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"connection", b"close"),
                                (b"content-length", str(len(resp.body)).encode())]})
        await send({"type": "http.response.body", "body": resp.body})


class _TooLarge(Exception):
    pass


class SecurityHeaders:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def with_headers(message):
            if message["type"] == "http.response.start":
                h = list(message.get("headers", []))
                h.append((b"x-content-type-options", b"nosniff"))
                h.append((b"referrer-policy", b"no-referrer"))
                if any(k == b"content-type" and v.startswith(b"text/html") for k, v in h):
                    h.append((b"content-security-policy", CSP.encode()))
                    h.append((b"x-frame-options", b"DENY"))
                message["headers"] = h
            await send(message)

        await self.app(scope, receive, with_headers)


def _load_default(app: FastAPI) -> None:
    """Load and warm up the default model (runs on the worker thread)."""
    st = app.state
    lm = st.registry.get()
    from .images import plan_size

    h, w = plan_size(*lm.input_size[::-1], lm.input_size, lm.patch_size)
    with torch.inference_mode(), lm.capture.capturing():
        lm.model.forward_features(torch.zeros(1, 3, h, w, device=st.registry.device))
    lm.capture.results()


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        st = app.state
        tune_malloc()
        if settings.threads > 0:
            torch.set_num_threads(settings.threads)
        device = resolve_device(settings.device)
        st.registry = Registry([settings.model, *settings.extra_models], settings.models_dir, device)
        st.worker = Worker(device, settings.precision, settings.max_batch_size, settings.max_wait_ms,
                           settings.max_queue, Metrics(), settings.capture_store)
        st.service = AttentionService(settings, st.registry, st.worker)
        await st.worker.start()

        async def load():
            try:
                await st.worker.run_in_worker(_load_default, app)
                st.ready = True
                log.info("ready: %s on %s", settings.model, device)
            except Exception as e:
                log.error("default model %s failed to load: %s", settings.model, e)

        loader = asyncio.create_task(load())
        try:
            yield
        finally:
            st.shutting_down = True
            st.ready = False
            await st.worker.stop(settings.shutdown_grace_s)
            loader.cancel()

    app = FastAPI(
        title="Headscope",
        version="0.1.0",
        description="What every attention head of a Vision Transformer looks at. Post an image, "
                    "get per-layer, per-head softmax attention back as JSON, safetensors or npy.",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.ready = False
    app.state.shutting_down = False
    app.state.templates = Jinja2Templates(directory=str(settings.templates_dir))  # autoescapes .html
    errors.install(app)

    from .api import attention, health, models, pages

    app.include_router(health.router)
    app.include_router(models.router)
    app.include_router(attention.router)
    app.include_router(pages.router)
    app.mount("/static", StaticFiles(directory=str(settings.static_dir)), name="static")

    if settings.cors_origins:
        # An explicit allow-list only: never "*" with credentials, never a reflected origin.
        app.add_middleware(CORSMiddleware, allow_origins=[o for o in settings.cors_origins if o != "*"],
                           allow_credentials=False, allow_methods=["GET", "POST"], allow_headers=["*"])
    app.add_middleware(SecurityHeaders)
    app.add_middleware(BodyLimit, limit=settings.max_upload_bytes + 64 * 1024)
    return app
