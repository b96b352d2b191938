"""A catalogue load's state as GET …/load reports it (app/serving/model_loads.py), in this process:
a load refused at its POST reads ``failed`` with its error, and a refusal never hides a load that
another request started meanwhile. The checks and the download are stand-ins (no hub here)."""

from __future__ import annotations

import asyncio

import pytest

from headscope.serving.model_loads import ModelLoads
from headscope.zoo.catalog import entries, lookup
from headscope.zoo.errors import HubUnreachableError


class Offered:
    """The registry's part a load touches: which ids are offered and loaded."""

    def __init__(self):
        self.ids: set[str] = set()
        self.specs: dict = {}

    def is_loaded(self, mid: str) -> bool:
        return mid in self.ids

    def offer(self, mid: str) -> None:
        self.ids.add(mid)

    def withdraw(self, mid: str) -> None:
        self.ids.discard(mid)


def loads_with(check_delays: list[float | None]) -> ModelLoads:
    """A ModelLoads whose n-th check waits check_delays[n] seconds, then passes (a number) or, for
    None, waits 0.2 s and finds the hub out of reach; its download takes 0.3 s."""
    loads = ModelLoads(Offered(), worker=None, describe=lambda e: (type(e).__name__, str(e)))  # type: ignore[arg-type]
    delays = iter(check_delays)
    runs: list[str] = []
    loads.runs = runs  # type: ignore[attr-defined]

    async def check(entry):
        delay = next(delays)
        if delay is None:
            await asyncio.sleep(0.2)
            raise HubUnreachableError("the hub cannot be reached")
        await asyncio.sleep(delay)

    async def run(load, mid):
        runs.append(mid)
        load.state = "downloading"
        await asyncio.sleep(0.3)
        loads.registry.offer(mid)
        load.state = "ready"

    loads._check, loads._run = check, run  # type: ignore[method-assign]
    return loads


NAME = next(iter(entries()))


def test_a_load_refused_at_its_post_reads_failed_with_its_error():
    async def go():
        loads = loads_with([None])
        with pytest.raises(HubUnreachableError):
            await loads.start(NAME)
        st = loads.state(NAME)
        assert st["state"] == "failed"
        assert st["error"] == {"code": "HubUnreachableError", "message": "the hub cannot be reached"}

    asyncio.run(go())


def test_a_refusal_does_not_hide_a_load_another_request_started_meanwhile():
    async def go():
        loads = loads_with([None, 0.05])  # the first request's check is slow and fails, the second's passes
        first = asyncio.create_task(loads.start(NAME))
        await asyncio.sleep(0.01)
        second = await loads.start(NAME)
        assert second["state"] == "queued"
        with pytest.raises(HubUnreachableError):
            await first
        assert loads.state(NAME)["state"] == "downloading"  # not "failed" while it downloads
        await asyncio.sleep(0.5)
        assert loads.state(NAME)["state"] == "ready"
        assert loads.registry.is_loaded(loads.model_id(lookup(NAME)))

    asyncio.run(go())


def test_two_checks_that_pass_start_one_load():
    async def go():
        loads = loads_with([0.1, 0.05])
        first = asyncio.create_task(loads.start(NAME))
        await asyncio.sleep(0.01)
        await loads.start(NAME)
        await first
        assert len(loads.runs) == 1  # the second check's end joined the first load: one download
        await asyncio.sleep(0.5)
        assert loads.state(NAME)["state"] == "ready"

    asyncio.run(go())
