"""Admission: how many requests may hold the server's resources at once, checked in one place.

A slot is taken before a request's body is read (routes take it through the ``AdmitDep``
dependency), so a burst is refused with 429 before it costs a decode or a forward.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from .metrics import Metrics


class QueueFullError(RuntimeError):
    """Every slot is taken (answered 429 with Retry-After)."""


class Admission:
    """At most ``limit`` requests in progress (decoding, queued, computing or encoding).

    Event-loop only: no lock is needed.

    Args:
        limit: slots.
        metrics: counts refusals.
    """

    def __init__(self, limit: int, metrics: Metrics):
        self.limit = limit
        self.metrics = metrics
        self.in_use = 0

    @property
    def full(self) -> bool:
        return self.in_use >= self.limit

    @contextmanager
    def slot(self) -> Iterator[None]:
        """Hold one slot for the duration, or raise :class:`QueueFullError` at once."""
        if self.full:
            self.metrics.rejections.labels("queue_full").inc()
            raise QueueFullError(f"the server is busy ({self.limit} requests in progress)")
        self.in_use += 1
        try:
            yield
        finally:
            self.in_use -= 1
