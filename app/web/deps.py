"""Dependencies: the heavy objects are built in the lifespan and reached only through these aliases."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import Depends, Request
from fastapi.templating import Jinja2Templates

from ..config import Settings
from ..serving.ablation import AblationService
from ..serving.admission import Admission
from ..serving.metrics import Metrics
from ..serving.service import AttentionService
from ..zoo.registry import Registry


def get_service(request: Request) -> AttentionService:
    return request.app.state.service


def get_ablation(request: Request) -> AblationService:
    return request.app.state.ablation


def get_settings_dep(request: Request) -> Settings:
    return request.app.state.settings


def get_registry(request: Request) -> Registry:
    return request.app.state.registry


def get_metrics(request: Request) -> Metrics:
    return request.app.state.metrics


def get_admission(request: Request) -> Admission:
    return request.app.state.admission


def get_templates(request: Request) -> Jinja2Templates:
    return request.app.state.templates


async def admitted(request: Request) -> AsyncIterator[None]:
    """Hold an admission slot for the request (429 at once when none is free).

    FastAPI resolves this before the route reads the body, so a refused upload costs nothing;
    async, so that it runs on the event loop like everything else that touches admission.
    """
    with request.app.state.admission.slot():
        yield


ServiceDep = Annotated[AttentionService, Depends(get_service)]
AblationDep = Annotated[AblationService, Depends(get_ablation)]
SettingsDep = Annotated[Settings, Depends(get_settings_dep)]
RegistryDep = Annotated[Registry, Depends(get_registry)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]
AdmissionDep = Annotated[Admission, Depends(get_admission)]
TemplatesDep = Annotated[Jinja2Templates, Depends(get_templates)]
AdmitDep = Annotated[None, Depends(admitted)]
