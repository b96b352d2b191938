"""Shared fixtures: real uvicorn servers on free loopback ports, sample images."""

from __future__ import annotations

import json
import os
import resource
from pathlib import Path

import pytest

from helpers.server import ARTIFACTS, ROOT, SAMPLES, Pace, Server, measure_pace  # noqa: F401
from helpers.swin_reference import SWIN_ARCH, SWIN_CHECKPOINT, SWIN_V1, SWIN_V2, write_checkpoint


@pytest.fixture(autouse=True)
def _pillow_pixel_limit_kept():
    """Put Pillow's process-wide pixel limit back after each test: ``headscope extract`` and
    ``survey`` run in-process (``cli.main``) set it to Headscope's (``adopt_pixel_limit``), and a
    later test on the same worker would see 40 M where Pillow's own 89 M is expected (the
    decompression-bomb test then got Pillow's error, not its warning). pytest already puts the
    warning filters back."""
    from PIL import Image

    before = Image.MAX_IMAGE_PIXELS
    yield
    Image.MAX_IMAGE_PIXELS = before


@pytest.fixture(scope="session")
def live_server():
    """The default server (embedded model, fault injection on for the fault tests)."""
    srv = Server({"HEADSCOPE_ENABLE_FAULT_INJECTION": "1", "HEADSCOPE_MAX_WAIT_MS": "20"})
    yield srv
    srv.stop_cleanly()


@pytest.fixture(scope="session")
def swin_checkpoint(tmp_path_factory) -> Path:
    """The local Swin checkpoint the Swin server offers (tests rebuild the model from it)."""
    path = tmp_path_factory.mktemp("swin") / SWIN_CHECKPOINT
    write_checkpoint(path, SWIN_ARCH)
    return path


@pytest.fixture(scope="session")
def swin_server(swin_checkpoint):
    """One server for every Swin test (API and page): the default model plus SWIN_V1, SWIN_V2 and
    SWIN_LOCAL, offered by configuration (HEADSCOPE_EXTRA_MODELS) as a user would."""
    models = [SWIN_V1, SWIN_V2, f"local:{SWIN_ARCH}@{swin_checkpoint}"]
    srv = Server({"HEADSCOPE_EXTRA_MODELS": json.dumps(models)})
    yield srv
    srv.stop_cleanly()


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
def pace_now(live_server, pace) -> Pace:
    """This machine's speed when the test starts, for latency bounds measured over a whole test: the
    parallel run's other worker may have started something heavy since the session's :func:`pace`
    was measured. Never faster than that."""
    now = measure_pace(live_server.url)
    return now if now.forward_s > pace.forward_s else pace


@pytest.fixture
def server_factory():
    started: list[Server] = []

    def make(env=None, wait_ready=True, args=None) -> Server:
        srv = Server(env, wait_ready, args=args)
        started.append(srv)
        return srv

    yield make
    for srv in started:
        srv.stop()


@pytest.fixture(scope="session")
def samples() -> dict[str, Path]:
    return {p.stem: p for p in SAMPLES.iterdir() if p.suffix in (".png", ".jpg")}


# -- HEADSCOPE_CPU_PROFILE=1: CPU seconds of each test, its servers and browser included -----------
# The suite is CPU-bound on 2 cores (pytest-xdist cannot go below CPU / cores); this says where
# the CPU goes: the test process tree's utime + stime across each test (setup and teardown
# included), children reaped meanwhile counted through RUSAGE_CHILDREN. One JSON file per
# xdist worker in test-artifacts/.
if os.environ.get("HEADSCOPE_CPU_PROFILE") == "1":
    _CPU: dict[str, float] = {}

    def _tree_cpu() -> float:
        ticks = os.sysconf("SC_CLK_TCK")
        parent: dict[int, int] = {}
        cpu: dict[int, float] = {}
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                with open(f"/proc/{d}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parent[int(d)] = int(fields[1])
            # utime + stime, and cutime + cstime: what its own reaped children used
            cpu[int(d)] = sum(int(x) for x in fields[11:15]) / ticks
        me, total = os.getpid(), 0.0
        cpu[me] = sum(os.times()[:2])  # this process alone: its reaped children come next
        for pid in cpu:
            p = pid
            while p > 1 and p != me:
                p = parent.get(p, 0)
            if p == me:
                total += cpu[pid]
        ru = resource.getrusage(resource.RUSAGE_CHILDREN)
        return total + ru.ru_utime + ru.ru_stime

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item, nextitem):
        before = _tree_cpu()
        yield
        _CPU[item.nodeid] = round(_tree_cpu() - before, 2)

    def pytest_sessionfinish(session):
        ARTIFACTS.mkdir(exist_ok=True)
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        (ARTIFACTS / f"cpu-{worker}.json").write_text(json.dumps(_CPU, indent=0) + "\n")
