"""A response whose body is sent as several buffers (a header, then the tensor bytes)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from ..serving.encoders import Part


class PartsResponse(Response):
    """Send ``parts`` one after another without joining them: the tensor is never copied into a body.

    Args:
        parts: bytes-like buffers, sent in order.
        media_type: the Content-Type.
        headers: extra headers.
    """

    def __init__(
        self, parts: Sequence[Part], media_type: str, headers: Mapping[str, str] | None = None, status_code: int = 200
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
