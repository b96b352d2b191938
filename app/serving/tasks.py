"""Long computations (seconds) that run in pieces on the worker thread, with progress.

A head-importance sweep or a pruning curve takes seconds; run as one call on the single worker
thread it would hold every upload behind it. Such a computation is written once, as a
:data:`TaskWork`: a generator that yields its pieces (plain calls: one block's batch of heads, a few
masked forwards) and gets each piece's result back. :func:`run_now` runs it here and now (a
notebook, a script); :func:`run_on` awaits the worker once per piece, so queued uploads run
between pieces. :class:`Tasks` runs such work as an asyncio task, one per key at a time: a
second request for the same thing joins the running one (a :class:`~.flights.Flight`). A request
that leaves it on purpose (``wait=``, or its deadline) *keeps* it: it runs to its end and caches
its result, and no client that joins and disconnects can cancel it; only its starter can, with
the token of its 202 answer (:meth:`Tasks.cancel`). A task nobody kept is cancelled between
pieces once every client that asked for it has gone. One client address may run
``per_client`` tasks of a kind at once. :class:`TaskProgress` is what ``GET …/progress`` reports.
:class:`ImageTasks` puts it together for an endpoint about an uploaded image: a new one (another
measure of heads) is a subclass with a :data:`TaskWork` and its routes.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import secrets
import time
import traceback
from collections.abc import Awaitable, Callable, Generator, Hashable
from dataclasses import dataclass, field
from typing import Any

from ..config import Settings
from ..engine.device import is_oom
from ..engine.model import LoadedModel
from ..zoo.registry import Registry
from . import preprocess
from .admission import QueueFullError, Ticket, current_client_left, current_ticket, using
from .cache import ByteLRU
from .flights import Flight, Flights
from .uploads import Upload, Uploads
from .waiting import Disconnected
from .worker import OutOfMemory, Worker

log = logging.getLogger("headscope")

TaskPiece = Callable[[], Any]  # one call on the worker thread
TaskWork = Generator[TaskPiece, Any, dict]  # yields pieces, is sent their results, returns the answer
RESULT_BYTES = 64 * 1024  # what a cached result is charged (small JSON)

# A long computation outlives the request that started it (it caches its result), so its worker
# calls get a deadline of their own, at the priority of that request's class.
TASK_DEADLINE_S = 3600.0
TOKEN_BYTES = 18  # a cancel token: 144 random bits, never guessed
# A task that failed while no request waited for it (answered 202, polled later): its error is
# kept this long for the next request of its key, which gets it instead of a silent new start.
FAILURE_KEPT_S = 300.0
FAILURES_KEPT = 256


@dataclass
class TaskProgress:
    """How far a task has come, in units of work of about equal cost.

    Args:
        task: ``importance`` or ``pruning``.
        total: units of work in all (updated when the task knows it).
    """

    task: str
    total: float = 1.0
    done: float = 0.0
    stage: str = "queued"
    started: float = field(default_factory=time.monotonic)
    # While the task waits for another it needs first (a pruning curve for its importance):
    # that one's progress, looked up when asked (None once it is over).
    waiting_for: Callable[[], TaskProgress | None] | None = None

    def advance(self, units: float, stage: str | None = None) -> None:
        self.done = min(self.total, self.done + units)
        if stage is not None:
            self.stage = stage

    def as_dict(self) -> dict[str, Any]:
        first = self.waiting_for() if self.waiting_for is not None else None
        if first is not None:  # its numbers, under this task's name: "importance: block 3"
            return {**first.as_dict(), "task": self.task, "stage": f"{first.task}: {first.stage}"}
        elapsed = time.monotonic() - self.started
        frac = self.done / self.total if self.total else 0.0
        eta = elapsed * (1 - frac) / frac if frac > 0 else None
        return {
            "state": "running",
            "task": self.task,
            "stage": self.stage,
            "done": round(self.done, 3),
            "total": round(self.total, 3),
            "fraction": round(frac, 4),
            "elapsed_s": round(elapsed, 3),
            "eta_s": None if eta is None else round(eta, 3),
        }


@dataclass
class TaskInfo:
    """What a task's flight carries: its progress, who started it, and the starter's token to
    cancel it (``DELETE /api/v1/tasks/{token}``)."""

    progress: TaskProgress
    client: str | None = None
    token: str | None = field(default_factory=lambda: secrets.token_urlsafe(TOKEN_BYTES))


class Tasks:
    """Single-flight background tasks with progress, at most ``limit`` at once
    (:class:`~.flights.Flights`: a request for a running key joins it).

    Event-loop only: no lock is needed.

    Args:
        limit: tasks at once; one more is a 429.
        per_client: tasks one client address may have started and running (its share of
            ``limit``; default half of it): one client cannot take every slot.
    """

    def __init__(self, limit: int = 4, per_client: int | None = None):
        self.limit = limit
        self.per_client = per_client or max(1, limit // 2)
        self._flights: Flights[Any] = Flights(limit, "long computations")

    def progress(self, key: Hashable) -> TaskProgress | None:
        flight = self._flights.get(key)
        return flight.about.progress if flight else None

    def __len__(self) -> int:
        return len(self._flights)

    def _start(
        self, key: Hashable, name: str, factory: Callable[[TaskProgress], Awaitable[Any]], bounded: bool = True
    ) -> Flight[Any]:
        parent = current_ticket()
        client = parent.client if parent else None
        if bounded and client is not None:
            mine = sum(1 for f in self._flights if f.about.client == client and not f.done())
            if mine >= self.per_client:
                raise QueueFullError(
                    f"this client already has {mine} long computations running (its share of the server's "
                    f"{self.limit}); wait for one, or cancel one with DELETE /api/v1/tasks/{{cancel_token}}"
                )
        # An unbounded task is another task's work: not counted in its client's share either.
        info = TaskInfo(TaskProgress(name), client if bounded else None)
        with using(Ticket(parent.cls, time.monotonic() + TASK_DEADLINE_S, client=client) if parent else None):
            return self._flights.start(key, lambda: _awaited(factory(info.progress)), about=info, bounded=bounded)

    def join(
        self, key: Hashable, name: str, factory: Callable[[TaskProgress], Awaitable[Any]], bounded: bool = True
    ) -> tuple[Flight[Any], bool]:
        """The running task for ``key``, or a new one; and whether this call started it.

        Args:
            bounded: a new task counts against ``limit`` and the client's share (False: the
                work of a task admitted already, which must not fail for want of a slot).

        Raises:
            QueueFullError: ``limit`` other tasks are running, or this client runs its share.
        """
        flight = self._flights.get(key)
        if flight is not None:
            return flight, False
        return self._start(key, name, factory, bounded), True

    async def run(
        self,
        key: Hashable,
        name: str,
        factory: Callable[[TaskProgress], Awaitable[Any]],
        deadline: float,
        client_left: Disconnected | None = None,
        bounded: bool = True,
    ) -> Any:
        """Start the task for ``key`` (or join the running one) and wait for its result.

        Args:
            name: what it computes, for progress.
            factory: ``factory(progress)`` -> the coroutine to run; it advances ``progress``.
            deadline: ``time.monotonic()`` after which this request gets a timeout (the task
                goes on and caches its result: it is kept, and no later disconnect cancels it).
            client_left: returns when the client has gone; when every waiting client has gone and
                nobody kept the task, it is cancelled.
            bounded: see :meth:`join`.

        Raises:
            QueueFullError: ``limit`` other tasks are running, or this client runs its share.
            asyncio.TimeoutError: the deadline passed first (the task goes on).
            ClientGone: the client went away.
        """
        flight, _ = self.join(key, name, factory, bounded)
        return await flight.wait(deadline, client_left, keep_on_timeout=True)

    def cancel(self, token: str) -> str | None:
        """Give up the task started with ``token``: ``cancelled``, or ``running`` when other
        requests still wait for it (it goes on for them); None for no such task."""
        for flight in self._flights:
            info: TaskInfo = flight.about
            if info.token is not None and not flight.done() and secrets.compare_digest(info.token, token):
                info.token = None  # used up
                flight.kept = False
                flight.release()
                return "running" if flight.holders else "cancelled"
        return None


async def _awaited(aw: Awaitable[Any]) -> Any:
    return await aw


def run_now(work: TaskWork) -> dict:
    """Run ``work`` here, piece after piece (no worker thread, no asyncio)."""
    try:
        piece = next(work)
        while True:
            piece = work.send(piece())
    except StopIteration as done:
        return done.value


async def run_on(work: TaskWork, run: Callable[[TaskPiece], Awaitable[Any]]) -> dict:
    """Run ``work`` with each piece awaited through ``run`` (the worker thread)."""
    try:
        piece = next(work)
        while True:
            piece = work.send(await run(piece))
    except StopIteration as done:
        return done.value


async def model_of(registry: Registry, worker: Worker, model_id: str | None) -> LoadedModel:
    """A model by id (the default for None), loaded on the worker thread on first use."""
    mid = registry.resolve(model_id)
    lm = registry.loaded(mid)
    if lm is not None:
        return lm
    # Loading is slow (weights, maybe a download): do it on the worker thread.
    return await worker.run_in_worker(registry.get, mid)


class ImageTasks:
    """Long computations about an uploaded image, as tasks with progress, their results cached.

    Args:
        settings: the request timeout.
        uploads: the uploaded pictures (ImageNotFound once one is gone).
        worker: the worker thread every piece runs on.
        cache: where results are kept (the server's byte-bounded cache).
        registry: the models.
        max_tasks: computations at once; more get 429.
    """

    def __init__(
        self,
        settings: Settings,
        uploads: Uploads,
        worker: Worker,
        cache: ByteLRU,
        registry: Registry,
        max_tasks: int = 4,
    ):
        self.settings = settings
        self.uploads = uploads
        self.worker = worker
        self.cache = cache
        self.registry = registry
        self.tasks = Tasks(max_tasks, settings.max_tasks_per_client)
        self._failed: dict[Hashable, tuple[Exception, float]] = {}  # see FAILURE_KEPT_S

    def pools(self) -> list[Tasks]:
        """Every pool of tasks this service runs (a subclass with more adds them)."""
        return [self.tasks]

    def cancel(self, token: str) -> str | None:
        """``DELETE /api/v1/tasks/{token}``: see :meth:`Tasks.cancel`."""
        for pool in self.pools():
            state = pool.cancel(token)
            if state is not None:
                return state
        return None

    @property
    def device(self):
        return self.registry.device

    async def model(self, model_id: str | None) -> LoadedModel:
        """A model by id (the default for None), loaded on the worker thread on first use."""
        return await model_of(self.registry, self.worker, model_id)

    def deadline(self, wait: float | None = None) -> float:
        """A request's deadline, or ``wait`` seconds from now when that is sooner."""
        deadline = time.monotonic() + self.settings.request_timeout_s
        return deadline if wait is None else min(deadline, time.monotonic() + wait)

    async def prepared(self, upload: Upload, lm: LoadedModel) -> preprocess.PreparedPixels:
        """The upload as ``lm``'s input."""
        return await self.uploads.prepared(upload, lm)

    async def piece(self, fn: TaskPiece) -> Any:
        """One piece of work on the worker thread; running out of device memory is a 503."""
        try:
            return await self.worker.run_in_worker(fn)
        except RuntimeError as e:
            if is_oom(e):
                raise OutOfMemory("the image does not fit in device memory; try a smaller image") from None
            raise

    async def result(
        self,
        key: Hashable,
        name: str,
        image_id: str,
        compute: Callable[[TaskProgress, Upload], Awaitable[dict]],
        wait: float | None = None,
        upload: Upload | None = None,
        deadline: float | None = None,
        bounded: bool = True,
    ) -> dict:
        """The result for ``key``: from the cache (``cached: true``), else ``compute(progress,
        upload)`` as a task (joined by later requests; its result cached).

        Args:
            wait: answer ``{"pending": progress}`` after this many seconds instead of a timeout
                (the computation goes on; the route answers 202).
            upload: the image, when the caller has already looked it up.
            deadline: when to stop waiting (``time.monotonic()``; default: the request timeout
                from now, or ``wait``).
            bounded: see :meth:`Tasks.join` (False: asked by a task that holds a slot already).

        Raises:
            ImageNotFound: the image is gone.
            asyncio.TimeoutError: the request's deadline passed (the computation goes on).
            Exception: the error of this key's task that failed while nobody waited for it
                (once, within ``FAILURE_KEPT_S``; the request after it starts the task again).
        """
        hit = self.cache.get(key)
        if hit is not None:
            return {**hit, "cached": True}
        failed = self._failed.pop(key, None)
        if failed is not None and time.monotonic() - failed[1] < FAILURE_KEPT_S and self.tasks.progress(key) is None:
            raise failed[0]
        picture = upload or self.uploads.require(image_id)

        async def job(progress: TaskProgress) -> dict:
            try:
                res = await compute(progress, picture)
            except Exception as e:
                # Nobody to tell now, or the request that left it to run on (kept) is not among
                # those waiting: the next request of the key is told.
                if flight.holders == 0 or flight.kept:
                    self._keep_failure(key, e)
                raise
            self.cache.put(key, res, RESULT_BYTES)
            return res

        flight, started = self.tasks.join(key, name, job, bounded)
        due = self.deadline(wait) if deadline is None else deadline
        try:
            res = await flight.wait(due, current_client_left(), keep_on_timeout=True)
        except asyncio.TimeoutError:
            info: TaskInfo = flight.about
            if wait is None or flight.done():
                raise
            pending = info.progress.as_dict()
            if started and info.token is not None:  # only its starter may cancel it
                pending["cancel_token"] = info.token
            return {"pending": pending}
        return {**res, "cached": False}

    def _keep_failure(self, key: Hashable, e: Exception) -> None:
        """Keep ``e`` for the next request of ``key``: logged now with its traceback (nobody else
        sees where it failed), kept as a copy without traceback or chained errors, whose frames
        would hold the failed computation's tensors (device memory after an out-of-memory)."""
        # the traceback as text: a log record holding exc_info would keep the frames alive
        where = "".join(traceback.format_exception(e)).rstrip()
        log.warning("a task failed with nobody waiting for it; its next request gets: %s\n%s", str(e), where)
        try:
            kept = copy.copy(e)  # args and attributes, not __traceback__, __context__, __cause__
        except Exception:  # an exception that cannot be rebuilt from its args: itself, detached
            kept = e
        kept.__traceback__ = kept.__context__ = kept.__cause__ = None
        kept.__suppress_context__ = True
        now = time.monotonic()
        for k in [k for k, (_, t) in self._failed.items() if now - t >= FAILURE_KEPT_S]:
            del self._failed[k]
        while len(self._failed) >= FAILURES_KEPT:
            del self._failed[next(iter(self._failed))]  # the oldest
        self._failed[key] = (kept, now)

    def state(self, key: Hashable, name: str) -> dict | None:
        """What ``GET …/progress`` says of ``key``: ``done`` (cached), ``running`` (with the
        progress), or None when it has not started."""
        if self.cache.get(key) is not None:
            return {"state": "done", "task": name, "done": 1, "total": 1, "fraction": 1.0}
        progress = self.tasks.progress(key)
        return progress.as_dict() if progress is not None else None
