"""Dependencies: the heavy objects are built in the lifespan and reached only through these aliases;
:func:`declared_query_only`, which every route of the API gets from ``create_app``.

Every dependency is ``async def``: FastAPI runs a plain ``def`` dependency in the thread pool,
and the hop (anyio's worker thread, its capacity limiter, two wake-ups of the event loop) cost
more of the event loop than reading an attribute of ``app.state``, three times a request.
"""

from __future__ import annotations

import difflib
import types
from collections.abc import AsyncIterator, Iterable
from typing import Annotated, Any, Union, get_args, get_origin

from fastapi import Depends, Path, Request
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from fastapi.templating import Jinja2Templates
from pydantic import BaseModel

from ..config import Settings
from ..serving.ablation import AblationService
from ..serving.admission import FOLLOW_UP, HEAVY, UPLOAD, Admission, Ticket
from ..serving.metrics import Metrics
from ..serving.model_loads import ModelLoads
from ..serving.relevance import RelevanceService
from ..serving.service import AttentionService
from ..serving.uploads import is_image_id
from ..zoo.registry import Registry
from .disconnects import client_watch
from .errors import ApiError


async def get_service(request: Request) -> AttentionService:
    return request.app.state.service


async def get_ablation(request: Request) -> AblationService:
    return request.app.state.ablation


async def get_relevance(request: Request) -> RelevanceService:
    return request.app.state.relevance


async def get_settings_dep(request: Request) -> Settings:
    return request.app.state.settings


async def get_registry(request: Request) -> Registry:
    return request.app.state.registry


async def get_model_loads(request: Request) -> ModelLoads:
    return request.app.state.model_loads


async def get_metrics(request: Request) -> Metrics:
    return request.app.state.metrics


async def get_admission(request: Request) -> Admission:
    return request.app.state.admission


async def get_templates(request: Request) -> Jinja2Templates:
    return request.app.state.templates


async def image_id_path(
    image_id: Annotated[
        str,
        Path(
            description="the image_id of an earlier POST /api/v1/attention answer (a hex content hash, 8-64 "
            "characters)",
            examples=["3f2c9a0b4e5d6c7f8a9b0c1d"],
        ),
    ],
) -> str:
    """The ``{image_id}`` of a route's path, once it can be one (422 ``invalid_image_id`` else);
    async, so that it runs on the event loop, not in the thread pool. Described, not constrained
    in the schema: a malformed id gets this 422, not a generic validation error."""
    if not is_image_id(image_id):
        raise ApiError(
            422, "invalid_image_id", "image ids are lower-case hexadecimal content hashes, 8 to 64 digits long"
        )
    return image_id


def _param_model(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model of a parameter declared as one (``Annotated[Model, Query()]``), else None."""
    if get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        annotation = args[0] if len(args) == 1 else None
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def _query_names(dependant: Dependant) -> set[str]:
    """The query parameters ``dependant`` and its sub-dependencies declare, by the name a client
    sends (a parameter model's fields by their alias)."""
    names: set[str] = set()
    for field in dependant.query_params:
        model = _param_model(field.field_info.annotation)
        if model is None:
            names.add(field.alias)
        else:
            names.update(info.alias or name for name, info in model.model_fields.items())
    for sub in dependant.dependencies:
        names |= _query_names(sub)
    return names


# id(route) -> (route, its names); the route is kept so that its id is never reused meanwhile.
_DECLARED: dict[int, tuple[APIRoute, frozenset[str]]] = {}


def declared_query(route: APIRoute) -> frozenset[str]:
    """The query parameters ``route`` takes (its OpenAPI parameters ``in: query``), worked out once."""
    known = _DECLARED.get(id(route))
    if known is None or known[0] is not route:
        known = _DECLARED[id(route)] = (route, frozenset(_query_names(route.dependant)))
    return known[1]


MAX_NAMES_SHOWN = 200  # characters of the unknown names echoed back


def meant(unknown: Iterable[str], allowed: Iterable[str]) -> str:
    """``" (did you mean 'layers'?)"`` for the unknown names one letter or so from an allowed one
    (difflib's ratio of at least 0.75, the closest), else ``""``: ``layer=`` for ``layers=`` is the
    commonest slip, and a list of fourteen names does not point at it."""
    pool = sorted(allowed)
    guesses = dict.fromkeys(
        m[0] for name in unknown if (m := difflib.get_close_matches(name[:40].lower(), pool, n=1, cutoff=0.75))
    )
    return f" (did you mean {', '.join(map(repr, guesses))}?)" if guesses else ""


async def declared_query_only(request: Request) -> None:
    """Refuse a query parameter the route does not declare (422 ``invalid_parameter``).

    Installed for every route by ``create_app`` (``FastAPI(dependencies=...)``), ahead of the
    route's own dependencies (admission included): a route in the API schema takes exactly the
    query parameters it declares, whether as function parameters, through a dependency, or as a
    pydantic model (``Annotated[Model, Query()]``). Anything else (``x=1``, or ``ablate`` sent to
    an endpoint that takes none) would otherwise be ignored in silence. Routes left out of the
    schema (the page, whose query string is for its script) are not checked.
    """
    route = request.scope.get("route")
    if not isinstance(route, APIRoute) or not route.include_in_schema:
        return
    allowed = declared_query(route)
    unknown = [name for name in dict.fromkeys(request.query_params.keys()) if name not in allowed]
    if not unknown:
        return
    shown = ", ".join(repr(name[:40]) for name in unknown)[:MAX_NAMES_SHOWN]
    takes = f"it takes {', '.join(sorted(allowed))}" if allowed else "it takes no query parameters"
    raise ApiError(
        422,
        "invalid_parameter",
        f"unknown query parameter(s) {shown}{meant(unknown, allowed)} for {route.path}; {takes}",
    )


def _admit(cls: str):
    async def admitted(request: Request) -> AsyncIterator[Ticket]:
        """Hold a slot of this class's pool for the request (429 at once when none is free).

        FastAPI resolves this before the route reads the body, so a refused upload costs
        nothing, and exits it after the answer has been sent; async, so that it runs on the
        event loop like everything else that touches admission. The ticket is current for the
        request: its worker calls get the class's priority and the request's deadline.
        """
        st = request.app.state
        fault = request.headers.get("x-headscope-fault") if st.settings.enable_fault_injection else None
        client = request.client.host if request.client else None  # a trusted proxy's X-Forwarded-For (uvicorn)
        with st.admission.admit(cls, client_watch(request), fault, client) as ticket:
            yield ticket

    admitted.__name__ = f"admit_{cls}"
    return admitted


ServiceDep = Annotated[AttentionService, Depends(get_service)]
AblationDep = Annotated[AblationService, Depends(get_ablation)]
RelevanceDep = Annotated[RelevanceService, Depends(get_relevance)]
SettingsDep = Annotated[Settings, Depends(get_settings_dep)]
RegistryDep = Annotated[Registry, Depends(get_registry)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]
ModelLoadsDep = Annotated[ModelLoads, Depends(get_model_loads)]
AdmissionDep = Annotated[Admission, Depends(get_admission)]
ImageIdDep = Annotated[str, Depends(image_id_path)]  # every route about an uploaded image
TemplatesDep = Annotated[Jinja2Templates, Depends(get_templates)]
# Every route that takes worker time or decodes declares its class (admission.py):
AdmitUpload = Annotated[Ticket, Depends(_admit(UPLOAD))]  # a new picture: decode + forward
AdmitFollowUp = Annotated[Ticket, Depends(_admit(FOLLOW_UP))]  # about a picture already sent
AdmitHeavy = Annotated[Ticket, Depends(_admit(HEAVY))]  # seconds of worker time (ablation, relevance)
# The one admission dependency there was before the classes: the follow-up class, which fits
# the GET routes written against it.
AdmitDep = AdmitFollowUp
