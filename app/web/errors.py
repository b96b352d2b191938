"""One error body everywhere: ``{"error": {"code", "message", "request_id"}}``.

Every exception that can reach a client is mapped here to a status and a short code; anything
unexpected becomes a 500 with a request id and no traceback (the log has the details). Every
error answer is logged on one line with its request id (the one ``middleware.RequestId`` gave
the request, also sent back as ``X-Request-ID``): 4xx at INFO, 5xx at WARNING.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.routing import Match, Mount
from starlette.types import Scope

from ..engine.capture_base import CaptureError, UnsupportedModelError
from ..engine.selection import SelectionError
from ..serving.admission import QueueFullError, TooLargeToDecode
from ..serving.answers import AnswerTooLarge, StreamAborted
from ..serving.faults import InjectedFault
from ..serving.params import validation_message
from ..serving.preprocess import ImageError
from ..serving.uploads import ImageNotFound
from ..serving.waiting import ClientGone
from ..serving.worker import OutOfMemory
from ..zoo.errors import (
    HubUnreachableError,
    ModelLoadError,
    ModelRefusedError,
    ModelTooLargeError,
    UnknownModelError,
)

log = logging.getLogger(__name__)


class JSONBody(Response):
    """JSON rendered by orjson (FastAPI's ORJSONResponse is deprecated)."""

    media_type = "application/json"

    def render(self, content) -> bytes:
        return orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY)


class ApiError(Exception):
    """An error with its HTTP status and code, raised by routes."""

    def __init__(self, status: int, code: str, message: str, headers: dict | None = None):
        super().__init__(message)
        self.status, self.code, self.message, self.headers = status, code, message, headers


def new_request_id() -> str:
    return uuid.uuid4().hex[:12]


def error_response(
    status: int, code: str, message: str, headers: dict | None = None, request_id: str | None = None
) -> JSONBody:
    body = {"error": {"code": code, "message": message, "request_id": request_id or new_request_id()}}
    return JSONBody(body, status_code=status, headers=headers)


def logged_error_response(scope: Scope, status: int, code: str, message: str, headers: dict | None = None) -> JSONBody:
    """The error answer for the request in ``scope``, logged on one line with its request id."""
    rid = scope.get("state", {}).get("request_id") or new_request_id()
    level = logging.WARNING if status >= 500 else logging.INFO
    path, text = _one_line(str(scope.get("path"))), _one_line(message)  # both may echo client input
    log.log(level, "%s %s -> %d %s: %s [request_id=%s]", scope.get("method"), path, status, code, text, rid)
    return error_response(status, code, message, headers, request_id=rid)


# Set on an exception that service_calls.measured() has counted in headscope_requests_total.
COUNTED = "_headscope_counted"
# The scope's state key of the time.perf_counter() a request reached the app at (middleware
# RequestId notes it beside the id): a refusal made before the route's service call is timed
# from then (count_refused).
STARTED = "started"


def count_refused(request: Request, exc: BaseException, status: int) -> None:
    """Count and time an error answer that ``measured()`` did not: one raised before the route's
    service call (FastAPI's parameter check, a dependency: a bad image id, a full queue), on a
    route labelled with ``service_calls.counted_as``."""
    endpoint = getattr(request.scope.get("endpoint"), "metric_endpoint", None)
    if endpoint is not None and not getattr(exc, COUNTED, False):
        metrics = request.app.state.metrics
        metrics.requests.labels(endpoint, str(status)).inc()
        # Observed even where the clock did not run: the histogram's _count must equal the
        # counter's total (an error rate divides one by the other).
        started = request.scope.get("state", {}).get(STARTED)
        metrics.request_seconds.labels(endpoint).observe(0.0 if started is None else time.perf_counter() - started)


def _one_line(text: str) -> str:
    return "".join(ch if ch.isprintable() else " " for ch in text)


class BodyTooLarge(Exception):
    """A request body past the limit, raised from ``receive()`` by the ``BodyLimit`` middleware,
    which answers it (413 with its limit) when it comes back out of the route."""


def to_api_error(exc: BaseException, retry_after: int = 1) -> ApiError | None:
    """Map a known exception to an :class:`ApiError`; None for unexpected ones."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, ImageError):
        return ApiError(exc.status, exc.code, str(exc))
    if isinstance(exc, SelectionError):
        return ApiError(422, exc.code, str(exc))
    if isinstance(exc, ImageNotFound):
        return ApiError(404, "image_not_found", str(exc))
    if isinstance(exc, ModelRefusedError):
        return ApiError(422, "model_refused", str(exc))
    if isinstance(exc, UnknownModelError):
        return ApiError(404, "unknown_model", str(exc))
    if isinstance(exc, UnsupportedModelError):
        return ApiError(422, "unsupported_model", str(exc))
    if isinstance(exc, ModelTooLargeError):  # 507 where the disk lacks room, else 422
        return ApiError(507 if exc.code == "insufficient_storage" else 422, exc.code, str(exc))
    if isinstance(exc, HubUnreachableError):
        return ApiError(503, "hub_unreachable", str(exc))
    if isinstance(exc, ModelLoadError):
        return ApiError(503, "model_unavailable", str(exc))
    if isinstance(exc, QueueFullError):
        return ApiError(429, "busy", str(exc), {"Retry-After": str(retry_after)})
    if isinstance(exc, TooLargeToDecode):
        return ApiError(413, "image_too_large", str(exc))
    if isinstance(exc, AnswerTooLarge):
        return ApiError(413, "answer_too_large", str(exc))
    if isinstance(exc, OutOfMemory):
        return ApiError(503, "out_of_memory", str(exc), {"Retry-After": str(retry_after)})
    if isinstance(exc, asyncio.TimeoutError):
        return ApiError(504, "timeout", "the request did not finish before its deadline")
    if isinstance(exc, (ClientGone, ClientDisconnect)):  # nginx's 499: nobody reads it; the log stays quiet
        return ApiError(499, "client_closed_request", str(exc) or "the client closed the connection")
    if isinstance(exc, (CaptureError, InjectedFault)):
        return ApiError(500, "compute_failed", f"computing attention failed ({type(exc).__name__})")
    return None


def describe(exc: Exception) -> tuple[str, str]:
    """The code and message the API answers for ``exc`` (``internal`` for an unexpected one)."""
    mapped = to_api_error(exc)
    return (mapped.code, mapped.message) if mapped else ("internal", f"unexpected {type(exc).__name__}")


# Raised by the engine, the service or a dependency; each has its own handler so that it is
# answered by Starlette's ExceptionMiddleware. Anything else is answered by the CatchUnexpected
# middleware (middleware.py) with unexpected_response().
KNOWN_ERRORS: tuple[type[Exception], ...] = (
    ImageError,
    ImageNotFound,
    SelectionError,
    ModelRefusedError,
    UnknownModelError,
    UnsupportedModelError,
    ModelLoadError,
    ModelTooLargeError,
    QueueFullError,
    OutOfMemory,
    asyncio.TimeoutError,
    ClientGone,
    ClientDisconnect,
    CaptureError,
    InjectedFault,
    TooLargeToDecode,
    AnswerTooLarge,
)


class QuietAborts(logging.Filter):
    """Drop the server's traceback for a streamed answer cut short on purpose (``StreamAborted``:
    one warning line says so already); uvicorn closes the connection either way."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, StreamAborted)


def install(app: FastAPI) -> None:
    async def _known(request: Request, exc: Exception):
        mapped = to_api_error(exc)
        assert mapped is not None
        count_refused(request, exc, mapped.status)
        return logged_error_response(request.scope, mapped.status, mapped.code, mapped.message, mapped.headers)

    kinds: tuple[type[Exception], ...] = (ApiError, *KNOWN_ERRORS)
    for kind in kinds:
        app.add_exception_handler(kind, _known)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        # The code the upload form's own check gives (api/attention.py): one code for a bad
        # parameter, whichever the method and wherever it is read.
        count_refused(request, exc, 422)
        return logged_error_response(request.scope, 422, "invalid_parameter", validation_message(exc.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        code = {
            404: "not_found",
            405: "method_not_allowed",
            400: "bad_request",
            413: "too_large",
            408: "request_timeout",
            431: "headers_too_large",
        }.get(exc.status_code, "http_error")
        headers = getattr(exc, "headers", None)
        if exc.status_code == 405:
            # Starlette names only the methods of the first route with this path.
            headers = {**(headers or {}), "Allow": ", ".join(allowed_methods(request))}
        return logged_error_response(request.scope, exc.status_code, code, str(exc.detail), headers)

    server_log = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, QuietAborts) for f in server_log.filters):
        server_log.addFilter(QuietAborts())

    # Reached only by an error raised outside the middleware stack's CatchUnexpected (which
    # answers the rest inside it, where the ids and headers are added): a last resort.
    app.add_exception_handler(Exception, unexpected_response)


_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")


def allowed_methods(request: Request) -> list[str]:
    """Every method some route answers at the request's path, HEAD wherever GET is
    (middleware.HeadAsGet): each method is matched against the routes as a request of it would
    be (a mount is static files, which answer GET and HEAD)."""
    methods: set[str] = set()
    # From the app's root: inside a mount (static files) the scope's root_path is the mount's.
    root = request.scope.get("app_root_path", request.scope.get("root_path", ""))
    for method in _METHODS:
        scope = {**request.scope, "root_path": root, "method": method}
        for route in request.app.routes:
            match, _ = route.matches(scope)
            if match == Match.FULL:
                methods.add("GET" if isinstance(route, Mount) else method)
                break
    if "GET" in methods:
        methods.add("HEAD")
    return sorted(methods)


async def unexpected_response(request: Request, exc: Exception) -> Response:
    """The answer to an exception no handler knows: 500 ``internal`` with the request's id, and
    the traceback in the server's log under that id."""
    if isinstance(exc, StreamAborted):  # the answer had started (counted as it): nothing more to send or log
        return error_response(500, "internal", "answer cut short")
    mapped = to_api_error(exc)
    count_refused(request, exc, mapped.status if mapped is not None else 500)
    if mapped is not None:
        return logged_error_response(request.scope, mapped.status, mapped.code, mapped.message, mapped.headers)
    rid = getattr(request.state, "request_id", None) or new_request_id()
    log.error("unhandled error %s on %s %s", rid, request.method, request.url.path, exc_info=exc)
    return error_response(500, "internal", "internal error; the server log has details", request_id=rid)
