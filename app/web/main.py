"""create_app(): the lifespan builds the registry, admission, worker and service; routers and static files."""

from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager

import torch
from fastapi import Depends, FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates

from .. import __version__, paths
from ..config import Settings, get_settings
from ..engine.device import resolve_device
from ..engine.forward import forward_capture
from ..serving.ablation import AblationService
from ..serving.admission import Admission
from ..serving.images import plan_size
from ..serving.malloc import tune_malloc
from ..serving.metrics import Metrics
from ..serving.model_loads import ModelLoads
from ..serving.relevance import RelevanceService
from ..serving.service import AttentionService
from ..serving.worker import Worker
from ..zoo.registry import Registry
from . import errors
from .deps import declared_query_only
from .middleware import AllowedHosts, BodyLimit, HeadAsGet, RequestId, SecurityHeaders, SingleParams

# Room for the multipart framing and the text fields around the file.
FORM_OVERHEAD_BYTES = 64 * 1024

log = logging.getLogger("headscope")


def _load_default(registry: Registry) -> None:
    """Load and warm up the default model (runs on the worker thread)."""
    lm = registry.get()
    h, w = plan_size(*lm.input_size[::-1], lm.input_size, lm.patch_size)
    forward_capture(lm, torch.zeros(1, 3, h, w, device=registry.device))


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()
    paths.check_asset_dirs(settings.static_dir, settings.templates_dir)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        st = app.state
        tune_malloc()
        if settings.threads > 0:
            torch.set_num_threads(settings.threads)
        device = resolve_device(settings.device)
        st.registry = Registry(settings.model_ids, settings.models_dir, device, settings.max_loaded_models)
        st.metrics = Metrics()
        st.admission = Admission.from_settings(settings, st.metrics)
        max_batch, max_wait = settings.batching(device.type)
        st.worker = Worker(
            device,
            settings.precision,
            max_batch,
            max_wait,
            st.admission,
            st.metrics,
            settings.capture_store,
        )
        st.service = AttentionService(settings, st.registry, st.worker, st.metrics, st.admission)
        st.ablation = AblationService(st.service)
        st.relevance = RelevanceService(st.service)
        st.model_loads = ModelLoads(st.registry, st.worker, errors.describe)
        st.worker.on_out_of_memory(st.service.free_device_memory)
        await st.worker.start()

        async def load():
            try:
                await st.worker.run_in_worker(_load_default, st.registry)
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
            await st.model_loads.stop()
            await st.worker.stop(settings.shutdown_grace_s)
            loader.cancel()

    app = FastAPI(
        title="Headscope",
        version=__version__,
        description="What every attention head of a Vision Transformer looks at. Post an image, "
        "get per-layer, per-head softmax attention back as JSON, safetensors or npy.",
        lifespan=lifespan,
        # Every route, also those of routers included later: a query parameter it does not declare is a 422.
        dependencies=[Depends(declared_query_only)],
        docs_url=None,  # /docs and /redoc come from api/docs.py: local bundles, no inline script
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.ready = False
    app.state.shutting_down = False
    app.state.templates = Jinja2Templates(directory=str(settings.templates_dir))  # autoescapes .html
    errors.install(app)

    from .api import ablation, attention, docs, explain, health, models, pages, relevance

    app.include_router(health.router)
    app.include_router(models.router)
    app.include_router(attention.router)
    app.include_router(explain.router)
    app.include_router(ablation.router)
    app.include_router(relevance.router)
    app.include_router(pages.router)
    app.include_router(docs.router)
    app.mount("/static", StaticFiles(directory=str(settings.static_dir)), name="static")
    app.mount(docs.ASSETS_URL, StaticFiles(directory=str(docs.assets_dir())), name="docs-assets")

    if settings.cors_origins:
        # An explicit allow-list only: never "*" with credentials, never a reflected origin.
        app.add_middleware(
            CORSMiddleware,
            allow_origins=[o for o in settings.cors_origins if o != "*"],
            allow_credentials=False,
            allow_methods=["GET", "POST"],
            allow_headers=["*"],
        )
    app.add_middleware(SingleParams)
    app.add_middleware(SecurityHeaders)
    app.add_middleware(BodyLimit, limit=settings.max_upload_bytes + FORM_OVERHEAD_BYTES)
    # Before anything else reads the request: a Host that is not this server's (DNS rebinding) is
    # refused; inside HeadAsGet (a HEAD gets no body) and RequestId (the answer has its id).
    app.add_middleware(AllowedHosts, bind_host=settings.host, allowed=settings.allowed_hosts)
    app.add_middleware(HeadAsGet)
    app.add_middleware(RequestId)  # outermost: BodyLimit's 413 carries the id too
    return app
