"""Admission: every resource a request may hold, and how much of it, decided in one place.

Requests come in three classes, each with its own pool of slots, so that one kind of traffic
cannot starve another:

* ``upload`` (POST /api/v1/attention): a new picture; decodes, runs a forward, answers.
  ``HEADSCOPE_MAX_QUEUE`` slots (32).
* ``follow_up`` (GET /api/v1/attention/{id}, .../stats, .../explain, .../output, /api/v1/images/{id}): a
  question about a picture already sent; cheap worker time (slicing, statistics), or a forward
  of its own with heads off or another model. ``HEADSCOPE_MAX_FOLLOW_UPS`` slots (16).
* ``heavy`` (GET .../importance, .../pruning, .../relevance, .../faithfulness, .../zero-shot):
  seconds of worker time each. ``HEADSCOPE_MAX_HEAVY`` slots (2).

A slot is taken before the request's body is read (routes take it through the ``AdmitUpload``,
``AdmitFollowUp`` or ``AdmitHeavy`` dependency in ``app/web/deps.py``); a full pool answers 429
with ``Retry-After`` at once, before the request costs a decode or a forward. The slot is held
until the answer has been sent.

Taking a slot also gives the request a :class:`Ticket`: its class, its priority on the worker
thread (uploads first, then follow-ups, then heavy work; see ``worker.py``) and its deadline
(``HEADSCOPE_REQUEST_TIMEOUT_S`` from admission; an upload's body must arrive by then, and its
decode and forward get a whole deadline again from when it has). The ticket lives in a context variable, so
every ``worker.run_in_worker`` call the request makes runs at the request's priority and is
dropped (504) when the deadline passes before it starts, without the route passing anything.

Two more pools bound memory rather than requests:

* decoding (:meth:`Admission.decoding`): at most ``HEADSCOPE_MAX_DECODES`` decode at once
  (2 on the CPU, the cores on CUDA); the others wait their turn, holding nothing. A decode that
  gets its turn reserves its estimated peak memory (from the image header, see ``images.py``)
  out of ``HEADSCOPE_DECODE_BUDGET_BYTES`` (512 MiB); a picture whose estimate alone is over
  the budget is refused with 413 before it waits, one that does not fit next to the decodes
  running gets 429 + Retry-After.
* large answers (:meth:`Admission.large_answer`): answers over ``HEADSCOPE_LARGE_ANSWER_BYTES``
  (8 MiB) being built or sent, at most ``HEADSCOPE_MAX_LARGE_ANSWERS`` (4) at once; more get 429.

Everything here runs on the event loop only: no locks.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractContextManager, asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .metrics import Metrics
from .waiting import Disconnected

if TYPE_CHECKING:
    from ..config import Settings

UPLOAD = "upload"
FOLLOW_UP = "follow_up"
HEAVY = "heavy"
# Lower runs first on the worker thread.
PRIORITY = {UPLOAD: 0, FOLLOW_UP: 1, HEAVY: 2}
MiB = 2**20


class QueueFullError(RuntimeError):
    """Every slot of a pool is taken (answered 429 with Retry-After)."""


class TooLargeToDecode(ValueError):
    """The header says decoding the picture would take more memory than the budget (413)."""


@dataclass
class Ticket:
    """What an admitted request carries: its class, priority and deadline.

    Args:
        cls: ``upload``, ``follow_up`` or ``heavy``.
        deadline: ``time.monotonic()`` by which its worker time must have started (an
            upload's is counted again from when its body has arrived: :meth:`restart`).
        client_left: returns when the client has gone; a waiting request then drops work nobody will read.
        fault: injected fault (tests only): ``sleep:S`` delays each worker call of a
            follow-up or heavy request by S seconds.
    """

    cls: str
    deadline: float
    client_left: Disconnected | None = None
    fault: str | None = None
    timeout_s: float = 60.0
    client: str | None = None  # the client's address (a trusted proxy's X-Forwarded-For, else the peer)
    admitted: float = field(default_factory=time.monotonic)
    _releases: list[Callable[[], None]] = field(default_factory=list, repr=False)
    _on_queued: Callable[[], None] | None = field(default=None, repr=False)

    @property
    def priority(self) -> int:
        return PRIORITY[self.cls]

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def restart(self) -> None:
        """Give the request a whole deadline again, from now (an upload, once its body is in)."""
        self.deadline = time.monotonic() + self.timeout_s

    def hold(self, pool: Pool) -> None:
        """Take a slot of ``pool`` (429 when full) until the request is over (answer sent)."""
        pool.acquire()
        self._releases.append(pool.release)

    def queued(self) -> None:
        """Its forward is queued, or it waits for another request's: no batch waits for it now."""
        if self._on_queued is not None:
            done, self._on_queued = self._on_queued, None
            done()

    def close(self) -> None:
        self.queued()
        while self._releases:
            self._releases.pop()()


_current: contextvars.ContextVar[Ticket | None] = contextvars.ContextVar("headscope_ticket", default=None)


def current_ticket() -> Ticket | None:
    """The ticket of the request this code runs for, if any."""
    return _current.get()


def current_client_left() -> Disconnected | None:
    """What a wait for the current request watches for its client leaving (the ticket's
    ``client_left``); None outside a request, and in a task, which outlives the request that
    started it (its ticket has no client)."""
    ticket = _current.get()
    return ticket.client_left if ticket is not None else None


@contextmanager
def using(ticket: Ticket | None) -> Iterator[Ticket | None]:
    """Run the block as ``ticket``'s request (worker calls get its priority and deadline)."""
    token = _current.set(ticket)
    try:
        yield ticket
    finally:
        _current.reset(token)


class Pool:
    """At most ``limit`` holders at once; the next one is refused at once.

    Args:
        name: what it counts, for messages and metrics.
        limit: slots.
        metrics: counts refusals (``headscope_rejections_total{reason}``) and use.
        reason: the refusal's metrics label.
    """

    def __init__(self, name: str, limit: int, metrics: Metrics, reason: str):
        self.name, self.limit, self.metrics, self.reason = name, max(1, limit), metrics, reason
        self.in_use = 0

    @property
    def full(self) -> bool:
        return self.in_use >= self.limit

    def _gauge(self) -> None:
        self.metrics.admitted.labels(self.name).set(self.in_use)

    def acquire(self) -> None:
        """Take a slot, or raise :class:`QueueFullError` at once; :meth:`release` gives it back."""
        if self.full:
            self.metrics.rejections.labels(self.reason).inc()
            raise QueueFullError(f"the server is busy ({self.limit} {self.name} requests in progress); retry shortly")
        self.in_use += 1
        self._gauge()

    def release(self) -> None:
        self.in_use -= 1
        self._gauge()

    @contextmanager
    def slot(self) -> Iterator[None]:
        """Hold one slot for the duration, or raise :class:`QueueFullError` at once."""
        self.acquire()
        try:
            yield
        finally:
            self.release()


class DecodePool:
    """Decodes share a memory budget, and only ``concurrency`` of them run at once.

    Args:
        budget_bytes: the sum of the estimated peaks of the decodes in progress or waiting.
        concurrency: decodes running at once (threads); the others wait their turn.
        metrics: counts refusals.
    """

    def __init__(self, budget_bytes: int, concurrency: int, metrics: Metrics):
        self.budget = budget_bytes
        self.concurrency = max(1, concurrency)
        self.reserved = 0
        self.metrics = metrics
        self._running = asyncio.Semaphore(self.concurrency)

    def check(self, peak_bytes: int) -> None:
        """Raise :class:`TooLargeToDecode` (413) when ``peak_bytes`` alone is over the budget."""
        if peak_bytes > self.budget:
            self.metrics.rejections.labels("decode_too_large").inc()
            raise TooLargeToDecode(
                f"decoding this picture would take about {peak_bytes / MiB:,.0f} MiB, over the "
                f"{self.budget / MiB:,.0f} MiB decode budget; send a smaller picture (fewer pixels or 8-bit colour)"
            )

    @asynccontextmanager
    async def reserve(self, peak_bytes: int) -> AsyncIterator[None]:
        """Wait for a decode thread, then reserve ``peak_bytes`` beside the decodes running;
        release both afterwards.

        A decode waiting for its thread holds nothing of the budget: the budget bounds the
        memory the running decodes allocate, and the upload slots bound how many wait. (It used
        to be reserved on arrival, so at concurrency 64 the reservations of pictures merely
        waiting, about 20 MiB each for a 640 x 480 JPEG, refused a third of them with 429 while
        the decodes in progress used a fraction of it.)

        Raises:
            TooLargeToDecode: the estimate alone is over the budget (413, before waiting).
            QueueFullError: given a thread, it does not fit next to the decodes running (429).
        """
        self.check(peak_bytes)
        async with self._running:
            if self.reserved + peak_bytes > self.budget:
                self.metrics.rejections.labels("decode_busy").inc()
                raise QueueFullError(
                    f"the server is busy decoding other pictures ({self.reserved / MiB:,.0f} MiB in use); retry shortly"
                )
            self.reserved += peak_bytes
            self.metrics.decode_bytes.set(self.reserved)
            try:
                yield
            finally:
                self.reserved -= peak_bytes
                self.metrics.decode_bytes.set(self.reserved)


class Admission:
    """All of the server's admission policy: request pools, the decode budget, large answers.

    Args:
        limit: upload slots (``HEADSCOPE_MAX_QUEUE``). ``limit``, ``in_use``, ``full`` and
            :meth:`slot` are the upload pool's, as before there were several pools.
        metrics: counts refusals and use.
        follow_ups: follow-up slots.
        heavy: heavy slots.
        decode_budget_bytes: see :class:`DecodePool`.
        decodes: decodes running at once.
        large_answers: large answers in flight at once.
        large_answer_bytes: from this size on an answer is large.
        timeout_s: every admitted request's deadline, from admission.
        per_client: slots of a class one client address may hold at once (its share; a class
            not named: the whole pool).
    """

    def __init__(
        self,
        limit: int,
        metrics: Metrics,
        *,
        follow_ups: int = 16,
        heavy: int = 2,
        decode_budget_bytes: int = 512 * MiB,
        decodes: int = 2,
        large_answers: int = 4,
        large_answer_bytes: int = 8 * MiB,
        timeout_s: float = 60.0,
        per_client: dict[str, int] | None = None,
    ):
        self.metrics = metrics
        self.per_client = per_client or {}
        self._by_client: dict[tuple[str, str], int] = {}
        self.pools = {
            UPLOAD: Pool(UPLOAD, limit, metrics, "queue_full"),
            FOLLOW_UP: Pool(FOLLOW_UP, follow_ups, metrics, "follow_ups_full"),
            HEAVY: Pool(HEAVY, heavy, metrics, "heavy_full"),
        }
        self.decode = DecodePool(decode_budget_bytes, decodes, metrics)
        self.large = Pool("large_answer", large_answers, metrics, "large_answers_full")
        self.large_answer_bytes = large_answer_bytes
        self.timeout_s = timeout_s
        self._before_queue = 0
        self._listeners: list[Callable[[], None]] = []

    @classmethod
    def from_settings(cls, settings: Settings, metrics: Metrics, device_type: str = "cpu") -> Admission:
        return cls(
            settings.max_queue,
            metrics,
            follow_ups=settings.max_follow_ups,
            heavy=settings.max_heavy,
            decode_budget_bytes=settings.decode_budget_bytes,
            decodes=settings.decodes(device_type),
            large_answers=settings.max_large_answers,
            large_answer_bytes=settings.large_answer_bytes,
            timeout_s=settings.request_timeout_s,
            per_client={UPLOAD: settings.uploads_per_client, HEAVY: settings.heavy_per_client},
        )

    # -- the upload pool, under the names it had when it was the only one ------------------
    @property
    def limit(self) -> int:
        return self.pools[UPLOAD].limit

    @property
    def in_use(self) -> int:
        return self.pools[UPLOAD].in_use

    @property
    def full(self) -> bool:
        return self.pools[UPLOAD].full

    @property
    def uploads_to_queue(self) -> int:
        """Admitted uploads whose forward is not queued yet (their body arriving, or decoding):
        the company a batch may wait for. One computed, or cached, and only answering is not
        among them; one waiting for its model to load is (it will queue a forward)."""
        return self._before_queue

    def on_upload_queued(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` (on the event loop) whenever an upload stops being awaited company:
        queued, or over without a forward (a cached picture, a refused one)."""
        self._listeners.append(listener)

    def _upload_queued(self) -> None:
        self._before_queue -= 1
        for listener in self._listeners:
            listener()

    def slot(self) -> AbstractContextManager[None]:
        """Hold an upload slot (429 at once when none is free)."""
        return self.pools[UPLOAD].slot()

    # -- requests ----------------------------------------------------------------------------
    @contextmanager
    def admit(
        self,
        cls: str,
        client_left: Disconnected | None = None,
        fault: str | None = None,
        client: str | None = None,
    ) -> Iterator[Ticket]:
        """Hold a slot of ``cls``'s pool and make its :class:`Ticket` current for the block.

        Args:
            client: the client's address: it holds at most its share of the pool
                (``per_client``), so that one client cannot take every slot.

        Raises:
            QueueFullError: the pool is full, or this client holds its share (429).
        """
        with self._client_share(cls, client), self.pools[cls].slot():
            ticket = Ticket(cls, time.monotonic() + self.timeout_s, client_left, fault, self.timeout_s, client)
            if cls == UPLOAD:
                self._before_queue += 1
                ticket._on_queued = self._upload_queued
            try:
                with using(ticket):
                    yield ticket
            finally:
                ticket.close()

    @contextmanager
    def _client_share(self, cls: str, client: str | None) -> Iterator[None]:
        share = self.per_client.get(cls)
        if share is None or client is None:
            yield
            return
        key = (cls, client)
        held = self._by_client.get(key, 0)
        if held >= share:
            self.metrics.rejections.labels(f"{cls}_client_share").inc()
            raise QueueFullError(
                f"this client already has {held} {cls} requests in progress (its share of the server's "
                f"{self.pools[cls].limit}); retry when one has finished"
            )
        self._by_client[key] = held + 1
        try:
            yield
        finally:
            left = self._by_client[key] - 1
            if left:
                self._by_client[key] = left
            else:
                del self._by_client[key]

    def client_share(self, cls: str) -> int | None:
        """The slots of ``cls`` one client may hold (None: the whole pool)."""
        return self.per_client.get(cls)

    def decoding(self, peak_bytes: int):
        """``async with``: reserve decode memory and a decode thread (see :class:`DecodePool`)."""
        return self.decode.reserve(peak_bytes)

    def large_answer(self, nbytes: int, ticket: Ticket | None = None) -> None:
        """Hold a large-answer slot for the rest of the request (until its answer is sent) when
        the answer is ``nbytes`` or more; 429 when every large-answer slot is taken.

        Outside a request (no ticket: the command line, unit tests) nothing is held.
        """
        ticket = ticket or current_ticket()
        if nbytes >= self.large_answer_bytes and ticket is not None:
            ticket.hold(self.large)
