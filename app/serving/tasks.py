"""Long computations (seconds) that run in pieces on the worker thread, with progress.

A head-importance sweep or a pruning curve takes seconds; run as one call on the single worker
thread it would hold every upload behind it. :class:`Tasks` runs such work as an asyncio task
that awaits the worker once per piece (one block's batch of heads, a few masked forwards), so
queued uploads run between pieces. One task per key at a time: a second request for the same
thing joins the running one. The task keeps running when its request times out (the result is
cached for the next request) and is cancelled between pieces once every client that asked for
it has gone. :class:`Progress` is what ``GET …/progress`` reports.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from .admission import QueueFullError, Ticket, current_ticket, using

# A long computation outlives the request that started it (it caches its result), so its worker
# calls get a deadline of their own, at the priority of that request's class.
TASK_DEADLINE_S = 3600.0

POLL_S = 0.1  # how often a waiting request checks whether its client is still there


class ClientLeft(Exception):
    """Raised to a waiting request whose client went away (mapped like ClientGone)."""


@dataclass
class Progress:
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

    def advance(self, units: float, stage: str | None = None) -> None:
        self.done = min(self.total, self.done + units)
        if stage is not None:
            self.stage = stage

    def as_dict(self) -> dict[str, Any]:
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
class _Task:
    future: asyncio.Future
    progress: Progress
    waiters: int = 0


class Tasks:
    """Single-flight background tasks with progress, at most ``limit`` at once.

    Event-loop only: no lock is needed.
    """

    def __init__(self, limit: int = 4):
        self.limit = limit
        self._tasks: dict[Hashable, _Task] = {}

    def progress(self, key: Hashable) -> Progress | None:
        task = self._tasks.get(key)
        return task.progress if task else None

    def __len__(self) -> int:
        return len(self._tasks)

    def _start(self, key: Hashable, name: str, factory: Callable[[Progress], Awaitable[Any]]) -> _Task:
        if len(self._tasks) >= self.limit:
            raise QueueFullError(f"the server is busy ({self.limit} long computations in progress)")
        progress = Progress(name)
        parent = current_ticket()
        with using(Ticket(parent.cls, time.monotonic() + TASK_DEADLINE_S) if parent else None):
            future = asyncio.ensure_future(factory(progress))  # the task runs in a copy of this context
        task = _Task(future, progress)
        self._tasks[key] = task

        def finished(f: asyncio.Future) -> None:
            if self._tasks.get(key) is task:
                del self._tasks[key]
            if not f.cancelled():
                f.exception()  # retrieved: the waiters got it; no "never retrieved" warning

        future.add_done_callback(finished)
        return task

    async def run(
        self,
        key: Hashable,
        name: str,
        factory: Callable[[Progress], Awaitable[Any]],
        deadline: float,
        is_disconnected: Callable[[], Awaitable[bool]] | None = None,
    ) -> Any:
        """Start the task for ``key`` (or join the running one) and wait for its result.

        Args:
            name: what it computes, for progress.
            factory: ``factory(progress)`` -> the coroutine to run; it advances ``progress``.
            deadline: ``time.monotonic()`` after which this request gets a timeout (the task
                goes on and caches its result).
            is_disconnected: polled while waiting; when every waiting client has gone, the
                task is cancelled.

        Raises:
            QueueFullError: ``limit`` other tasks are running.
            asyncio.TimeoutError: the deadline passed first.
            ClientLeft: the client went away.
        """
        task = self._tasks.get(key) or self._start(key, name, factory)
        task.waiters += 1
        gone = False
        try:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise asyncio.TimeoutError()
                done, _ = await asyncio.wait({task.future}, timeout=min(POLL_S, remaining))
                if done:
                    return task.future.result()
                if is_disconnected is not None and await is_disconnected():
                    gone = True
                    raise ClientLeft("the client closed the connection before the answer")
        finally:
            task.waiters -= 1
            if gone and task.waiters == 0 and not task.future.done():
                task.future.cancel()
