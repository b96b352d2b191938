"""The inference worker: one thread that owns the device, fed by a priority queue.

The worker thread runs the device work, one item at a time: forward passes
(:meth:`Worker.submit`, dynamic batches) and calls (:meth:`Worker.run_in_worker`: relevance,
the ablation works, statistics, model loading). Answers (:meth:`Worker.run_answer`: slicing a
capture, the copy of the slice to the host, encoding) run, on CUDA, on answer threads beside
it: the copy goes into pinned memory without blocking and the answer thread waits for it on a
CUDA event (:func:`app.engine.device.to_host`), so the next batch's forward is queued while the
previous batch's answers are copied and encoded, and an error in one answer fails that request
alone. On the CPU answers run on the worker thread too (a second thread running torch ops gets
its own OpenMP team, and every forward is then ~16 % slower on 2 cores); ``answer_threads``
overrides the choice. The thread is the bottleneck, so
what runs next is chosen by priority, not by arrival: each item carries its request's priority
(``admission.py``: uploads 0, follow-ups 1, heavy work 2; lowest first, then first come), so a
new upload's forward runs before the follow-up work queued ahead of it. Only the item running
at the time is waited for.

Forwards are batched as in LitServe's loop: the first job of a batch waits up to
``max_wait_ms`` for company while more uploads are admitted than the batch holds, up to
``max_batch_size``; the batch is grouped by model, input shape and capture strategy. Failures
stay with the request that caused them: a batch that raises is rerun one job at a time, and an
out-of-memory batch is split in halves until it fits (a single job that still does not fit gets
503). A job is a capture, or another batchable computation (:class:`BatchWork`: a relevance
map, one perturbed forward of a faithfulness test; app/serving/relevance.py): jobs of one key
(model, input shape, ablation and the work's own key) run in one call, and a batch takes the
waiting jobs of its first job's key before any other.

Deadlines: a job or call whose request's deadline passes while it waits is dropped (504), and
so is one whose client went away (499); neither costs worker time. One already running cannot
be stopped; its caller stops waiting at the deadline.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from ..engine import analysis
from ..engine.batching import BatchRunner, OutOfMemory, groups, split_on_oom
from ..engine.capture_base import CapturedAttention
from ..engine.device import autocast_dtype, exact_fp32, exact_fp32_process, precision_name
from ..engine.model import LoadedModel
from ..engine.selection import Selection
from . import faults
from .admission import Admission, current_ticket
from .metrics import Metrics
from .waiting import wait_for_result

log = logging.getLogger(__name__)

ANSWER_THREADS = 4  # CUDA: answers built at once beside the worker thread


@dataclass
class Computed:
    """What a job gives back: the capture and where its time went."""

    att: CapturedAttention
    queue_ms: float
    compute_ms: float
    maps: tuple[Selection, torch.Tensor] | None = None  # Job.answer's maps, where the capture is


@dataclass
class Job:
    lm: LoadedModel
    pixels: torch.Tensor  # 3, H, W: uint8 RGB (normalised on the device), or float32 normalised
    deadline: float  # time.monotonic()
    fault: str | None = None
    materialise: bool = False  # keep full softmax maps from the unfused branch (every row wanted)
    ablate: tuple[tuple[int, int], ...] = ()  # (layer, head) pairs removed for this forward
    priority: int = 0  # lower runs first (admission.PRIORITY)
    # A batchable computation other than the capture (a relevance map, a perturbed forward):
    # None for the capture. Jobs whose works have equal keys run in one call of its ``run``.
    work: BatchWork | None = None
    # The selection the request will answer, of its capture: the worker computes those maps
    # for the whole batch at once (one product per layer) before answers are built one by one.
    answer: Callable[[CapturedAttention], Selection] | None = None
    # Cancelled before it ran, it counts as a request refused before compute; False for one of a
    # faithfulness test's perturbed forwards (the test, which may queue hundreds, counts once).
    counted: bool = True
    future: asyncio.Future = field(init=False, repr=False)  # set by Worker.submit
    enqueued: float = field(default_factory=time.monotonic)
    started: float = 0.0

    @property
    def key(self) -> tuple:
        base = (self.lm.id, tuple(self.pixels.shape), self.materialise, self.ablate)
        return base if self.work is None else (*base, *self.work.key)

    def done(
        self, att: CapturedAttention, finished: float, maps: tuple[Selection, torch.Tensor] | None = None
    ) -> Computed:
        return Computed(att, (self.started - self.enqueued) * 1000, (finished - self.started) * 1000, maps)


class BatchWork(Protocol):
    """What a :class:`Job` other than a capture computes (app/serving/relevance.py has two)."""

    @property
    def key(self) -> tuple:
        """Jobs with equal keys (and equal model, input shape and ablation) share one ``run``."""
        ...

    def run(self, runner: BatchRunner, jobs: list[Job]) -> list[Any]:
        """One result per job, on the worker thread with the model's lock held."""
        ...


@dataclass
class Call:
    """A function to run on the worker thread for a request."""

    fn: Callable[..., Any]
    args: tuple
    priority: int
    deadline: float | None
    fault: str | None = None
    future: asyncio.Future = field(init=False, repr=False)  # set by Worker.call


class Worker:
    """Owns the device; turns queued :class:`Job` s into :class:`ImageAttention` results.

    Args:
        device: where the models run.
        precision: ``fp32`` (the default), ``bf16``, ``fp16`` or ``auto`` (see
            :func:`app.engine.device.autocast_dtype`).
        max_batch_size: most images in one forward pass.
        max_wait_ms: how long the first job of a batch waits for company.
        admission: the server's admission; how many requests hold a slot decides whether a
            batch waits for company.
        metrics: where batch sizes, compute times and errors are counted.
        capture_store: ``device`` keeps captures where the forward ran (views of its tensors,
            no transfer); ``host`` moves them to host memory.
        answer_threads: threads that build answers beside the worker thread; None for the
            device's default (``ANSWER_THREADS`` on CUDA, none on the CPU and MPS: answers run
            on the worker thread).
    """

    def __init__(
        self,
        device: torch.device,
        precision: str = "fp32",
        max_batch_size: int = 8,
        max_wait_ms: float = 5.0,
        admission: Admission | None = None,
        metrics: Metrics | None = None,
        capture_store: str = "device",
        answer_threads: int | None = None,
    ):
        self.device = device
        self.capture_to = "cpu" if capture_store == "host" else None
        self._free_memory: Callable[[], int] | None = None
        self.amp_dtype = autocast_dtype(device.type, precision)
        self.precision = precision_name(self.amp_dtype)  # what every answer's metadata says
        self._runners: dict[int, BatchRunner] = {}
        self.max_batch_size = max(1, max_batch_size)
        self.max_wait = max_wait_ms / 1000.0
        self.metrics = metrics or Metrics()
        self.admission = admission or Admission(32, self.metrics)
        self._jobs: list[tuple[int, int, Job]] = []  # heaps of (priority, arrival, item)
        self._calls: list[tuple[int, int, Call]] = []
        self._seq = itertools.count()
        self._drop_soon = False  # drop_cancelled is scheduled
        # A batch waiting for company looks again when an awaited upload queues or is over.
        self.admission.on_upload_queued(lambda: self._wake.set())
        # Bound to the running loop at first use (start() makes a fresh one for each run).
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="headscope-worker")
        # CUDA: answers are sliced, copied to the host and encoded on threads of their own, so
        # the next batch's forward is queued on the GPU meanwhile. The CPU keeps one thread for
        # every torch op (a second OpenMP team costs each forward ~16 % on 2 cores).
        if answer_threads is None:
            answer_threads = ANSWER_THREADS if device.type == "cuda" else 0
        self.overlap = answer_threads > 0
        self._answers = (
            ThreadPoolExecutor(max_workers=answer_threads, thread_name_prefix="headscope-answer")
            if self.overlap
            else None
        )
        self.inflight = 0
        self.batches_run = 0
        self.max_batch_seen = 0
        self.jobs_computed = 0

    # -- lifecycle -------------------------------------------------------------------------
    def on_out_of_memory(self, free: Callable[[], int]) -> None:
        """Call ``free`` when a forward runs out of device memory, before the retry; it frees
        what it can (cached captures kept in device memory) and returns the bytes it freed."""
        self._free_memory = free

    async def start(self) -> None:
        # Admission bounds what can be queued; the queue itself needs no second bound.
        # The server owns its process: TF32 off for good, so that threads entering and leaving
        # exact_fp32() at once (the answer threads on CUDA) only ever restore "off".
        exact_fp32_process()
        self._wake = asyncio.Event()
        self._task = asyncio.create_task(self._loop(), name="headscope-worker")

    async def stop(self, grace_s: float = 20.0) -> None:
        """Finish queued and running jobs within ``grace_s``, then stop."""
        if self._task is None:
            return
        end = time.monotonic() + grace_s
        while (self.depth or self.inflight) and time.monotonic() < end:
            await asyncio.sleep(0.05)
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass
        self._task = None
        self._executor.shutdown(wait=False, cancel_futures=True)
        if self._answers is not None:
            self._answers.shutdown(wait=False, cancel_futures=True)

    async def run_in_worker(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn`` on the worker thread (model loading, slicing, encoding) and await it.

        Every torch op runs on this one thread: a second thread that runs parallel torch ops
        gets its own OpenMP team, and from then on every forward is ~16 % slower on a 2-core
        machine (bench/: lock-step A/B, 0.82-0.84x).

        The call runs at the priority of the current request (its admission ticket) and is
        dropped with ``asyncio.TimeoutError`` when the request's deadline passes before it
        starts, or with :class:`ClientGone` when its client leaves; outside a request (start-up)
        it has priority 0 and no deadline.
        """
        ticket = current_ticket()
        if self._task is None:  # not started (command line, unit tests): run it now
            return await asyncio.get_running_loop().run_in_executor(self._executor, _exact(fn), *args)
        call = Call(
            fn,
            args,
            ticket.priority if ticket else 0,
            ticket.deadline if ticket else None,
            ticket.fault if ticket and ticket.priority > 0 else None,
        )
        call.future = asyncio.get_running_loop().create_future()
        call.future.add_done_callback(self._given_up)
        heapq.heappush(self._calls, (call.priority, next(self._seq), call))
        self.metrics.queue_depth.set(self.depth)
        self._wake.set()
        return await wait_for_result(call.future, call.deadline, ticket.client_left if ticket else None)

    async def run_answer(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Build an answer from a computed result (slicing, the copy to the host, encoding).

        On the CPU this is :meth:`run_in_worker` (every torch op on the one worker thread). On
        CUDA it runs on one of the answer threads right away, beside the worker thread, so the
        next batch's forward overlaps this answer's encoding; the request's deadline and its
        client are still watched.
        """
        if self._answers is None or self._task is None:
            return await self.run_in_worker(fn, *args)
        ticket = current_ticket()
        fut = asyncio.get_running_loop().run_in_executor(self._answers, _exact(fn), *args)
        deadline, gone = (ticket.deadline, ticket.client_left) if ticket else (None, None)
        return await wait_for_result(fut, deadline, gone)

    async def run_after_forwards(self, fn: Callable[..., Any], *args: Any) -> Any:
        """:meth:`run_in_worker` for work that can wait (the statistics of an image already
        captured). The priority queue already runs every upload's forward, queued before or
        while this waits, ahead of a follow-up's call, and the request's deadline bounds the
        wait; kept as its own name for the callers that say they can wait."""
        return await self.run_in_worker(fn, *args)

    @property
    def depth(self) -> int:
        """Items waiting for the worker thread (forward jobs and calls)."""
        return len(self._jobs) + len(self._calls)

    def drop_cancelled(self) -> None:
        """Take the queued jobs whose futures are done (cancelled) out of the queue now, not when
        a batch would have pulled them: a test given up leaves no queue depth behind. Event loop
        only, as the queue."""
        self._drop_soon = False
        dead = [e for e in self._jobs if e[2].future.done()]
        dead_calls = [e for e in self._calls if e[2].future.done()]
        if not (dead or dead_calls):
            return
        if dead:
            self._jobs = [e for e in self._jobs if not e[2].future.done()]
            heapq.heapify(self._jobs)
        if dead_calls:
            self._calls = [e for e in self._calls if not e[2].future.done()]
            heapq.heapify(self._calls)
        for _, _, job in dead:
            if job.counted:
                self.metrics.rejections.labels("cancelled_before_compute").inc()
        for _ in dead_calls:
            self.metrics.rejections.labels("cancelled_before_compute").inc()
        self.metrics.queue_depth.set(self.depth)

    # -- submission ------------------------------------------------------------------------
    def submit(self, job: Job) -> asyncio.Future:
        """Queue a job; its future resolves to a :class:`Computed` or an exception."""
        job.future = asyncio.get_running_loop().create_future()
        job.future.add_done_callback(self._given_up)
        heapq.heappush(self._jobs, (job.priority, next(self._seq), job))
        ticket = current_ticket()
        if ticket is not None:
            ticket.queued()
        self._wake.set()
        self.metrics.queue_depth.set(self.depth)
        return job.future

    def _given_up(self, fut: asyncio.Future) -> None:
        """A queued item cancelled (its client gone, its deadline passed) leaves the queue soon,
        once for a burst of them, not when a batch would have pulled it: ``queue_depth`` counts
        only work somebody waits for, also while a long call holds the worker."""
        if fut.cancelled() and not self._drop_soon:
            self._drop_soon = True
            asyncio.get_running_loop().call_soon(self.drop_cancelled)

    @property
    def running(self) -> bool:
        """Whether the loop runs (else :meth:`compute` runs each job at once, alone)."""
        return self._task is not None

    async def compute(self, job: Job) -> Any:
        """Queue ``job`` and await its result (batched with other jobs of its key that are
        waiting meanwhile, up to ``max_batch_size``; its own error raised). Not started (command
        line, unit tests): run it now, alone."""
        if self._task is None:
            res = (await asyncio.get_running_loop().run_in_executor(self._executor, self._run, [job]))[0]
            if isinstance(res, BaseException):
                raise res
            return res
        fut = self.submit(job)
        try:
            return await fut
        except BaseException:
            if not fut.done():
                fut.cancel()
            raise

    # -- the loop --------------------------------------------------------------------------
    async def _next(self) -> Job | Call:
        """The waiting item with the lowest (priority, arrival); waits while there is none."""
        while not (self._jobs or self._calls):
            self._wake.clear()
            await self._wake.wait()
        if self._calls and (not self._jobs or self._calls[0][:2] < self._jobs[0][:2]):
            item: Job | Call = heapq.heappop(self._calls)[2]
        else:
            item = heapq.heappop(self._jobs)[2]
        self.metrics.queue_depth.set(self.depth)  # also when the item is dropped unrun
        return item

    async def _collect(self, first: Job) -> list[Job]:
        batch = [first]
        end = time.monotonic() + self.max_wait
        while len(batch) < self.max_batch_size:
            self._fill(batch)
            # Wait for company only while admitted uploads have yet to queue their forward: a
            # lone request (concurrency 1) or the last of a burst starts at once, also while the
            # burst's earlier uploads hold their slots to send answers already computed.
            # Without uploads (a task's perturbed forwards), the whole wait.
            if self.admission.in_use > 0:
                want = min(self.max_batch_size, len(batch) + self.admission.uploads_to_queue)
            else:
                want = self.max_batch_size
            timeout = end - time.monotonic()
            if len(batch) >= want or timeout <= 0:
                break
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), timeout)
            except asyncio.TimeoutError:
                break
        self._fill(batch)  # already waiting: no reason to leave them
        self.metrics.queue_depth.set(self.depth)
        return batch

    def _fill(self, batch: list[Job]) -> None:
        """Add waiting jobs to ``batch`` up to ``max_batch_size``: first those that share the first
        job's key (one forward: a faithfulness test's perturbed forwards queue behind another
        test's), then the others in (priority, arrival) order."""
        room = self.max_batch_size - len(batch)
        if room <= 0 or not self._jobs:
            return
        key = batch[0].key
        same = sorted(e for e in self._jobs if e[2].key == key)[:room]
        if same:
            taken = {id(e[2]) for e in same}
            self._jobs = [e for e in self._jobs if id(e[2]) not in taken]
            heapq.heapify(self._jobs)
            batch.extend(e[2] for e in same)
        while self._jobs and len(batch) < self.max_batch_size:
            batch.append(heapq.heappop(self._jobs)[2])

    def _live(self, jobs: list[Job]) -> list[Job]:
        now = time.monotonic()
        live = []
        for j in jobs:
            if j.future.done():  # cancelled: deadline hit or client gone
                if j.counted:
                    self.metrics.rejections.labels("cancelled_before_compute").inc()
            elif now > j.deadline:
                self.metrics.rejections.labels("deadline_before_compute").inc()
                j.future.set_exception(asyncio.TimeoutError())
            else:
                live.append(j)
        return live

    async def _loop(self) -> None:
        while True:
            item = await self._next()
            if isinstance(item, Call):
                await self._call(item)
            else:
                await self._batch(await self._collect(item))

    async def _call(self, call: Call) -> None:
        fut = call.future
        if fut.done():  # cancelled: deadline hit or client gone
            self.metrics.rejections.labels("cancelled_before_compute").inc()
            return
        if call.deadline is not None and time.monotonic() > call.deadline:
            self.metrics.rejections.labels("deadline_before_compute").inc()
            fut.set_exception(asyncio.TimeoutError())
            return
        self.inflight = 1
        self.metrics.queue_depth.set(self.depth)
        try:
            fn = _exact(call.fn if call.fault is None else _delayed(call.fn, call.fault))
            result = await asyncio.get_running_loop().run_in_executor(self._executor, fn, *call.args)
        except asyncio.CancelledError:
            if not fut.done():
                fut.cancel()
            raise
        except BaseException as e:
            if not fut.done():
                fut.set_exception(e)
        else:
            if not fut.done():
                fut.set_result(result)
        finally:
            self.inflight = 0

    async def _batch(self, batch: list[Job]) -> None:
        loop = asyncio.get_running_loop()
        self.inflight = len(batch)
        try:
            for idx in groups([j.key for j in batch], self.max_batch_size):
                live = self._live([batch[i] for i in idx])
                if not live:
                    continue
                results = await loop.run_in_executor(self._executor, self._run, live)
                for j, r in zip(live, results):
                    if j.future.done():
                        continue
                    if isinstance(r, BaseException):
                        j.future.set_exception(r)
                    else:
                        j.future.set_result(r)
        except asyncio.CancelledError:
            for j in batch:
                if not j.future.done():
                    j.future.cancel()
            raise
        except Exception:  # never let the loop die
            log.exception("worker loop error")
            for j in batch:
                if not j.future.done():
                    j.future.set_exception(RuntimeError("worker error"))
        finally:
            self.inflight = 0

    # -- compute (worker thread) ------------------------------------------------------------
    def runner(self, lm: LoadedModel) -> BatchRunner:
        """The batch runner of ``lm`` (one per model object; the worker's precision)."""
        r = self._runners.get(id(lm))
        if r is None or r.lm is not lm:
            r = self._runners[id(lm)] = BatchRunner(lm, self.amp_dtype, self.max_batch_size, self.capture_to)
        return r

    def _run(self, jobs: list[Job]) -> list[Any]:
        """One batch on the worker thread, with the out-of-memory split (engine/batching.py)."""

        def failed(e: BaseException) -> None:
            name = "oom" if isinstance(e, OutOfMemory) else type(e).__name__
            self.metrics.errors.labels(name).inc()
            if not isinstance(e, OutOfMemory):
                # With the traceback: a bug in the capture code is a 500 whose only other trace is
                # the answer's one line (which has the request id; the job does not carry it). Not
                # for a test's injected fault: its traceback ends in faults.inject and says nothing.
                # No client text: the model id is configured or a name from timm's list.
                kind = type(jobs[0].work).__name__ if jobs[0].work is not None else "capture"
                log.error(
                    "compute failed: %s (%s on %s, one picture of a batch of %d)",
                    type(e).__name__,
                    kind,
                    jobs[0].lm.id,
                    len(jobs),
                    exc_info=None if isinstance(e, faults.InjectedFault) else e,
                )

        return split_on_oom(
            self._forward,
            jobs,
            self.device,
            free=self._free_memory,
            on_split=lambda n: self.metrics.oom_splits.inc(),
            on_error=failed,
        )

    def _forward(self, jobs: list[Job]) -> list[Any]:
        lm = jobs[0].lm
        start = time.monotonic()
        for j in jobs:
            j.started = start
        faults.inject([j.fault for j in jobs])
        work = jobs[0].work
        runner = self.runner(lm)
        with lm.lock:
            if work is not None:
                with runner.numerics():
                    out = work.run(runner, jobs)
            else:
                results = runner.capture(
                    [j.pixels for j in jobs], materialise=jobs[0].materialise, ablate=jobs[0].ablate
                )
        end = time.monotonic()
        self.metrics.batch_size.observe(len(jobs))
        self.metrics.compute_seconds.observe(end - start)
        self.batches_run += 1
        self.jobs_computed += len(jobs)
        self.max_batch_seen = max(self.max_batch_seen, len(jobs))
        if work is not None:
            return out
        maps = _answer_maps(jobs, results)
        return [j.done(att, end, m) for j, att, m in zip(jobs, results, maps)]


# Maps computed ahead for the answer are kept beside the capture until the answer is built:
# at most this many floats per image (4 MiB; CLS rows of every head and layer are ~30 K).
ANSWER_MAPS_MAX_FLOATS = 1 << 20


def _answer_maps(jobs: list[Job], atts: Sequence[Any]) -> list[tuple[Selection, torch.Tensor] | None]:
    """Each job's :attr:`Job.answer` maps, computed for the batch-mates that ask the same
    selection at once (:func:`app.engine.analysis.batch_mates_tensors`), left where the capture
    is (an answer thread copies its own). None where a job asks none, its selection fails (its
    answer reports that), or the maps are large (its answer computes them, as before)."""
    sels: list[Selection | None] = []
    for j, att in zip(jobs, atts):
        sel = None
        if j.answer is not None:
            try:
                sel = j.answer(att)
            except Exception:  # a bad selection: its answer gives the error
                sel = None
        sels.append(sel)
    tensors = analysis.batch_mates_tensors(atts, sels, host=False, max_floats=ANSWER_MAPS_MAX_FLOATS)
    return [None if t is None or sel is None else (sel, t) for sel, t in zip(sels, tensors)]


def _exact(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` with TF32 off (fp32 means fp32 for everything the worker runs: relevance's
    backward, the ablation works, ...)."""

    def run(*args: Any) -> Any:
        with exact_fp32():
            return fn(*args)

    return run


def _delayed(fn: Callable[..., Any], fault: str) -> Callable[..., Any]:
    """``fn`` preceded by an injected fault (tests only; see :func:`faults.inject`)."""

    def run(*args: Any) -> Any:
        faults.inject([fault])
        return fn(*args)

    return run
