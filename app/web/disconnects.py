"""Whether a request's client is still there: one listener per request, not a question per poll.

A request that waits (for the worker, a shared computation, a long task) stops waiting when its
client leaves, so that work nobody will read is dropped (``serving.waiting``). It used to ask
Starlette's ``Request.is_disconnected`` every 0.1 s, and that answers by opening an anyio
cancel scope and cancelling it; anyio's ``cancel`` formats the current task's repr (its whole
coroutine chain through the middleware) into a message nobody reads: about 0.35 ms of the
event loop a question on the 2-core development machine, a third of the event loop's busy time
under 16 concurrent uploads (py-spy). :class:`ClientWatch` asks the connection once instead: a
task awaits the request's next ASGI message, which uvicorn sends as ``http.disconnect`` when the
client leaves (or once the answer has been sent, which Starlette's check reports the same way),
and every wait on the request awaits that.
"""

from __future__ import annotations

import asyncio

from starlette.requests import Request

_SCOPE_KEY = "headscope.client_watch"
BODY_POLL_S = 0.1  # a wait that starts before the body has been read looks again this often


class ClientWatch:
    """The client of one request, watched once its body has been read.

    ``await watch()`` returns when the client has gone: the ``client_left`` of the serving
    layer's waits. One listener serves every wait of the request.

    Args:
        request: the request. Its body must be read before the watch listens (listening
            earlier would take a piece of the body); a wait that starts earlier (none does
            today) looks for the body's end every ``BODY_POLL_S``.
    """

    def __init__(self, request: Request):
        self.request = request
        self._gone = asyncio.Event()
        self._listener: asyncio.Task | None = None

    @property
    def gone(self) -> bool:
        return self._gone.is_set()

    async def __call__(self) -> None:
        while self._listener is None and not self.gone:
            if getattr(self.request, "_is_disconnected", False):  # seen while reading the body
                self._gone.set()
            elif _body_read(self.request):
                self._listener = asyncio.ensure_future(self._listen())
            else:
                await asyncio.sleep(BODY_POLL_S)
        await self._gone.wait()

    async def _listen(self) -> None:
        try:
            while True:
                # A GET's first message is its empty body; after it, and after a POST's body,
                # the next message comes only when the client leaves or the answer is complete.
                message = await self.request.receive()
                if message["type"] == "http.disconnect":
                    break
        except Exception:  # the connection is unusable: nobody can read an answer either
            pass
        finally:
            self._gone.set()


def _body_read(request: Request) -> bool:
    return request.method in ("GET", "HEAD") or getattr(request, "_stream_consumed", False)


def client_watch(request: Request) -> ClientWatch:
    """The request's one :class:`ClientWatch` (kept in its ASGI scope). The admission dependency
    gives it to the request's ticket, and every wait of the serving layer reads it from there
    (``serving.admission.current_client_left``)."""
    watch = request.scope.get(_SCOPE_KEY)
    if watch is None:
        watch = request.scope[_SCOPE_KEY] = ClientWatch(request)
    return watch
