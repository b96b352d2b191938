"""``headscope_requests_total`` counts each answer of a labelled route once: an answer cut short
after it started (counted 200 by ``measured()``) is not counted again as a 500 by the error
handler; a refusal before the service call is counted by the handler. The project's own
handlers, ``counted_as``, ``measured``, ``respond`` and ``Metrics`` around a stand-in route."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.testclient import TestClient

from headscope.serving.answers import Answer, StreamAborted
from headscope.serving.metrics import Metrics
from headscope.web import errors
from headscope.web.service_calls import counted_as, measured, respond


def counts(metrics: Metrics) -> dict[tuple[str, str], float]:
    out = {}
    for family in metrics.registry.collect():
        if family.name == "headscope_requests":
            for s in family.samples:
                if s.name.endswith("_total"):
                    out[(s.labels["endpoint"], s.labels["status"])] = s.value
    return out


def test_an_answer_cut_short_is_counted_once_and_a_refusal_before_the_call_once():
    app = FastAPI()
    errors.install(app)
    app.state.metrics = metrics = Metrics()

    async def cut_short():
        async def body():
            yield b"head"
            raise StreamAborted("TimeoutError")  # as a chunk's worker call that failed mid-answer

        return Answer([], {}, "application/octet-stream", {}, stream=body(), length=100)

    @app.get("/stream")
    @counted_as("get")
    async def stream_route():
        return respond(await measured(metrics, cut_short(), "get"))

    @app.get("/refused")
    @counted_as("stats")
    async def refused_route(n: int):
        raise AssertionError("not reached: n is refused by FastAPI's check")

    client = TestClient(app, raise_server_exceptions=False)
    try:
        client.get("/stream")
    except Exception:  # the client sees a body cut short
        pass
    assert client.get("/refused", params={"n": "x"}).status_code == 422
    assert counts(metrics) == {("get", "200"): 1.0, ("stats", "422"): 1.0}


def observed(metrics: Metrics) -> dict[str, float]:
    """``headscope_request_seconds_count`` by endpoint."""
    out = {}
    for family in metrics.registry.collect():
        if family.name == "headscope_request_seconds":
            for s in family.samples:
                if s.name.endswith("_count"):
                    out[s.labels["endpoint"]] = s.value
    return out


def test_every_counted_answer_is_timed_a_refusal_before_the_call_too():
    # The histogram's _count lagged the counter by every refusal made before the service call
    # (a malformed image id, an undeclared parameter, a 429 from a dependency).
    app = FastAPI()
    errors.install(app)
    app.state.metrics = metrics = Metrics()

    async def answer():
        return Answer([b"{}"], {}, "application/json", {})

    @app.get("/answered")
    @counted_as("get")
    async def answered_route():
        return respond(await measured(metrics, answer(), "get"))

    @app.get("/refused")
    @counted_as("get")
    async def refused_route(n: int):
        raise AssertionError("not reached: n is refused by FastAPI's check")

    @app.get("/busy")
    @counted_as("stats")
    async def busy_route():
        raise errors.ApiError(429, "busy", "full")  # as a dependency's full queue

    client = TestClient(app, raise_server_exceptions=False)
    assert client.get("/answered").status_code == 200
    assert client.get("/refused", params={"n": "x"}).status_code == 422
    assert client.get("/busy").status_code == 429
    assert counts(metrics) == {("get", "200"): 1.0, ("get", "422"): 1.0, ("stats", "429"): 1.0}
    assert observed(metrics) == {"get": 2.0, "stats": 1.0}
