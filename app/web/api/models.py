"""GET /api/v1/models."""

from __future__ import annotations

from fastapi import APIRouter

from ..deps import RegistryDep
from ..schemas import ModelsResponse

router = APIRouter(prefix="/api/v1", tags=["models"])


@router.get("/models", response_model=ModelsResponse, summary="Models this server offers")
async def list_models(registry: RegistryDep) -> dict:
    """Every model id with its source and, once loaded, layers, heads, patch and input size and
    prefix tokens. Only the server's configuration decides which models exist."""
    return {"default": registry.default, "models": registry.info()}
