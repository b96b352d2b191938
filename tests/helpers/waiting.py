"""Waiting for an event, not for time: a condition polled until it holds or a deadline passes.

A test that sleeps a fixed time and then looks is wrong on a loaded machine (the event has not
happened yet) and slow on a quiet one (it happened long ago). These poll the condition itself and
return as soon as it holds; the deadline is only how long a broken server may keep the test
waiting before it fails, saying what it was waiting for.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

POLL_S = 0.01  # the first interval; it doubles up to MAX_POLL_S
MAX_POLL_S = 0.2


def wait_until(condition: Callable[[], T], timeout: float, what: str) -> T:
    """Poll ``condition()`` until it returns something truthy, and return that.

    Args:
        condition: asked again and again (it may record what it sees, e.g. each progress answer).
        timeout: seconds before giving up (scale it with the ``pace`` fixture in server tests).
        what: the event waited for, in the failure's message.

    Raises:
        AssertionError: ``condition()`` was still falsy after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    interval = POLL_S
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"waited {timeout:.1f} s for {what}; last: {value!r}")
        time.sleep(interval)
        interval = min(2 * interval, MAX_POLL_S)


async def until(condition: Callable[[], T | Awaitable[T]], timeout: float, what: str) -> T:
    """:func:`wait_until` inside an event loop: the loop runs while it waits (``condition`` may
    be a coroutine function)."""
    deadline = time.monotonic() + timeout
    interval = POLL_S / 10
    while True:
        value = condition()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value  # type: ignore[return-value]
        if time.monotonic() >= deadline:
            raise AssertionError(f"waited {timeout:.1f} s for {what}; last: {value!r}")
        await asyncio.sleep(interval)
        interval = min(2 * interval, MAX_POLL_S)


def eventually(check: Callable[[], T], timeout: float, what: str = "the check to pass") -> T:
    """Run ``check`` (which asserts) until it passes, and return what it returns; after
    ``timeout`` seconds its last ``AssertionError`` is raised."""
    failure: list[AssertionError] = []

    def passes() -> tuple[T] | None:
        try:
            return (check(),)
        except AssertionError as e:
            failure[:] = [e]
            return None

    try:
        return wait_until(passes, timeout, what)[0]
    except AssertionError:
        if failure:
            raise failure[0] from None
        raise
