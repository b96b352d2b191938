"""wait_for_result when the client leaves: the awaited work's own failure is never left unread."""

from __future__ import annotations

import asyncio
import gc
import time

import pytest

from headscope.serving.waiting import ClientGone, wait_for_result


def test_a_piece_that_fails_while_its_waiter_sees_the_client_leave_is_not_logged():
    """The race behind "Task exception was never retrieved … ClientGone": a piece of work (a task
    that waits on the worker and watches the client itself) fails with its own ClientGone while
    the request's wait learns that the client has gone; the wait then raises, and
    nobody reads the piece's exception."""
    reported: list[dict] = []

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: reported.append(context))
        noticed, ended = asyncio.Event(), asyncio.Event()

        async def piece() -> None:
            await noticed.wait()
            try:
                raise ClientGone("the client closed the connection before the answer")
            finally:
                ended.set()

        async def client_left() -> None:
            noticed.set()  # the piece notices too, and ends first
            await ended.wait()

        task = asyncio.ensure_future(piece())
        with pytest.raises(ClientGone):
            await wait_for_result(task, None, client_left)
        assert task.done() and not task.cancelled()
        del task
        gc.collect()
        await asyncio.sleep(0)

    asyncio.run(main())
    gc.collect()
    assert not reported, [c.get("message") for c in reported]


def test_a_wait_asks_the_client_once_and_wakes_when_it_leaves():
    """The client is watched, not polled: ``client_left`` is called once per wait, the wait
    ends with ClientGone as soon as it returns, and the work nobody waits for is cancelled."""

    async def main() -> None:
        calls, left = 0, asyncio.Event()

        async def client_left() -> None:
            nonlocal calls
            calls += 1
            await left.wait()

        work = asyncio.ensure_future(asyncio.Event().wait())  # runs until cancelled
        waiting = asyncio.ensure_future(wait_for_result(work, time.monotonic() + 60, client_left))
        await asyncio.sleep(0.3)  # three of the old poll intervals
        assert calls == 1 and not waiting.done()
        left.set()
        with pytest.raises(ClientGone):
            await asyncio.wait_for(waiting, 5)
        await asyncio.sleep(0)
        assert work.cancelled()

    asyncio.run(main())


def test_a_wait_ends_with_its_result_or_its_deadline_and_stops_watching():
    async def main() -> None:
        watches: list[asyncio.Task] = []

        async def client_left() -> None:
            watches.append(asyncio.current_task())
            await asyncio.Event().wait()  # the client stays

        done = asyncio.get_running_loop().create_future()
        done.set_result("maps")
        assert await wait_for_result(done, time.monotonic() + 60, client_left) == "maps"
        never = asyncio.ensure_future(asyncio.Event().wait())
        with pytest.raises(asyncio.TimeoutError):
            await wait_for_result(never, time.monotonic() + 0.05, client_left)
        await asyncio.sleep(0)  # the cancels are delivered
        assert never.cancelled()
        assert watches and all(w.done() for w in watches), "a watch outlived its wait"
        with pytest.raises(asyncio.TimeoutError):  # a deadline already past: no wait, no watch
            await wait_for_result(asyncio.ensure_future(asyncio.sleep(1)), time.monotonic() - 1, client_left)

    asyncio.run(main())
