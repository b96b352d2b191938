"""Long tasks: one per key, progress, a bound on how many run, cancelled when every client left,
kept running (and cached by their owner) when a request merely timed out."""

from __future__ import annotations

import asyncio
import gc
import time
import weakref

import pytest

from headscope.serving.admission import QueueFullError
from headscope.serving.tasks import TaskProgress, Tasks
from headscope.serving.waiting import ClientGone
from helpers.waiting import until


def far() -> float:
    return time.monotonic() + 30


def gated(gate: asyncio.Event, value):
    """A task's work that waits for ``gate``, then gives ``value``."""

    async def work(progress):
        await gate.wait()
        return value

    return work


def test_progress_reports_fraction_and_eta():
    p = TaskProgress("importance", total=10)
    assert p.as_dict()["eta_s"] is None and p.as_dict()["fraction"] == 0
    p.advance(4, "block 2")
    d = p.as_dict()
    assert (d["state"], d["stage"], d["done"], d["total"], d["fraction"]) == ("running", "block 2", 4, 10, 0.4)
    assert d["eta_s"] is not None and d["eta_s"] >= 0
    p.advance(100)
    assert p.as_dict()["fraction"] == 1.0


def test_same_key_runs_once_and_every_waiter_gets_the_result():
    async def main():
        tasks = Tasks(limit=2)
        started = []
        gate = asyncio.Event()

        async def work(progress):
            started.append(progress)
            progress.total = 2
            progress.advance(1, "half")
            await gate.wait()
            progress.advance(1, "done")
            return {"value": 42}

        a = asyncio.create_task(tasks.run("k", "importance", work, far()))
        b = asyncio.create_task(tasks.run("k", "importance", work, far()))
        await until(lambda: started and tasks.progress("k").stage == "half", 30, "the work's first step")
        assert len(started) == 1
        gate.set()
        assert await a == await b == {"value": 42}
        await until(lambda: len(tasks) == 0, 30, "the finished task to be forgotten")
        assert tasks.progress("k") is None

    asyncio.run(main())


def test_at_most_limit_tasks_at_once():
    async def main():
        tasks = Tasks(limit=1)
        gate = asyncio.Event()

        work = gated(gate, 1)
        a = asyncio.create_task(tasks.run("a", "importance", work, far()))
        await until(lambda: len(tasks) == 1, 30, "the first task to start")
        with pytest.raises(QueueFullError):
            await tasks.run("b", "importance", work, far())
        gate.set()
        assert await a == 1

    asyncio.run(main())


def test_a_timed_out_request_leaves_the_task_running():
    async def main():
        tasks = Tasks()
        finished, release = asyncio.Event(), asyncio.Event()

        async def work(progress):
            await release.wait()  # past the request's deadline
            finished.set()
            return "late"

        with pytest.raises(asyncio.TimeoutError):
            await tasks.run("k", "importance", work, time.monotonic() + 0.05)
        assert tasks.progress("k") is not None  # still running
        release.set()
        await asyncio.wait_for(finished.wait(), 5)
        assert finished.is_set()

    asyncio.run(main())


def test_the_task_is_cancelled_once_every_client_has_gone():
    async def main():
        tasks = Tasks()
        cancelled = asyncio.Event()
        gone = {"a": asyncio.Event(), "b": asyncio.Event()}

        async def work(progress):
            try:
                await asyncio.Event().wait()  # runs until cancelled
            except asyncio.CancelledError:
                cancelled.set()
                raise

        def client(name):
            async def client_left():
                await gone[name].wait()

            return asyncio.create_task(tasks.run("k", "importance", work, far(), client_left))

        a, b = client("a"), client("b")
        await until(lambda: tasks.progress("k") is not None, 30, "the task to start")
        gone["a"].set()
        with pytest.raises(ClientGone):
            await a
        await asyncio.sleep(0)  # a cancel a's leaving had asked for would be delivered now
        assert not cancelled.is_set() and not b.done(), "b still waits: the task goes on"
        gone["b"].set()
        with pytest.raises(ClientGone):
            await b
        await asyncio.wait_for(cancelled.wait(), 5)
        await until(lambda: len(tasks) == 0, 30, "the cancelled task to be forgotten")

    asyncio.run(main())


def test_a_task_left_to_run_on_is_not_cancelled_by_a_client_that_joins_and_leaves():
    """#39 item 1: a ``wait=0`` start (its deadline passes at once) keeps the task; a second
    client that joins and disconnects leaves it running, and it delivers its result."""

    async def main():
        tasks = Tasks()
        release = asyncio.Event()

        async def work(progress):
            await release.wait()
            return "done"

        with pytest.raises(asyncio.TimeoutError):  # the wait=0 starter
            await tasks.run("k", "faithfulness", work, time.monotonic())
        gone = asyncio.Event()
        joiner = asyncio.create_task(tasks.run("k", "faithfulness", work, far(), gone.wait))
        await asyncio.sleep(0.05)
        gone.set()
        with pytest.raises(ClientGone):
            await joiner
        assert tasks.progress("k") is not None, "the joiner's disconnect cancelled the starter's task"
        release.set()
        assert await tasks.run("k", "faithfulness", work, far()) == "done"

    asyncio.run(main())


def test_a_failing_task_fails_its_waiters_and_frees_the_key():
    async def main():
        tasks = Tasks()

        async def work(progress):
            raise ValueError("boom")

        with pytest.raises(ValueError, match="boom"):
            await tasks.run("k", "importance", work, far())
        await until(lambda: len(tasks) == 0, 30, "the failed task to be forgotten")

    asyncio.run(main())


def test_the_work_of_an_admitted_task_is_not_refused_for_a_full_pool():
    """A faithfulness test answered 202 asks for its maps later, from the maps' pool: full of
    relevance requests then, it must still start them (bounded=False), or the accepted test died
    unseen (QueueFullError with nobody waiting)."""

    async def main():
        tasks = Tasks(limit=1, per_client=1)
        gate = asyncio.Event()

        work = gated(gate, "done")
        a = asyncio.create_task(tasks.run("a", "relevance", work, far()))
        await until(lambda: len(tasks) == 1, 30, "the first task to start")
        with pytest.raises(QueueFullError):
            tasks.join("b", "relevance", work)
        b = asyncio.create_task(tasks.run("b", "relevance", work, far(), bounded=False))
        await until(lambda: len(tasks) == 2, 30, "the admitted work to start beside it")
        gate.set()
        assert await a == await b == "done"

    asyncio.run(main())


def image_tasks():
    """An ImageTasks whose uploads are always there (its tasks' own logic only: no worker, no models)."""
    from types import SimpleNamespace

    from headscope.config import Settings
    from headscope.serving.cache import ByteLRU
    from headscope.serving.tasks import ImageTasks

    return ImageTasks(Settings(), SimpleNamespace(require=lambda image_id: object()), None, ByteLRU(2**20), None)


def test_a_task_that_fails_unwatched_tells_the_next_request():
    """A task left to run on (``wait`` ran out: 202) that fails with nobody waiting: the next
    request of its key gets that error once (it restarted silently, at 0 %, before); the one
    after starts the task again."""

    async def main():
        svc = image_tasks()
        gate, runs = asyncio.Event(), []

        class Activations:  # what a failed forward's frames hold (device memory after an OOM)
            pass

        alive: list[weakref.ref] = []

        async def compute(progress, upload):
            runs.append(1)
            await gate.wait()
            if len(runs) == 1:
                held = Activations()
                alive.append(weakref.ref(held))
                try:
                    raise RuntimeError("out of memory")
                except RuntimeError:  # chained, as OutOfMemory(...) from a CUDA error is
                    raise QueueFullError("the server is busy (4 long computations in progress)") from None
            return {"value": 1}

        first = await svc.result("k", "faithfulness", "img", compute, wait=0.01)
        assert "pending" in first and "cancel_token" in first["pending"]
        gate.set()
        await until(lambda: svc.tasks.progress("k") is None, 30, "the task to fail")
        kept = svc._failed["k"][0]
        assert kept.__traceback__ is None and kept.__context__ is None and kept.__cause__ is None
        for _ in range(5):  # the task's done callbacks, queued on the loop, let go of it
            await asyncio.sleep(0.01)
        gc.collect()
        assert alive and alive[0]() is None  # the failed frames are not kept with the error
        with pytest.raises(QueueFullError, match="busy"):
            await svc.result("k", "faithfulness", "img", compute, wait=5)
        assert len(runs) == 1  # told, not started again
        assert (await svc.result("k", "faithfulness", "img", compute, wait=5))["value"] == 1
        assert len(runs) == 2

    asyncio.run(main())


def test_a_failure_someone_waited_for_is_not_told_twice():
    async def main():
        svc = image_tasks()

        async def compute(progress, upload):
            raise ValueError("bad target")

        with pytest.raises(ValueError, match="bad target"):
            await svc.result("k", "faithfulness", "img", compute, wait=5)
        assert svc._failed == {}

    asyncio.run(main())


def test_another_tasks_work_takes_no_slot_of_the_pool_or_of_its_client():
    """A pruning curve starts its ranking as a task of its own (bounded=False): that task holds
    neither a slot of the pool nor one of the client's share, or one pruning request of a client
    with a share of 2 left it no room for another computation (429)."""
    from headscope.serving.admission import Ticket, using

    async def main():
        tasks = Tasks(limit=2, per_client=2)
        gate = asyncio.Event()

        ranking = gated(gate, "ranking")

        async def curve(progress):  # what a pruning task does: its ranking first, unbounded
            flight, _ = tasks.join("ranking", "importance", ranking, bounded=False)
            return await flight.wait(far()) + " then curve"

        other = gated(gate, "other")
        with using(Ticket("heavy", far(), client="10.0.0.1")):
            a = asyncio.create_task(tasks.run("curve", "pruning", curve, far()))
            await until(lambda: len(tasks) == 2, 30, "the curve and its ranking to start")
            b = asyncio.create_task(tasks.run("other", "importance", other, far()))  # the share's second
            await until(lambda: len(tasks) == 3, 30, "the client's second computation to start")
            with pytest.raises(QueueFullError):  # the pool's two slots: the curve and the other
                tasks.join("third", "importance", other)
        gate.set()
        assert await a == "ranking then curve" and await b == "other"

    asyncio.run(main())


def test_the_failure_of_a_task_left_to_run_on_is_told_though_another_task_waits_for_it():
    """A ranking left with a 202 (kept), joined by a pruning curve, that fails: the request that
    left it is told on its next call (not a silent restart at 0 %)."""

    async def main():
        svc = image_tasks()
        gate, runs = asyncio.Event(), []

        async def compute(progress, upload):
            runs.append(1)
            await gate.wait()
            raise ValueError("the ranking failed")

        first = await svc.result("k", "importance", "img", compute, wait=0.01)
        assert "pending" in first
        joined = asyncio.create_task(svc.result("k", "importance", "img", compute, deadline=far(), bounded=False))
        await until(lambda: svc.tasks._flights.get("k").holders == 1, 30, "the curve to hold the ranking")
        gate.set()
        with pytest.raises(ValueError, match="ranking failed"):
            await joined
        with pytest.raises(ValueError, match="ranking failed"):
            await svc.result("k", "importance", "img", compute, wait=5)
        assert len(runs) == 1  # told, not started again

    asyncio.run(main())
