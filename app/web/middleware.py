"""ASGI middleware: the request body limit (checked while the body streams) and security headers."""

from __future__ import annotations

from . import errors

CSP = (
    "default-src 'self'; img-src 'self' data: blob:; style-src 'self' 'unsafe-inline'; "
    "script-src 'self'; object-src 'none'; base-uri 'self'; frame-ancestors 'none'; form-action 'self'"
)


class BodyLimit:
    """Refuse request bodies over ``limit`` bytes with 413, checked while they are read.

    A declared Content-Length over the limit is refused before a byte is read; a chunked body is
    counted as it streams and cut off at the limit.
    """

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            return await self._refuse(send)
        seen = 0
        started = False

        async def counted_receive():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise _TooLarge()
            return message

        async def tracking_send(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counted_receive, tracking_send)
        except _TooLarge:
            if not started:
                await self._refuse(send)

    async def _refuse(self, send):
        resp = errors.error_response(413, "upload_too_large", f"request body over the {self.limit:,}-byte limit")
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"connection", b"close"),
                    (b"content-length", str(len(resp.body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": resp.body})


class _TooLarge(Exception):
    pass


class SecurityHeaders:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def with_headers(message):
            if message["type"] == "http.response.start":
                h = list(message.get("headers", []))
                h.append((b"x-content-type-options", b"nosniff"))
                h.append((b"referrer-policy", b"no-referrer"))
                if any(k == b"content-type" and v.startswith(b"text/html") for k, v in h):
                    h.append((b"content-security-policy", CSP.encode()))
                    h.append((b"x-frame-options", b"DENY"))
                message["headers"] = h
            await send(message)

        await self.app(scope, receive, with_headers)
