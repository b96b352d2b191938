"""AllowedHosts: which Host names a server answers to, by where it listens (issue 33, item 7).

The API tests check a real server on loopback (tests/api/test_hardening_third.py); these check the
policy for the other bind addresses (0.0.0.0, ::, a LAN address, a name) on the middleware
itself, without opening a port to the network.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from headscope.web.middleware import AllowedHosts, bound_to_loopback, split_host


def answer(mw_args: dict, host: bytes | list[bytes] | None) -> tuple[int, dict | None]:
    """The status (and error body) the middleware gives a GET with this Host header (or these)."""

    async def inner(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    sent: list[dict] = []

    async def send(message):
        sent.append(message)

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    hosts = [] if host is None else host if isinstance(host, list) else [host]
    headers = [(b"host", h) for h in hosts]
    scope = {"type": "http", "method": "GET", "path": "/healthz", "headers": headers, "state": {}}
    asyncio.run(AllowedHosts(inner, **mw_args)(scope, receive, send))
    status = sent[0]["status"]
    body = b"".join(m.get("body", b"") for m in sent[1:])
    return status, (json.loads(body) if status != 200 else None)


@pytest.mark.parametrize(
    "value,name",
    [
        ("localhost", "localhost"),
        ("LocalHost:8000", "localhost"),
        ("[::1]:8000", "::1"),
        ("[::1]", "::1"),
        ("example.org.", "example.org"),
        ("example.org:", "example.org"),
        ("::1", None),  # IPv6 without brackets
        ("[::1", None),
        ("[::1]x", None),
        ("example.org:８０", None),
        ("example.org:80:80", None),
        ("", None),
        (":80", None),
    ],
)
def test_split_host(value, name):
    assert split_host(value) == name


def test_loopback_binds():
    assert all(bound_to_loopback(h) for h in ("127.0.0.1", "localhost", "::1", "[::1]", "127.0.0.2"))
    assert not any(bound_to_loopback(h) for h in ("0.0.0.0", "::", "192.168.1.5", "myhost.lan"))


LOOPBACK = [b"localhost", b"localhost:8000", b"127.0.0.1", b"127.0.0.1:8000", b"[::1]:8000", b"127.0.0.2"]
ADDRESSES = [b"192.168.1.5:8000", b"10.0.0.7", b"[fe80::1]:8000", b"172.17.0.2:8000"]
NAMES = [b"evil.example", b"127.0.0.1.nip.io", b"localhost.evil.example", b"myhost.lan"]


def test_bound_to_loopback_only_loopback_names():
    args = {"bind_host": "127.0.0.1"}
    assert all(answer(args, h)[0] == 200 for h in LOOPBACK)
    for h in [*ADDRESSES, *NAMES, None, b"[::1"]:
        status, body = answer(args, h)
        assert status == 400 and body is not None and body["error"]["code"] == "bad_host", h


@pytest.mark.parametrize("bind", ["0.0.0.0", "::", "192.168.1.5"])
def test_bound_to_the_network_addresses_but_no_names(bind):
    """Any IP address is answered (rebinding needs a name; the Docker healthcheck and published
    ports use 127.0.0.1); names other than localhost need HEADSCOPE_ALLOWED_HOSTS."""
    args = {"bind_host": bind}
    assert all(answer(args, h)[0] == 200 for h in [*LOOPBACK, *ADDRESSES])
    assert all(answer(args, h)[0] == 400 for h in NAMES)


def test_a_bind_name_and_the_setting():
    assert answer({"bind_host": "myhost.lan"}, b"myhost.lan:8000")[0] == 200
    assert answer({"bind_host": "myhost.lan"}, b"evil.example")[0] == 400
    args = {"bind_host": "0.0.0.0", "allowed": ["Headscope.Example", "*.lab.example", " "]}
    for h in (b"headscope.example", b"HEADSCOPE.EXAMPLE:443", b"gpu1.lab.example", b"a.b.lab.example"):
        assert answer(args, h)[0] == 200, h
    for h in (b"lab.example", b"xlab.example", b"headscope.example.evil.example"):
        assert answer(args, h)[0] == 400, h
    assert answer({"bind_host": "127.0.0.1", "allowed": ["*"]}, b"anything.example")[0] == 200


def test_two_host_headers_are_refused():
    status, body = answer({"bind_host": "127.0.0.1"}, [b"localhost", b"evil.example"])
    assert status == 400 and body is not None and "exactly one Host header" in body["error"]["message"]
    assert answer({"bind_host": "127.0.0.1"}, [b"localhost", b"localhost"])[0] == 400
