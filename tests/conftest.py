"""Shared fixtures: real uvicorn servers on free loopback ports, sample images."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from server import ARTIFACTS, ROOT, SAMPLES, Pace, Server, measure_pace  # noqa: F401


@pytest.fixture(scope="session")
def live_server():
    """The default server (embedded model, fault injection on for the fault tests)."""
    srv = Server({"HEADSCOPE_ENABLE_FAULT_INJECTION": "1", "HEADSCOPE_MAX_WAIT_MS": "20"})
    yield srv
    assert srv.stop() == 0
    assert "Traceback" not in srv.log(), "the server logged an unhandled error; see " + str(srv.log_path)


@pytest.fixture(scope="session")
def base_url(live_server) -> str:
    return live_server.url


@pytest.fixture(scope="session")
def pace(live_server) -> Pace:
    """This machine's speed at the start of the session (see server.Pace), kept in test-artifacts/."""
    p = measure_pace(live_server.url)
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "pace.json").write_text(json.dumps({"forward_s": p.forward_s, "slowdown": p.slowdown}) + "\n")
    return p


@pytest.fixture
def server_factory():
    started: list[Server] = []

    def make(env=None, wait_ready=True) -> Server:
        srv = Server(env, wait_ready)
        started.append(srv)
        return srv

    yield make
    for srv in started:
        srv.stop()


@pytest.fixture(scope="session")
def samples() -> dict[str, Path]:
    return {p.stem: p for p in SAMPLES.iterdir() if p.suffix in (".png", ".jpg")}
