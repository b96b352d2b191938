"""ClientWatch: one listener per request, started only once the body has been read."""

from __future__ import annotations

import asyncio

import pytest
from starlette.requests import ClientDisconnect, Request

from headscope.web.disconnects import client_watch


def request(method: str, messages: asyncio.Queue) -> tuple[Request, list[dict]]:
    """A request whose ``receive`` hands out ``messages`` in order, and the list of those taken."""
    taken: list[dict] = []

    async def receive() -> dict:
        message = await messages.get()
        taken.append(message)
        return message

    scope = {"type": "http", "method": method, "path": "/", "headers": [], "query_string": b""}
    return Request(scope, receive), taken


def test_a_get_s_watch_takes_its_empty_body_then_returns_when_the_client_leaves():
    async def main() -> None:
        messages: asyncio.Queue = asyncio.Queue()
        messages.put_nowait({"type": "http.request", "body": b"", "more_body": False})
        req, taken = request("GET", messages)
        watch = client_watch(req)
        assert client_watch(Request(req.scope, req.receive)) is watch, "one watch per request"
        waits = [asyncio.ensure_future(watch()) for _ in range(3)]
        await asyncio.sleep(0.05)
        assert not any(w.done() for w in waits) and not watch.gone
        assert len(taken) == 1, "one listener for every wait"
        messages.put_nowait({"type": "http.disconnect"})
        await asyncio.wait_for(asyncio.gather(*waits), 5)
        assert watch.gone and len(taken) == 2

    asyncio.run(main())


def test_a_post_s_watch_leaves_the_body_alone_until_it_has_been_read():
    async def main() -> None:
        messages: asyncio.Queue = asyncio.Queue()
        for chunk, more in ((b"ab", True), (b"cd", False)):
            messages.put_nowait({"type": "http.request", "body": chunk, "more_body": more})
        req, taken = request("POST", messages)
        watch = client_watch(req)
        wait = asyncio.ensure_future(watch())
        await asyncio.sleep(0.05)
        assert taken == [], "the watch took a piece of the body"
        assert await req.body() == b"abcd"
        messages.put_nowait({"type": "http.disconnect"})
        await asyncio.wait_for(wait, 5)  # it found the body read and listened
        assert watch.gone

    asyncio.run(main())


@pytest.mark.parametrize("failure", ["disconnect while reading", "receive fails"])
def test_a_client_already_gone_or_a_broken_connection_counts_as_gone(failure):
    async def main() -> None:
        messages: asyncio.Queue = asyncio.Queue()
        if failure == "disconnect while reading":
            messages.put_nowait({"type": "http.disconnect"})
            req, _ = request("POST", messages)
            with pytest.raises(ClientDisconnect):
                await req.body()
        else:

            async def broken() -> dict:
                raise RuntimeError("the connection is gone")

            req = Request({"type": "http", "method": "GET", "path": "/", "headers": []}, broken)
        await asyncio.wait_for(client_watch(req)(), 5)
        assert client_watch(req).gone

    asyncio.run(main())
