"""One computation per key in flight, shared by every request that asks for it (single flight).

A capture being computed, a long task (importance, faithfulness), a catalogue model being loaded:
each is a :class:`Flight`, an asyncio task that every request for the same key joins instead of
starting another, each waiting until its own deadline (:meth:`Flight.wait`). :class:`Flights`
holds them by key, at most ``limit`` at once (429 beyond), and forgets each once it is done.

Who may end a flight is one rule: it is cancelled when the last request holding it leaves,
unless it was *kept*. A flight is kept when it must outlive its requests: a model load always,
a long task once a request left it on purpose to run on (``wait=``, or its deadline passed: the
result is cached for the next request). A kept flight runs to its end or its own deadline; a
client that disconnects then cancels only work nobody else holds.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Hashable, Iterator
from typing import Any, Generic, TypeVar

from .admission import QueueFullError
from .waiting import Disconnected, wait_for_result

T = TypeVar("T")


class Flight(Generic[T]):
    """One computation in flight and the requests that hold it.

    Args:
        task: the computation.
        kept: it runs on without holders (see the module docstring).
        about: what its starter attached to it (a task's progress, a load's state).
    """

    def __init__(self, task: asyncio.Future[T], kept: bool = False, about: Any = None, bounded: bool = True):
        self.task = task
        self.kept = kept
        self.about = about
        self.bounded = bounded  # counted against its Flights' limit
        self.holders = 0
        task.add_done_callback(_retrieve)

    def done(self) -> bool:
        return self.task.done()

    async def wait(
        self,
        deadline: float | None,
        client_left: Disconnected | None = None,
        what: str = "the answer",
        keep_on_timeout: bool = False,
    ) -> T:
        """Hold the flight and await its result until ``deadline`` (``time.monotonic()``),
        watching the client; when the last holder leaves, the flight is cancelled unless kept.

        Args:
            keep_on_timeout: a request whose deadline passes keeps the flight (a long task goes
                on and caches its result); else the flight is cancelled with its last holder.

        Raises:
            asyncio.TimeoutError: the deadline passed first.
            ClientGone: the client went away.
        """
        self.holders += 1
        try:
            return await wait_for_result(asyncio.shield(self.task), deadline, client_left, what)
        except asyncio.TimeoutError:
            # Left on purpose to run on (``wait=``, or the deadline): from now on no client that
            # joins and disconnects may cancel it (#39).
            self.kept = self.kept or keep_on_timeout
            raise
        finally:
            self.holders -= 1
            self.release()

    def release(self) -> None:
        """Cancel the flight if nobody holds it and nobody kept it (its queued work is skipped)."""
        if self.holders == 0 and not self.kept and not self.task.done():
            self.task.cancel()


class Flights(Generic[T]):
    """The flights in progress by key, at most ``limit`` at once.

    Event-loop only: no lock is needed.

    Args:
        limit: flights at once (None: no bound); one more is :class:`QueueFullError` (429).
        what: what they are, for the busy message.
    """

    def __init__(self, limit: int | None = None, what: str = "computations"):
        self.limit = limit
        self.what = what
        self._flights: dict[Hashable, Flight[T]] = {}

    def get(self, key: Hashable) -> Flight[T] | None:
        """The flight for ``key`` while it runs, else None."""
        flight = self._flights.get(key)
        return flight if flight is not None and not flight.done() else None

    def __len__(self) -> int:
        return len(self._flights)

    def __iter__(self) -> Iterator[Flight[T]]:
        return iter(list(self._flights.values()))

    def start(
        self,
        key: Hashable,
        factory: Callable[[], Coroutine[Any, Any, T]],
        *,
        shared: bool = True,
        kept: bool = False,
        about: Any = None,
        bounded: bool = True,
    ) -> Flight[T]:
        """Start ``factory()`` as the flight for ``key`` (in a copy of the current context).

        Args:
            shared: registered under ``key`` for later requests to join (a computation with an
                injected fault is not).
            bounded: counted against ``limit`` (False: work of something admitted already).

        Raises:
            QueueFullError: ``limit`` flights are running.
        """
        # Only bounded flights count: one started by another flight (a pruning curve's ranking)
        # is that flight's work, and holds no slot of its own.
        if bounded and self.limit is not None and sum(f.bounded for f in self._flights.values()) >= self.limit:
            raise QueueFullError(f"the server is busy ({self.limit} {self.what} in progress)")
        flight: Flight[T] = Flight(asyncio.ensure_future(factory()), kept, about, bounded)
        if shared:
            self._flights[key] = flight

            def forget(_: asyncio.Future) -> None:
                if self._flights.get(key) is flight:
                    del self._flights[key]

            flight.task.add_done_callback(forget)
        return flight

    async def stop(self) -> None:
        """Cancel every flight and wait for them to end (shutdown)."""
        tasks = [f.task for f in self._flights.values() if not f.done()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _retrieve(task: asyncio.Future) -> None:
    """Mark a flight's exception as seen (its holders may all have gone)."""
    if not task.cancelled():
        task.exception()
