"""Dependencies: the heavy objects live on app.state (built in the lifespan)."""
from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from ..config import Settings
from ..registry import Registry
from ..service import AttentionService
from ..worker import Worker


def get_service(request: Request) -> AttentionService:
    return request.app.state.service


def get_settings_dep(request: Request) -> Settings:
    return request.app.state.settings


def get_registry(request: Request) -> Registry:
    return request.app.state.registry


def get_worker(request: Request) -> Worker:
    return request.app.state.worker


ServiceDep = Annotated[AttentionService, Depends(get_service)]
SettingsDep = Annotated[Settings, Depends(get_settings_dep)]
RegistryDep = Annotated[Registry, Depends(get_registry)]
WorkerDep = Annotated[Worker, Depends(get_worker)]
