"""The worker's answer threads: on CUDA answers are built beside the worker thread (the next
forward overlaps them); on the CPU every torch op stays on the one worker thread, as before."""

from __future__ import annotations

import asyncio
import threading

import torch

from headscope.serving.worker import Worker


def test_overlap_is_chosen_by_device():
    assert Worker(torch.device("cpu")).overlap is False
    assert Worker(torch.device("cuda")).overlap is True  # constructing it needs no GPU


def _threads_of(worker: Worker, *methods: str) -> list[str]:
    async def go() -> list[str]:
        await worker.start()
        try:
            return [await getattr(worker, m)(lambda: threading.current_thread().name) for m in methods]
        finally:
            await worker.stop(1)

    return asyncio.run(go())


def test_answers_run_on_the_worker_thread_on_the_cpu():
    assert _threads_of(Worker(torch.device("cpu")), "run_answer")[0].startswith("headscope-worker")


def test_answers_run_on_answer_threads_where_they_overlap():
    w = Worker(torch.device("cpu"))
    # what CUDA chooses, forced here: the answer pool beside the worker thread
    from concurrent.futures import ThreadPoolExecutor

    w._answers = ThreadPoolExecutor(2, thread_name_prefix="headscope-answer")
    answer, forward = _threads_of(w, "run_answer", "run_in_worker")
    assert answer.startswith("headscope-answer") and forward.startswith("headscope-worker")
