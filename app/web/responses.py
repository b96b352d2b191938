"""Responses whose body is sent as several buffers (a header, then the tensor bytes), whole or
streamed."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence

from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from ..serving.encoders import BodyPart

# Set in the scope by middleware.HeadAsGet when a HEAD request is answered as a GET.
HEAD_KEY = "headscope.head"


def cached_file(request_headers: Mapping[str, str], response: Response) -> Response:
    """``response`` (a file, with an ``ETag``), or an empty 304 with its caching headers when
    the request's ``If-None-Match`` names that ETag (as the static mounts answer)."""
    etag = response.headers.get("etag")
    given = request_headers.get("if-none-match", "")
    tags = {t.strip().removeprefix("W/") for t in given.split(",")}
    if etag is None or not (tags & {etag.removeprefix("W/"), "*"}):
        return response
    kept = {k: v for k, v in response.headers.items() if k in ("etag", "cache-control", "last-modified")}
    return Response(status_code=304, headers=kept)


class PartsResponse(Response):
    """Send ``parts`` one after another without joining them: the tensor is never copied into a body.

    Args:
        parts: bytes-like buffers, sent in order.
        media_type: the Content-Type.
        headers: extra headers.
    """

    def __init__(
        self,
        parts: Sequence[BodyPart],
        media_type: str,
        headers: Mapping[str, str] | None = None,
        status_code: int = 200,
    ):
        self.parts = [memoryview(p).cast("B") for p in parts if len(p)]
        super().__init__(b"", status_code, headers, media_type)
        self.headers["content-length"] = str(sum(p.nbytes for p in self.parts))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        if not self.parts:
            await send({"type": "http.response.body", "body": b""})
        for i, part in enumerate(self.parts):
            await send({"type": "http.response.body", "body": part, "more_body": i < len(self.parts) - 1})


class StreamedResponse(StreamingResponse):
    """A body of known length produced chunk by chunk (large binary answers, ``answers.py``).

    Each chunk is asked for only when the previous one has been handed to the server, which
    waits while the socket's buffer is full: a slow reader holds about one chunk in memory.
    A client that leaves stops the stream (Starlette listens for the disconnect). A ``HEAD``
    request (``middleware.HeadAsGet``) gets the headers and no chunk is computed.

    Args:
        chunks: the body, in order.
        length: its total length (Content-Length).
        media_type: the Content-Type.
        headers: extra headers.
    """

    def __init__(
        self, chunks: AsyncIterator[BodyPart], length: int, media_type: str, headers: Mapping[str, str] | None = None
    ):
        super().__init__(chunks, 200, {**(headers or {}), "content-length": str(length)}, media_type)
        self._chunks = chunks

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            if scope.get(HEAD_KEY):
                await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
                await send({"type": "http.response.body", "body": b""})
                return
            await super().__call__(scope, receive, send)
        finally:
            aclose = getattr(self._chunks, "aclose", None)
            if aclose is not None:
                await aclose()
