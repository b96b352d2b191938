"""A request the server cancels (uvicorn's graceful shutdown ran out of time while a long test
still ran: `docker stop -t 40` on a faithfulness test) is answered 503 ``shutting_down`` in the
one error body, with its request id. uvicorn answered it with its plain-text 500 and logged an
"Exception in ASGI application" traceback. In-process, at the ASGI level."""

from __future__ import annotations

import asyncio
import json

from headscope.web.middleware import CatchUnexpected


def test_a_request_cancelled_by_the_server_is_a_json_503():
    started = asyncio.Event()
    sent: list[dict] = []

    async def long_test(scope, receive, send):
        started.set()
        await asyncio.sleep(3600)

    async def send(message):
        sent.append(message)

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def main():
        scope = {
            "type": "http",
            "method": "GET",
            "path": "/api/v1/attention/x/faithfulness",
            "headers": [],
            "query_string": b"",
            "state": {},
        }
        task = asyncio.create_task(CatchUnexpected(long_test)(scope, receive, send))
        await started.wait()
        task.cancel(msg="Task cancelled, timeout graceful shutdown exceeded")
        await task  # ends with the answer, not a CancelledError

    asyncio.run(main())
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 503
    body = json.loads(b"".join(m.get("body", b"") for m in sent[1:]))
    assert body["error"]["code"] == "shutting_down" and body["error"]["request_id"]
