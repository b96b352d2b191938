"""ASGI middleware: request ids, the allowed Host names, the request body limit (checked while the
body streams), security headers, HEAD for every GET route, no repeated query parameters, and the
500 for an error nothing else answers."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import ipaddress
import re
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from urllib.parse import parse_qsl

from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request

from . import errors
from .responses import HEAD_KEY

REQUEST_ID_HEADER = b"x-request-id"
SERVER_TIMING_HEADER = b"server-timing"
# A client's own id is kept when it is a short plain token (it goes into log lines as is).
_CLIENT_REQUEST_ID = re.compile(rb"[A-Za-z0-9._-]{1,64}")

CSP = (
    "default-src 'self'; img-src 'self' data: blob:; style-src 'self' 'unsafe-inline'; "
    "script-src 'self'; object-src 'none'; base-uri 'self'; frame-ancestors 'none'; form-action 'self'"
)

# An inline <script> without src (a JSON data block is not run, so it needs no hash either).
_INLINE_SCRIPT = re.compile(r"<script(?![^>]*\ssrc=)(?P<attrs>[^>]*)>(?P<body>.*?)</script>", re.S)


def site_csp(site: Path) -> str:
    """The CSP for a built MkDocs Material site: :data:`CSP`, with ``script-src`` also allowing
    the inline scripts the site's pages hold, each by its sha256.

    Material starts every page with small inline scripts (its local-storage helpers, the palette);
    without them the theme's bundle fails (``__md_get is not defined``) and search never starts.
    Hashes allow exactly those scripts, where ``'unsafe-inline'`` would allow any.
    """
    hashes = set()
    for page in site.rglob("*.html"):
        with open(page, encoding="utf-8", errors="replace", newline="") as f:  # the bytes hashed as sent: CRLF too
            text = f.read()
        for m in _INLINE_SCRIPT.finditer(text):
            if "application/json" in m["attrs"]:
                continue
            digest = base64.b64encode(hashlib.sha256(m["body"].encode()).digest()).decode()
            hashes.add(f"'sha256-{digest}'")
    return CSP.replace("script-src 'self'", " ".join(["script-src 'self'", *sorted(hashes)]))


# Room for the multipart framing and the text fields around the file.
FORM_OVERHEAD_BYTES = 64 * 1024


def upload_too_large_message(upload_limit: int) -> str:
    """The one message of 413 ``upload_too_large``, wherever the body was found too large."""
    return f"upload over the {upload_limit:,}-byte limit (HEADSCOPE_MAX_UPLOAD_BYTES)"


def count_rejection(scope, reason: str) -> None:
    """Count a request a middleware refuses before routing (no endpoint to count it under) in
    ``headscope_rejections_total{reason}``."""
    metrics = getattr(getattr(scope.get("app"), "state", None), "metrics", None)
    if metrics is not None:
        metrics.rejections.labels(reason).inc()


class Started:
    """An ASGI ``send`` that notes whether the answer has started (it can then not be replaced)."""

    def __init__(self, send):
        self.send, self.started = send, False

    async def __call__(self, message):
        if message["type"] == "http.response.start":
            self.started = True
        await self.send(message)


class BodyLimit:
    """Refuse request bodies over the upload limit and the form around it with 413, checked while
    they are read.

    A declared Content-Length over the limit is refused before a byte is read; a chunked body is
    counted as it streams and cut off at the limit. The message names ``upload_limit``, the limit a
    user set (``HEADSCOPE_MAX_UPLOAD_BYTES``), not the body's limit with the form's own bytes, a
    sum nobody configured.
    """

    def __init__(self, app, upload_limit: int):
        self.app, self.upload_limit = app, upload_limit
        self.limit = upload_limit + FORM_OVERHEAD_BYTES

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            # Before routing, so in no endpoint's requests_total: counted as a refusal by reason (a
            # body cut off while read is counted by its route, measured()).
            count_rejection(scope, "upload_too_large")
            return await self._refuse(scope, send)
        seen = 0
        send = Started(send)

        async def counted_receive():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise errors.BodyTooLarge()
            return message

        try:
            await self.app(scope, counted_receive, send)
        except errors.BodyTooLarge:
            if not send.started:
                await self._refuse(scope, send)

    async def _refuse(self, scope, send):
        resp = errors.logged_error_response(scope, 413, "upload_too_large", upload_too_large_message(self.upload_limit))
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


class RequestId:
    """Give every request an id and send it back as ``X-Request-ID``.

    The client's own ``X-Request-ID`` is kept when it is a short token, else a new id is made. It
    sits in the scope's state, where the error handlers read it: an error body's ``request_id``
    and the server's log line for that answer carry the same id. The time the request arrived
    sits beside it (``errors.STARTED``: a refusal's latency). An answer that does not give its
    own ``Server-Timing`` (queue, compute, encode) gets ``total``: the milliseconds from the
    request's arrival to the answer's first line.
    """

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        given = dict(scope.get("headers") or []).get(REQUEST_ID_HEADER, b"")
        rid = given.decode() if _CLIENT_REQUEST_ID.fullmatch(given) else errors.new_request_id()
        state = scope.setdefault("state", {})
        state["request_id"], state[errors.STARTED] = rid, time.perf_counter()

        async def with_id(message):
            if message["type"] == "http.response.start":
                headers = [*message.get("headers", []), (REQUEST_ID_HEADER, rid.encode())]
                if not any(k.lower() == SERVER_TIMING_HEADER for k, _ in headers):
                    ms = (time.perf_counter() - state[errors.STARTED]) * 1000
                    headers.append((SERVER_TIMING_HEADER, f"total;dur={ms:.2f}".encode()))
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, with_id)


class SecurityHeaders:
    """``nosniff`` and ``no-referrer`` on every answer; a CSP and ``DENY`` framing on HTML.

    Args:
        app: the ASGI app.
        csp_by_prefix: a CSP of its own for the HTML under a path prefix (the documentation
            site, :func:`site_csp`); :data:`CSP` elsewhere.
    """

    def __init__(self, app, csp_by_prefix: Mapping[str, str] | None = None):
        self.app = app
        self.csp_by_prefix = dict(csp_by_prefix or {})

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        csp = next((c for p, c in self.csp_by_prefix.items() if path == p or path.startswith(p + "/")), CSP)

        async def with_headers(message):
            if message["type"] == "http.response.start":
                h = list(message.get("headers", []))
                h.append((b"x-content-type-options", b"nosniff"))
                h.append((b"referrer-policy", b"no-referrer"))
                if any(k == b"content-type" and v.startswith(b"text/html") for k, v in h):
                    h.append((b"content-security-policy", csp.encode()))
                    h.append((b"x-frame-options", b"DENY"))
                message["headers"] = h
            await send(message)

        await self.app(scope, receive, with_headers)


class CatchUnexpected:
    """Answer an exception no handler knows with 500 ``internal`` (:func:`errors.unexpected_response`)
    here, inside the other middleware, so that the 500 has its request id, security headers and
    CORS headers like any other error.

    Starlette's own catch-all runs in ``ServerErrorMiddleware``, outside every added middleware,
    whose headers its answer never gets. An answer already started cannot be replaced: the error
    goes on up, and the server closes the connection. ``BodyTooLarge`` goes on up too, to the
    ``BodyLimit`` middleware that answers it.
    """

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        send = Started(send)
        try:
            await self.app(scope, receive, send)
        except errors.BodyTooLarge:
            raise
        except asyncio.CancelledError:
            # The server cancelling the request: its graceful shutdown's time ran out (uvicorn
            # cancels what still runs). Answered 503 shutting_down in the one body, where uvicorn
            # gave a plain-text 500 and logged a traceback; the request ends here either way.
            task = asyncio.current_task()
            if send.started or task is None:
                raise
            uncancel = getattr(task, "uncancel", None)  # Python 3.11+
            if uncancel is not None:
                uncancel()  # taken: the answer below is this request's last work
            stopping = errors.logged_error_response(
                scope, 503, "shutting_down", "the server is stopping; send the request again", {"Retry-After": "1"}
            )
            await stopping(scope, receive, send)
        except Exception as exc:
            if send.started:
                raise
            resp = await errors.unexpected_response(Request(scope), exc)
            await resp(scope, receive, send)


class HeadAsGet:
    """Answer ``HEAD`` as ``GET`` without the body, on every route that answers GET.

    Probes and proxies use HEAD; FastAPI routes answer only the methods they list. The scope
    is marked (``responses.HEAD_KEY``) so a streamed answer computes none of its chunks; any
    other body is dropped on the way out (the server sends none for HEAD either). Content-Length
    stays that of the GET.
    """

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "HEAD":
            return await self.app(scope, receive, send)

        async def without_body(message):
            if message["type"] == "http.response.body" and message.get("body"):
                message = {**message, "body": b""}
            await send(message)

        await self.app({**scope, "method": "GET", HEAD_KEY: True}, receive, without_body)


class SingleParams:
    """Refuse an API query string that gives a parameter twice (422 ``duplicate_parameter``).

    ``?layers=0&layers=5`` would otherwise silently mean ``layers=5``.
    """

    def __init__(self, app, prefix: str = "/api/"):
        self.app, self.prefix = app, prefix

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"].startswith(self.prefix) and scope.get("query_string"):
            names = Counter(k for k, _ in parse_qsl(scope["query_string"].decode("latin-1"), keep_blank_values=True))
            repeated = sorted(k for k, n in names.items() if n > 1)
            if repeated:
                count_rejection(scope, "duplicate_parameter")  # before routing, as BodyLimit's
                resp = errors.logged_error_response(
                    scope,
                    422,
                    "duplicate_parameter",
                    f"query parameter(s) given more than once: {', '.join(repeated)[:200]}; give each once",
                )
                return await resp(scope, receive, send)
        await self.app(scope, receive, send)


# Names that only ever mean this machine: a page elsewhere cannot make a browser send them.
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
_PORT = re.compile(r"[0-9]{0,5}")
_HOST_HEADER = b"host"


def split_host(value: str) -> str | None:
    """The host name of a ``Host`` header value, lower case, without port or brackets.

    ``"LocalHost:8000"`` -> ``"localhost"``, ``"[::1]:8000"`` -> ``"::1"``, ``"example.org."``
    -> ``"example.org"``; None when it is malformed (a bare IPv6 address, a port that is not
    ASCII digits, an empty name).
    """
    value = value.strip().lower()
    if value.startswith("["):
        name, bracket, rest = value[1:].partition("]")
        if not bracket or (rest and not (rest.startswith(":") and _PORT.fullmatch(rest[1:]))):
            return None
    else:
        name, colon, port = value.partition(":")
        if colon and (":" in port or not _PORT.fullmatch(port)):
            return None
    name = name.removesuffix(".")
    return name or None


def _ip(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(name)
    except ValueError:
        return None


def bound_to_loopback(bind_host: str) -> bool:
    """Whether the server listens on this machine only (``127.0.0.1``, ``::1``, ``localhost``)."""
    ip = _ip(bind_host.strip("[]"))
    return bind_host.lower() == "localhost" or (ip is not None and ip.is_loopback)


class AllowedHosts:
    """Refuse a request whose ``Host`` header is not a name of this server (400 ``bad_host``).

    A server on loopback without authentication is reachable from any page in the user's
    browser through DNS rebinding: the attacker's name is made to resolve to 127.0.0.1, and the
    browser then calls the API as a page of that name, with the name in ``Host``. Only the names
    the server is really reached by are answered (Starlette's ``TrustedHostMiddleware``, but
    with the one JSON error body and any port):

    - always ``localhost``, ``127.0.0.1``, ``[::1]`` and any other loopback address;
    - bound to a non-loopback address (``0.0.0.0``, ``::``, a LAN address), also any IP address
      written as such (``http://192.168.1.5:8000``): rebinding needs a *name*, so addresses are
      safe, and the machine's own ones need no configuration (nor do Docker's published ports);
    - the bind address itself when it is a name (``--host myhost.lan``);
    - ``allowed``: more names (``HEADSCOPE_ALLOWED_HOSTS``): ``example.org``, ``*.example.org``
      for its sub-domains, or ``*`` for any (only behind a proxy that checks ``Host`` itself).

    Args:
        app: the ASGI app.
        bind_host: the address the server listens on (``Settings.host``).
        allowed: more host names (``Settings.allowed_hosts``).
    """

    def __init__(self, app, bind_host: str, allowed: Iterable[str] = ()):
        self.app = app
        extra = [a.strip().lower() for a in allowed if a.strip()]
        self.any_host = "*" in extra
        self.suffixes = tuple(a[1:] for a in extra if a.startswith("*."))  # ".example.org"
        names = {split_host(a) for a in extra if not a.startswith("*")}
        bind = bind_host.strip().lower()
        ip = _ip(bind.strip("[]"))
        if ip is None and bind:
            names.add(split_host(bind))
        self.names = frozenset(n for n in names if n) | LOOPBACK_NAMES
        self.any_ip = not bound_to_loopback(bind_host)

    def allows(self, name: str | None) -> bool:
        if self.any_host:
            return True
        if name is None:
            return False
        if name in self.names or (self.suffixes and name.endswith(self.suffixes)):
            return True
        ip = _ip(name)
        return ip is not None and (ip.is_loopback or self.any_ip)

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket") or self.any_host:
            return await self.app(scope, receive, send)
        values = [v for k, v in scope.get("headers") or [] if k == _HOST_HEADER]
        name = split_host(values[0].decode("latin-1")) if len(values) == 1 else None
        if self.allows(name):
            return await self.app(scope, receive, send)
        if scope["type"] == "websocket":
            return await send({"type": "websocket.close", "code": 1008})
        shown = values[0].decode("latin-1")[:100] if len(values) == 1 else ""
        message = (
            f"this server does not answer to the host {shown!r}; reach it by an address it answers to, "
            "or add the name to HEADSCOPE_ALLOWED_HOSTS"
            if shown
            else "the request needs exactly one Host header"
        )
        resp = errors.logged_error_response(scope, 400, "bad_host", message)
        await resp(scope, receive, send)


class Cors(CORSMiddleware):
    """Starlette's ``CORSMiddleware``, with a refused preflight in the one JSON error body.

    A preflight from an origin, or for a method or header, the allow-list does not name is still
    400 with the preflight's headers (``Access-Control-Allow-Origin`` only for a listed origin), but
    its body is ``cors_refused`` with the request id, where Starlette answers the plain text
    "Disallowed CORS origin".
    """

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["method"] == "OPTIONS":
            headers = Headers(scope=scope)
            if "origin" in headers and "access-control-request-method" in headers:
                resp = self.preflight_response(request_headers=headers)
                if resp.status_code == 400:
                    refused = bytes(resp.body).decode().removeprefix("Disallowed CORS ")
                    message = f"this server does not allow this cross-origin request (its {refused})"
                    if "origin" in refused.split(", "):
                        message += "; the origins it allows are set by HEADSCOPE_CORS_ORIGINS"
                    kept = {k: v for k, v in resp.headers.items() if k.lower().startswith(("access-control-", "vary"))}
                    resp = errors.logged_error_response(scope, 400, "cors_refused", message, kept)
                return await resp(scope, receive, send)
        await super().__call__(scope, receive, send)
