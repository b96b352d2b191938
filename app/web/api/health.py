"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ..deps import MetricsDep, RegistryDep
from ..errors import JSONBody

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="Liveness: answers while the process lives")
async def healthz() -> dict:
    return {"status": "ok"}


@router.get(
    "/readyz",
    summary="Readiness: 200 once the default model is loaded",
    responses={503: {"description": "still loading, failed to load, or shutting down"}},
)
async def readyz(request: Request, registry: RegistryDep):
    st = request.app.state
    if st.shutting_down:
        return JSONBody({"status": "shutting_down"}, status_code=503)
    if st.ready:
        return {"status": "ready", "model": registry.default}
    # "failed" only once start-up has nothing left to try: while another configured model loads
    # after the default failed, an alert keyed on "failed" would fire for a server about to serve.
    body: dict = {"status": "failed" if st.fatal else "loading", "model": registry.default}
    if st.fatal:
        body["reason"] = registry.error(registry.default) or st.fatal
    # each configured model that could not load, with why: refused by `headscope serve`'s check
    # (never tried here) or failed loading
    load_errors = {m: e for m in registry.ids if (e := registry.error(m))}
    if load_errors:
        body["load_errors"] = load_errors
    return JSONBody(body, status_code=503)


@router.get("/metrics", summary="Prometheus metrics", response_class=Response)
async def metrics(metrics: MetricsDep) -> Response:
    return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)
