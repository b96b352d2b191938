"""wait_for_result when the client leaves: the awaited work's own failure is never left unread."""

from __future__ import annotations

import asyncio
import gc

import pytest

from headscope.serving.waiting import ClientGone, wait_for_result


def test_a_piece_that_fails_while_its_waiter_sees_the_client_leave_is_not_logged():
    """The race behind "Task exception was never retrieved … ClientGone": a piece of work (a task
    that waits on the worker and watches the client itself) fails with its own ClientGone while
    the request's wait is asking whether the client is still there; the wait then raises, and
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

        async def is_disconnected() -> bool:
            noticed.set()  # the piece notices too, and ends first
            await ended.wait()
            return True

        task = asyncio.ensure_future(piece())
        with pytest.raises(ClientGone):
            await wait_for_result(task, None, is_disconnected)
        assert task.done() and not task.cancelled()
        del task
        gc.collect()
        await asyncio.sleep(0)

    asyncio.run(main())
    gc.collect()
    assert not reported, [c.get("message") for c in reported]
