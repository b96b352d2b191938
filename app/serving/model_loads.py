"""Loading a catalogue model on demand: download (a thread), then build (the worker), with a state to poll.

``POST /api/v1/models/catalog/{name}/load`` starts a load (or joins the one under way) and
``GET`` of the same path reports it. A load goes ``queued`` -> ``downloading`` (bytes so far,
the file's size) -> ``loading`` (the build, on the worker thread like every torch operation)
-> ``ready``, or ``failed`` with the error the API answers for it. One download runs at a time,
so a page cannot fill the link (or the disk) with many at once; a load outlives the request that
started it, and its model stays offered once ready. The registry bounds how many models stay in
memory (the least recently used is unloaded, see :class:`app.zoo.registry.Registry`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..zoo.catalog import CatalogEntry, lookup, parameter_count
from ..zoo.download import DownloadProgress, cached_weights, check_download, download_weights, unreachable_message
from ..zoo.errors import HubUnreachableError, ModelLoadError, ModelTooLargeError
from ..zoo.hub import hub_reachable
from ..zoo.registry import Registry
from .admission import HEAVY, Ticket, using
from .flights import Flights
from .tasks import TASK_DEADLINE_S
from .worker import Worker

log = logging.getLogger(__name__)

# An exception -> the (code, message) the API answers for it (app.web.errors knows the mapping).
Describe = Callable[[Exception], tuple[str, str]]

# A failed load is reported for this long, then forgotten (a new POST tries again at once anyway).
KEEP_FAILED_S = 600.0


@dataclass
class Load:
    """One model's load: what ``GET …/load`` reports."""

    entry: CatalogEntry
    model_id: str
    state: str = "queued"
    progress: DownloadProgress = field(default_factory=DownloadProgress)
    error: Exception | None = None
    started: float = field(default_factory=time.monotonic)
    finished: float | None = None

    def as_dict(self, describe: Describe) -> dict[str, Any]:
        err = None
        if self.error is not None:
            code, message = describe(self.error)
            err = {"code": code, "message": message}
        end = self.finished or time.monotonic()
        return {
            **self.entry.as_dict(),
            "id": self.model_id,
            "state": self.state,
            "bytes_done": self.progress.done,
            "bytes_total": self.progress.total,
            "fraction": 1.0 if self.state == "ready" else self.progress.fraction,
            "seconds": max(0.0, round(end - self.started, 2)),
            "error": err,
        }


class ModelLoads:
    """The loads under way and recently finished, one per catalogue name.

    Args:
        registry: the models offered; a loaded catalogue model is added to it.
        worker: builds the model on its thread.
        describe: how the API names a failed load's exception (its code and message).
        max_params: the most parameters a catalogue model may have (checked before a download).
        max_bytes: the largest weights file it may download (and the disk must have room for it).
    """

    def __init__(
        self,
        registry: Registry,
        worker: Worker,
        describe: Describe,
        max_params: int = 700_000_000,
        max_bytes: int = 3 * 1024**3,
    ):
        self.max_params = max_params
        self.max_bytes = max_bytes
        self.registry = registry
        self.worker = worker
        self.describe = describe
        self._loads: dict[str, Load] = {}
        self._flights: Flights[None] = Flights()  # the loads under way: kept, they outlive their requests
        self._download = asyncio.Semaphore(1)

    def model_id(self, entry: CatalogEntry) -> str:
        """The id the registry offers this model under: a configured id for the same name, else
        ``timm:NAME`` (``open_clip:ARCH/TAG``)."""
        source = "open_clip" if entry.source == "open_clip" else "timm-hub"
        for mid, spec in list(self.registry.specs.items()):
            if spec.source == source and spec.arch == entry.name:
                return mid
        return entry.model_id

    def state(self, name: str) -> dict[str, Any]:
        """What a page polls: the load of ``name``, ``ready`` when it is loaded, else ``idle``.

        Raises:
            UnknownModelError: not a catalogue name.
        """
        entry = lookup(name)
        load = self._loads.get(entry.name)
        if load is not None:
            return load.as_dict(self.describe)
        mid = self.model_id(entry)
        offered = mid in self.registry.ids  # loaded, or loads from disk when asked for
        return {
            **entry.as_dict(),
            "id": mid,
            "state": "ready" if offered else "idle",
            "bytes_done": 0,
            "bytes_total": None,
            "fraction": 1.0 if offered else None,
            "seconds": 0.0,
            "error": None,
        }

    async def start(self, name: str) -> dict[str, Any]:
        """Start loading ``name`` (or join its load); returns its state.

        Raises:
            UnknownModelError: not a catalogue name (nothing is fetched).
            ModelTooLargeError: over the size cap, or too little free disk (nothing is fetched).
            HubUnreachableError: not in the cache and the hub cannot be reached (said at once).
        """
        entry = lookup(name)
        self._forget_old()
        flight = self._flights.get(entry.name)
        if flight is not None:
            return flight.about.as_dict(self.describe)
        load = self._loads.get(entry.name)
        if load is not None and load.state != "failed":
            return load.as_dict(self.describe)
        mid = self.model_id(entry)
        if mid in self.registry.ids and self.registry.is_loaded(mid):
            return self.state(name)
        try:
            await self._check(entry)
        except (ModelTooLargeError, HubUnreachableError) as e:
            # Refused before anything started; a client polling GET …/load (its 503 lost, or another
            # tab) is told why, as for a load that failed later, instead of "idle" forever. Not over
            # a load another request started meanwhile (its own check passed while this one waited).
            current = self._loads.get(entry.name)
            if self._flights.get(entry.name) is None and (current is None or current.state == "failed"):
                now = time.monotonic()  # one instant: started after finished read -0.0 seconds
                self._loads[entry.name] = Load(entry, mid, "failed", error=e, started=now, finished=now)
            raise
        flight = self._flights.get(entry.name)  # started by a request whose check ended first
        if flight is not None:
            return flight.about.as_dict(self.describe)
        load = Load(entry, mid)
        self._loads[entry.name] = load
        with using(Ticket(HEAVY, time.monotonic() + TASK_DEADLINE_S)):  # below uploads on the worker
            self._flights.start(entry.name, lambda: self._run(load, mid), kept=True, about=load)
        return load.as_dict(self.describe)

    async def _check(self, entry: CatalogEntry) -> None:
        """Refuse a load that cannot succeed here, before any download: over the caps, or not cached
        with the hub out of reach."""
        params = await asyncio.to_thread(parameter_count, entry)
        if params > self.max_params:
            raise ModelTooLargeError(
                f"{entry.name} has {params / 1e6:,.0f} M parameters, over this server's {self.max_params / 1e6:,.0f} M "
                "cap (HEADSCOPE_CATALOG_MAX_PARAMS)"
            )
        if await asyncio.to_thread(cached_weights, entry) is None:
            if not await asyncio.to_thread(hub_reachable):
                raise HubUnreachableError(unreachable_message(entry))
            await asyncio.to_thread(check_download, entry, self.max_bytes)  # size and free disk first

    async def _run(self, load: Load, mid: str) -> None:
        try:
            async with self._download:
                load.state = "downloading"
                await asyncio.to_thread(download_weights, load.entry, load.progress)
            load.state = "loading"
            self.registry.offer(mid)
            try:
                await self.worker.run_in_worker(self.registry.get, mid)
            except Exception:
                self.registry.withdraw(mid)  # a model that cannot load is not offered
                raise
            load.state = "ready"
            log.info("loaded %s on demand in %.1f s", mid, time.monotonic() - load.started)
        except asyncio.CancelledError:
            load.state, load.error = "failed", ModelLoadError("the server is shutting down")
            raise
        except Exception as e:
            load.state, load.error = "failed", e
            log.warning("loading %s on demand failed: %s", mid, e)
        finally:
            load.finished = time.monotonic()

    def _forget_old(self) -> None:
        now = time.monotonic()
        for name, load in list(self._loads.items()):
            if load.finished is not None and now - load.finished > KEEP_FAILED_S:
                del self._loads[name]

    async def stop(self) -> None:
        """Cancel the loads under way (shutdown)."""
        await self._flights.stop()
