"""create_app(): the lifespan builds the registry, admission, worker and service; routers and static files."""

from __future__ import annotations

import asyncio
import importlib
import logging
from contextlib import asynccontextmanager

import torch
from fastapi import Depends, FastAPI
from fastapi.templating import Jinja2Templates

from .. import __version__, paths
from ..config import Settings, get_settings
from ..engine.device import resolve_device
from ..engine.forward import forward_capture
from ..serving.ablation import AblationService
from ..serving.admission import Admission
from ..serving.malloc import tune_malloc
from ..serving.metrics import Metrics
from ..serving.model_loads import ModelLoads
from ..serving.preprocess import adopt_pixel_limit, plan_size
from ..serving.relevance import RelevanceService
from ..serving.service import AttentionService
from ..serving.worker import Worker
from ..zoo.registry import Registry
from . import errors, openapi
from .deps import declared_query_only
from .middleware import (
    AllowedHosts,
    BodyLimit,
    CatchUnexpected,
    Cors,
    HeadAsGet,
    RequestId,
    SecurityHeaders,
    SingleParams,
    site_csp,
)
from .schemas import TRANSPORT_RESPONSES
from .static_files import Static

GUIDE_URL = "/guide"  # the documentation site, when the checkout has it built (paths.built_docs_dir)
# What a page of an allowed origin may send (DELETE: cancelling a task) and read from an answer.
CORS_METHODS = ["GET", "HEAD", "POST", "DELETE"]
CORS_EXPOSED_HEADERS = [
    "X-Request-ID",
    "X-Headscope-Meta",  # an npy answer's only metadata
    "Content-Disposition",
    "Retry-After",
    "Server-Timing",
]

log = logging.getLogger("headscope")


def _load_default(registry: Registry, model_id: str | None = None) -> None:
    """Load and warm up the default model, or ``model_id`` (runs on the worker thread)."""
    lm = registry.get(model_id)
    h, w = plan_size(*lm.input_size[::-1], lm.input_size, lm.patch_size)
    forward_capture(lm, torch.zeros(1, 3, h, w, device=registry.device))


def _import_model_libraries() -> None:
    """timm, the parts it imports lazily, and torchvision, imported once before the loader thread
    and request threads can import them at the same time: torchvision's circular imports, begun
    by two threads at once, ended in a "partially initialized module" ImportError (a model that
    failed to load, a 500 from GET /api/v1/models)."""
    for name in ("torchvision", "timm", "timm.data", "timm.utils"):
        try:
            importlib.import_module(name)
        except ImportError:  # torchvision is optional: timm works without it
            pass


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()
    paths.check_asset_dirs(static=settings.static_dir, templates=settings.templates_dir)
    refusal = settings.any_model_refusal()
    if refusal:
        raise ValueError(refusal)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        st = app.state
        _import_model_libraries()
        tune_malloc()
        adopt_pixel_limit(settings.max_image_pixels)
        if settings.threads > 0:
            torch.set_num_threads(settings.threads)
        device = resolve_device(settings.device)
        st.registry = Registry(settings.model_ids, settings.models_dir, device, settings.max_loaded_models)
        st.metrics = Metrics()
        writer = getattr(st, "log_writer", None)  # `serve`'s (app/web/log_writer.py)
        if writer is not None:
            writer.on_drop = st.metrics.log_records_dropped.inc
        st.admission = Admission.from_settings(settings, st.metrics, device.type)
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
        image_tasks = (settings, st.service.uploads, st.worker, st.service.cache, st.registry)
        st.ablation = AblationService(*image_tasks)
        st.relevance = RelevanceService(*image_tasks)
        st.model_loads = ModelLoads(
            st.registry, st.worker, errors.describe, settings.catalog_max_params, settings.catalog_max_bytes
        )
        st.worker.on_out_of_memory(st.service.free_device_memory)
        await st.worker.start()

        for raw, (why, permanent) in st.startup_problems.items():  # found by `headscope serve` before this
            if permanent:
                st.registry.refuse(raw, why)
            elif not st.registry.is_default_spec(raw):
                # Tried again when asked for (the hub may answer by then); /api/v1/models says why
                # meanwhile. The default is tried again below, and says its own failure.
                st.registry.fail(raw, why)

        async def load():
            # The default first; if it cannot load, the first other configured model that does is
            # served as the default (the page says which failed and why). None: the server stops
            # (st.fatal: /readyz says "failed" only then).
            failed: dict[str, str] = {}
            for mid in st.registry.start_order():
                try:
                    await st.worker.run_in_worker(_load_default, st.registry, mid)
                except Exception as e:
                    failed[mid] = str(e)
                    st.registry.fail(mid, str(e))
                    log.error("model %s failed to load: %s", mid, e)
                    continue
                if mid != st.registry.default:
                    log.warning("serving %s as the default: %s failed to load", mid, st.registry.default)
                    st.registry.use_default(mid)
                st.ready = True
                log.info("ready: %s on %s in %s", mid, device, st.worker.precision)
                return
            refused = {m: st.registry.error(m) or "" for m in st.registry.ids if m not in failed}
            why = "; ".join(f"{m}: {e}" for m, e in {**refused, **failed}.items())
            st.fatal = f"no model could be loaded ({why})"
            log.error("%s", st.fatal)
            if st.on_fatal is not None:
                st.on_fatal()

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
        responses=TRANSPORT_RESPONSES,  # any request can meet them, whatever its route
    )
    app.state.settings = settings
    app.state.ready = False
    app.state.shutting_down = False
    app.state.startup_problems = {}  # model id -> (why, permanent): `headscope serve` checked them first
    app.state.fatal = None  # why no model could load at start-up
    app.state.on_fatal = None  # called then (`headscope serve` stops the server and exits 1)
    app.state.templates = Jinja2Templates(directory=str(settings.templates_dir))  # autoescapes .html
    errors.install(app)
    openapi.install(app)

    from .api import ablation, attention, docs, explain, health, models, pages, relevance, tasks, zero_shot

    app.include_router(health.router)
    app.include_router(models.router)
    app.include_router(attention.router)
    app.include_router(explain.router)
    app.include_router(ablation.router)
    app.include_router(relevance.router)
    app.include_router(zero_shot.router)
    app.include_router(tasks.router)
    app.include_router(pages.router)
    app.include_router(docs.router)
    app.mount("/static", Static(directory=str(settings.static_dir)), name="static")
    app.mount(docs.ASSETS_URL, Static(directory=str(docs.assets_dir())), name="docs-assets")
    site = None if settings.docs_url else paths.built_docs_dir()
    if site is not None:  # `make docs` built the site: the page's "how to read it" links open it here
        app.mount(GUIDE_URL, Static(directory=str(site), html=True), name="guide")
    else:  # a bare "Not Found" at the address the docs give would say nothing of why
        app.include_router(docs.guide_absent(settings.docs_url))
    app.state.docs_url = settings.docs_url or (GUIDE_URL if site is not None else "")

    # add_middleware wraps what is there: the last added runs first. From the outside in:
    # RequestId (every answer has its id), SecurityHeaders and CORS (on every answer, the refusals
    # below and the 500 included), then the refusals made before routing, then CatchUnexpected.
    app.add_middleware(CatchUnexpected)
    app.add_middleware(SingleParams)
    app.add_middleware(BodyLimit, upload_limit=settings.max_upload_bytes)
    # Before anything else reads the request: a Host that is not this server's (DNS rebinding) is
    # refused; inside HeadAsGet (a HEAD gets no body).
    app.add_middleware(AllowedHosts, bind_host=settings.host, allowed=settings.allowed_hosts)
    app.add_middleware(HeadAsGet)
    if settings.cors_origins:
        # An explicit allow-list only (Settings refuses "*"): never a reflected origin, no credentials.
        app.add_middleware(
            Cors,
            allow_origins=settings.cors_origins,
            allow_credentials=False,
            allow_methods=CORS_METHODS,
            allow_headers=["*"],
            expose_headers=CORS_EXPOSED_HEADERS,
        )
    guide_csp = {GUIDE_URL: site_csp(site)} if site is not None else {}
    app.add_middleware(SecurityHeaders, csp_by_prefix=guide_csp)
    app.add_middleware(RequestId)  # outermost: every answer carries the id
    return app
