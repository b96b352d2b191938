"""The API tests' HTTP side: requests with explicit timeouts, the one error body, fresh pictures."""

from __future__ import annotations

import io
import socket

import httpx
import numpy as np
from PIL import Image

from headscope.serving.uploads import image_id_of as image_id  # noqa: F401  # the app's own, never re-derived

from .server import HTTP_TIMEOUT

API = "/api/v1/attention"


def post(base: str, data: bytes, name: str = "img.png", timeout: float = HTTP_TIMEOUT, headers=None, **fields):
    """``POST /api/v1/attention`` with ``data`` as the file and ``fields`` as form fields."""
    return httpx.post(
        base + API,
        files={"image": (name, data, "application/octet-stream")},
        data={k: str(v) for k, v in fields.items()},
        timeout=timeout,
        headers=headers,
    )


def post_json(base: str, data: bytes, name: str = "img.png", timeout: float = HTTP_TIMEOUT, **fields) -> dict:
    """:func:`post`, which must succeed: its JSON."""
    r = post(base, data, name, timeout, **fields)
    assert r.status_code == 200, r.text
    return r.json()


def get(base: str, path: str, timeout: float = HTTP_TIMEOUT, **params) -> httpx.Response:
    """``GET base + path`` with ``params`` as the query."""
    return httpx.get(base + path, params=params, timeout=timeout)


def follow_up(base: str, iid: str, what: str, timeout: float = 600, **params) -> dict:
    """The JSON of ``GET /api/v1/attention/{iid}/{what}`` (relevance, faithfulness...),
    which must answer 200. The long default timeout: a test may wait for a whole computation."""
    r = httpx.get(f"{base}/api/v1/attention/{iid}/{what}", params=params, timeout=timeout)
    assert r.status_code == 200, r.text
    return r.json()


def assert_error(r: httpx.Response, status: int, code: str | None = None) -> None:
    """``r`` is the one error body (``{"error": {"code", "message", "request_id"}}``) with
    ``status`` (and ``code``), and gives nothing of the server away."""
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "request_id"}
    assert "Traceback" not in r.text and "/work/" not in r.text and ".py" not in r.text
    if code:
        assert body["error"]["code"] == code, body


def raw(port: int, data: bytes, timeout: float = HTTP_TIMEOUT) -> bytes:
    """Send ``data`` on a new connection to the server on ``port``; what comes back until it
    closes the connection (a request the HTTP layer refuses, an HTTP/1.0 request)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out


def png(img: Image.Image, fmt: str = "PNG", **kw) -> bytes:
    """``img`` encoded (PNG unless said)."""
    buf = io.BytesIO()
    img.save(buf, fmt, **kw)
    return buf.getvalue()


def fresh_png(seed: int | None = None, size: tuple[int, int] = (120, 80)) -> bytes:
    """A picture of ``size`` (width, height) no other test sends (the server caches by content):
    a flat colour and one white pixel picked by ``seed``, or random noise without one."""
    if seed is None:
        rng = np.random.default_rng()
        return png(Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)))
    img = Image.new("RGB", size, (seed * 37 % 255, 60, 140))
    img.putpixel((seed % size[0], 7), (255, 255, 255))
    return png(img)


def fresh_photo(path, seed: int) -> bytes:
    """A real photo (``path``, e.g. a sample) that no other test sends: one pixel set by ``seed``,
    as PNG (the server caches by content, so a test that counts computations needs its own bytes)."""
    img = Image.open(path).convert("RGB")
    img.putpixel((seed % img.width, (seed // img.width) % img.height), (seed * 37 % 256, 255, 0))
    return png(img)
