"""A lean HTTP/1.1 load client: stdlib ``http.client`` keep-alive connections on a thread pool.

The API part of the benchmark measures the server, so its client should cost as little as
possible on a machine whose two cores it shares with the server. httpx's async client spends
about 48 ms of CPU reading one 18 MiB safetensors answer (measured here); ``http.client`` reads
it with ``recv_into`` in about 4 ms. ``--client httpx`` keeps the old client for comparison.
"""

from __future__ import annotations

import asyncio
import http.client
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from urllib.parse import urlencode, urlsplit


@dataclass
class Response:
    status_code: int
    headers: dict[str, str]  # lower-case names
    content: bytes

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")


def multipart(files: dict[str, tuple[str, bytes, str]], data: dict[str, str] | None) -> tuple[bytes, str]:
    """A ``multipart/form-data`` body and its Content-Type."""
    boundary = uuid.uuid4().hex
    parts = []
    for name, value in (data or {}).items():
        parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode())
    for name, (filename, content, ctype) in files.items():
        parts.append(
            f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; filename="{filename}"\r\n'
            f"Content-Type: {ctype}\r\n\r\n".encode()
            + content
            + b"\r\n"
        )
    parts.append(f"--{boundary}--\r\n".encode())
    return b"".join(parts), f"multipart/form-data; boundary={boundary}"


class LeanClient:
    """Async front, blocking keep-alive connections behind it (one per pool thread).

    Args:
        base_url: ``http://host:port``.
        max_connections: pool threads, i.e. the most requests in flight.
        timeout: socket timeout in seconds.
    """

    def __init__(self, base_url: str, max_connections: int = 20, timeout: float = 180):
        u = urlsplit(base_url)
        self.host, self.port, self.timeout = u.hostname, u.port or 80, timeout
        self.pool = ThreadPoolExecutor(max_workers=max_connections, thread_name_prefix="bench-client")
        self.local = threading.local()

    def _request(self, method: str, path: str, body: bytes | None, headers: dict[str, str]) -> Response:
        for attempt in (0, 1):
            conn = getattr(self.local, "conn", None)
            if conn is None:
                conn = self.local.conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            try:
                conn.request(method, path, body=body, headers=headers)
                r = conn.getresponse()
                content = r.read()
                return Response(r.status, {k.lower(): v for k, v in r.getheaders()}, content)
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                conn.close()
                self.local.conn = None
                if attempt:
                    raise
        raise AssertionError("unreachable")

    async def _run(self, method: str, path: str, body: bytes | None = None, headers: dict | None = None) -> Response:
        return await asyncio.get_running_loop().run_in_executor(
            self.pool, self._request, method, path, body, headers or {}
        )

    async def get(self, path: str, params: dict | None = None) -> Response:
        return await self._run("GET", path + ("?" + urlencode(params) if params else ""))

    async def post(self, path: str, files: dict, data: dict | None = None) -> Response:
        body, ctype = multipart(files, data)
        return await self._run("POST", path, body, {"Content-Type": ctype})

    async def __aenter__(self) -> LeanClient:
        return self

    async def __aexit__(self, *exc) -> None:
        self.pool.shutdown(wait=True)
