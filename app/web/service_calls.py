"""How a route calls the service: each call counted in the metrics with its status, and an answer
turned into a response (whole, or streamed)."""

from __future__ import annotations

import time
from collections.abc import Awaitable
from typing import TypeVar

from fastapi.responses import Response

from ..serving.answers import Answer
from ..serving.metrics import Metrics
from .errors import BodyTooLarge, JSONBody, to_api_error
from .responses import PartsResponse, StreamedResponse

T = TypeVar("T")


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
            raise
        raise mapped from None
    finally:
        metrics.requests.labels(endpoint, str(status)).inc()
        metrics.request_seconds.labels(endpoint).observe(time.perf_counter() - t0)


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
