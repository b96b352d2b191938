"""How a request waits: for the worker, a shared computation or a long task, with a deadline,
while watching for its client to leave. One helper, one exception.

Every wait on behalf of a request goes through :func:`wait_for_result`: a request that passes
its deadline gets ``asyncio.TimeoutError`` (504), one whose client has gone gets
:class:`ClientGone` (499, nobody reads it), and either way the awaited future is cancelled, so
that work nobody waits for any more is dropped before it starts, and its outcome is marked seen
(an exception nobody reads is not logged as "never retrieved"). A computation other requests
may still wait for is passed in ``asyncio.shield(...)``: it goes on.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any

Disconnected = Callable[[], Awaitable[bool]]  # Starlette's request.is_disconnected, or the like

POLL_S = 0.1  # how often a waiting request checks whether its client is still there


class ClientGone(Exception):
    """The client went away while its request waited; nothing more is computed for it."""


async def wait_for_result(
    fut: asyncio.Future,
    deadline: float | None = None,
    is_disconnected: Disconnected | None = None,
    what: str = "the answer",
) -> Any:
    """Await ``fut`` until ``deadline`` (``time.monotonic()``; None for none), polling the client.

    Args:
        what: what the client left before, for :class:`ClientGone`'s message.

    Raises:
        asyncio.TimeoutError: the deadline passed first.
        ClientGone: ``is_disconnected()`` said so.
    """
    try:
        while True:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise asyncio.TimeoutError()
            if is_disconnected is None and remaining is None:
                return await asyncio.shield(fut)
            step = POLL_S if is_disconnected is not None else math.inf
            if remaining is not None:
                step = min(step, remaining)
            done, _ = await asyncio.wait({fut}, timeout=step)
            if done:
                return fut.result()
            if is_disconnected is not None and await is_disconnected():
                raise ClientGone(f"the client closed the connection before {what}")
    except BaseException:
        if not fut.done():
            fut.cancel()
        # Whatever ``fut`` ends with now (it may have failed while we looked away, e.g. with its
        # own ClientGone), nobody will read it: mark it seen, or asyncio logs "Task exception
        # was never retrieved" with a traceback.
        fut.add_done_callback(_seen)
        raise


def _seen(fut: asyncio.Future) -> None:
    if not fut.cancelled():
        fut.exception()
