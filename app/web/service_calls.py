"""How a route calls the service: each call counted in the metrics with its status, and an answer
turned into a response (whole, or streamed)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from fastapi.responses import Response

from ..serving.answers import Answer
from ..serving.metrics import Metrics
from .errors import COUNTED, BodyTooLarge, JSONBody, to_api_error
from .responses import PartsResponse, StreamedResponse

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


def counted_as(endpoint: str) -> Callable[[F], F]:
    """Label a route with the ``endpoint`` its :func:`measured` call counts under, so that a
    request refused before that call (a bad query parameter, a bad image id, a full queue: FastAPI
    and the dependencies answer those) is counted in ``headscope_requests_total`` too (``errors.count_refused``)."""

    def mark(fn: F) -> F:
        fn.metric_endpoint = endpoint  # type: ignore[attr-defined]
        return fn

    return mark


async def measured(metrics: Metrics, call: Awaitable[T], endpoint: str) -> T:
    """Await a service call; count it (``endpoint``, status) and time it. A known error is raised
    as its :class:`~.errors.ApiError`, anything else as it is (a 500)."""
    t0 = time.perf_counter()
    status = 200
    try:
        return await call
    except BodyTooLarge:
        status = 413  # answered by the BodyLimit middleware: let it through
        raise
    except Exception as e:
        mapped = to_api_error(e, retry_after=1)
        status = mapped.status if mapped else 500
        if mapped is None:
            _mark_counted(e)
            raise
        _mark_counted(mapped)
        # A known error's traceback is not needed (its answer is its code and message; a worker's
        # log record has its own), and its frames are where reference cycles hold a failed
        # request's pictures and tensors: the frame that awaited a shared computation holds that
        # computation, whose task holds this error.
        e.__traceback__ = None
        try:
            raise mapped from None
        finally:
            # its traceback holds this frame: kept in a local it would be a reference cycle, and
            # with it the failed call's frames (pictures, tensors) until a full collection
            mapped = None
    finally:
        metrics.requests.labels(endpoint, str(status)).inc()
        metrics.request_seconds.labels(endpoint).observe(time.perf_counter() - t0)


def _mark_counted(exc: BaseException) -> None:
    try:
        setattr(exc, COUNTED, True)
    except AttributeError:  # an exception type without attributes: counted twice, never lost
        pass


def respond(answer: Answer) -> Response:
    """An answer as a response: its parts, or its stream for a large binary answer."""
    if answer.stream is not None:
        return StreamedResponse(answer.stream, answer.length, media_type=answer.media_type, headers=answer.headers)
    return PartsResponse(answer.body, media_type=answer.media_type, headers=answer.headers)


def long_answer(body: dict) -> JSONBody:
    """A long computation's final JSON, or 202 with its progress when ``wait`` ran out first."""
    if "pending" in body:
        return JSONBody(body["pending"], status_code=202, headers={"Retry-After": "1"})
    return JSONBody(body)
