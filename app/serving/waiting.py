"""How a request waits: for the worker, a shared computation or a long task, with a deadline,
while watching for its client to leave. One helper, one exception.

Every wait on behalf of a request goes through :func:`wait_for_result`: a request that passes
its deadline gets ``asyncio.TimeoutError`` (504), one whose client has gone gets
:class:`ClientGone` (499, nobody reads it), and either way the awaited future is cancelled, so
that work nobody waits for any more is dropped before it starts, and its outcome is marked seen
(an exception nobody reads is not logged as "never retrieved"). A computation other requests
may still wait for is passed in ``asyncio.shield(...)``: it goes on.

The client is watched, not polled: ``client_left()`` returns when the client has gone (the web
layer's ``ClientWatch`` listens to the connection once per request), so a waiting request costs
the event loop nothing until its result, its deadline or its client's leaving wakes it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

Disconnected = Callable[[], Awaitable[object]]  # returns once the request's client has gone


class ClientGone(Exception):
    """The client went away while its request waited; nothing more is computed for it."""


async def wait_for_result(
    fut: asyncio.Future,
    deadline: float | None = None,
    client_left: Disconnected | None = None,
    what: str = "the answer",
) -> Any:
    """Await ``fut`` until ``deadline`` (``time.monotonic()``; None for none), or until the
    client leaves.

    Args:
        client_left: returns when the request's client has gone (None: not watched).
        what: what the client left before, for :class:`ClientGone`'s message.

    Raises:
        asyncio.TimeoutError: the deadline passed first.
        ClientGone: ``client_left()`` returned first.
    """
    left: asyncio.Future | None = None
    try:
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            raise asyncio.TimeoutError()
        if client_left is None and remaining is None:
            return await asyncio.shield(fut)
        waits = {fut}
        if client_left is not None:
            left = asyncio.ensure_future(client_left())
            waits.add(left)
        done, _ = await asyncio.wait(waits, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
        if fut in done:
            return fut.result()
        if left is not None and left in done:
            raise ClientGone(f"the client closed the connection before {what}")
        raise asyncio.TimeoutError()
    except BaseException:
        if not fut.done():
            fut.cancel()
        # Whatever ``fut`` ends with now (it may have failed while we looked away, e.g. with its
        # own ClientGone), nobody will read it: mark it seen, or asyncio logs "Task exception
        # was never retrieved" with a traceback.
        fut.add_done_callback(_seen)
        raise
    finally:
        if left is not None:
            if not left.done():
                left.cancel()
            left.add_done_callback(_seen)


def _seen(fut: asyncio.Future) -> None:
    if not fut.cancelled():
        fut.exception()
