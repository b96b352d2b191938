"""The HTTP/1.1 connection: uvicorn's h11 protocol with limits on what a client may hold.

uvicorn's default HTTP implementation (httptools) accepts request headers of any size (a 64 MiB
header was answered 200) and times out neither a client that sends its headers slowly nor one
that stops reading an answer. Headscope serves with uvicorn's h11 protocol instead, which bounds
the request line and headers (``h11_max_incomplete_event_size``), and adds:

* the one JSON error body, 400 ``bad_request``, for a request line or headers that cannot be
  parsed (uvicorn's is plain text);
* **431** for a request line and headers over ``HEADSCOPE_MAX_HEADER_BYTES`` (32 KiB; h11 marks
  the error as a 431, uvicorn would answer it 400);
* **408** and a closed connection when a request's line and headers have not arrived
  ``HEADSCOPE_HEADER_TIMEOUT_S`` (10 s) after its first byte, or after the connection opened
  (slowloris);
* a closed connection when the client has taken none of an answer for
  ``HEADSCOPE_SEND_TIMEOUT_S`` (60 s) while the server has more to send (the write buffer stays
  over its high-water mark): the answer's memory and slots are freed.

Idle keep-alive connections close after ``HEADSCOPE_KEEP_ALIVE_S`` (5 s; uvicorn's own timer).
The body's deadline is the request's (``admission.py``): an upload that has not arrived by then
gets 408 from the route.
"""

from __future__ import annotations

import asyncio
import logging
import re
import uuid
from typing import Any

import h11
import orjson
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("headscope")
_BLANK_LINE = re.compile(rb"\n\r?\n")
_BYTES_REPR = re.compile(r"bytearray\(b(['\"])(.*?)\1\)")


class _Connection(h11.Connection):
    """h11's connection, remembering the status its last protocol error asked for."""

    status_hint = 400
    error_text = ""

    def next_event(self):
        try:
            return super().next_event()
        except h11.RemoteProtocolError as e:
            self.status_hint = e.error_status_hint
            # h11 shows the offending bytes as Python's repr ("illegal request line: bytearray(b'GET /a b')")
            text = _BYTES_REPR.sub(lambda m: repr(m.group(2)), str(e))
            self.error_text = "".join(ch if ch.isprintable() else " " for ch in text)[:200]
            raise


def _error_bytes(status: int, reason: str, code: str, message: str) -> bytes:
    # The one error body, and its id in X-Request-ID as on every other answer (no request head was
    # read, so there is no client id to keep: a new one).
    rid = uuid.uuid4().hex[:12]
    body = orjson.dumps({"error": {"code": code, "message": message, "request_id": rid}})
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\nx-content-type-options: nosniff\r\n"
        "connection: close\r\n"
        f"x-request-id: {rid}\r\ncontent-length: {len(body)}\r\n\r\n"
    )
    return head.encode("ascii") + body


class LimitedH11Protocol(H11Protocol):
    """See the module docstring. Configured by :func:`protocol_class`."""

    header_timeout_s: float = 10.0
    send_timeout_s: float = 60.0
    max_header_bytes: int = 32 * 1024

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.conn = _Connection(h11.SERVER, self.max_header_bytes)
        self._header_timer: asyncio.TimerHandle | None = None
        self._send_timer: asyncio.TimerHandle | None = None
        self._head_seen = 0  # bytes of the current request's head received so far
        self._head_tail = b""  # its last bytes, to find a blank line split between reads

    # -- headers ---------------------------------------------------------------------------
    def _awaiting_headers(self) -> bool:
        """Whether the next bytes are a request's line and headers (h11: the client's side is
        IDLE). Not while the body of a request already answered still arrives: an upload
        refused at once (429, 413) goes on sending its body, which is no request head."""
        return self.conn.their_state is h11.IDLE

    def _arm_header_timer(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout_s, self._on_header_timeout)

    def _disarm_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_timer()

    def data_received(self, data: bytes) -> None:
        if self._awaiting_headers():
            self._arm_header_timer()
            if self._head_too_large(data):
                self._refuse_431()
                return
        before = self.cycle
        super().data_received(data)
        if self.cycle is not before or not self._awaiting_headers():
            self._disarm_header_timer()
            self._head_seen, self._head_tail = 0, b""

    def _head_too_large(self, data: bytes) -> bool:
        """Whether the request line and headers run past ``max_header_bytes`` with ``data``.

        h11 checks only an event it has not received whole: headers that arrive in one read
        (up to 256 KiB) would pass. So the head is measured here, up to its blank line.
        """
        buf = self._head_tail + data
        end = _BLANK_LINE.search(buf)
        if end is None:
            self._head_seen += len(data)
            self._head_tail = buf[-3:]
            return self._head_seen > self.max_header_bytes
        return self._head_seen + end.end() - len(self._head_tail) > self.max_header_bytes

    def _refuse_431(self) -> None:
        self.logger.warning("Request headers too large.")
        self._disarm_header_timer()
        self.transport.write(
            _error_bytes(
                431,
                "Request Header Fields Too Large",
                "headers_too_large",
                f"the request line and headers are over {self.max_header_bytes:,} bytes",
            )
        )
        self.transport.close()

    def on_response_complete(self) -> None:
        self._head_seen, self._head_tail = 0, b""
        super().on_response_complete()
        # The next request's timer starts with its first byte; the idle time before it is the
        # keep-alive timeout's.
        self._disarm_header_timer()

    def _on_header_timeout(self) -> None:
        self._header_timer = None
        if self.transport.is_closing() or not self._awaiting_headers():
            return
        if self.conn.their_state is h11.IDLE and self.conn.our_state in (h11.IDLE, h11.DONE):
            self.transport.write(
                _error_bytes(408, "Request Timeout", "request_timeout", "the request's headers did not arrive in time")
            )
        self.transport.close()

    def send_400_response(self, msg: str) -> None:
        if getattr(self.conn, "status_hint", 400) == 431:
            self._refuse_431()
            return
        # The one error body (uvicorn's is plain text), unless an answer is already on its way.
        if self.conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            why = getattr(self.conn, "error_text", "") or "it cannot be parsed"
            self.transport.write(
                _error_bytes(400, "Bad Request", "bad_request", f"malformed HTTP request line or headers: {why}")
            )
        self.transport.close()

    # -- answers -----------------------------------------------------------------------------
    def pause_writing(self) -> None:
        super().pause_writing()
        if self._send_timer is None:
            self._send_timer = self.loop.call_later(self.send_timeout_s, self._on_send_timeout)

    def resume_writing(self) -> None:
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None
        super().resume_writing()

    def _on_send_timeout(self) -> None:
        self._send_timer = None
        if not self.transport.is_closing():
            log.warning("closing a connection whose client read nothing for %.0f s", self.send_timeout_s)
            self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_timer()
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None
        super().connection_lost(exc)


def protocol_class(max_header_bytes: int, header_timeout_s: float, send_timeout_s: float) -> type[LimitedH11Protocol]:
    """A :class:`LimitedH11Protocol` with these limits, for ``uvicorn.run(http=...)``."""
    return type(
        "HeadscopeH11Protocol",
        (LimitedH11Protocol,),
        {
            "max_header_bytes": max_header_bytes,
            "header_timeout_s": header_timeout_s,
            "send_timeout_s": send_timeout_s,
        },
    )
