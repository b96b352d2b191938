"""The local engine: one process, one model, pictures streamed through in batches.

Pictures are read a window at a time (``batch_size``) and put into buckets by input size (a
photo set has many aspect ratios, and one forward takes one size); a bucket runs as soon as it
holds a full batch, and when more than ``4 * batch_size`` pictures wait in part-filled buckets
the fullest runs anyway. Memory is bounded by those few pictures, one batch's capture and the
output buffer, whatever the number of pictures. On an accelerator the next window is read in a
background thread while the current batch computes; on the CPU reading stays inline (a
decoding thread would take a core from the forward's threads).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

from ..engine.batching import Buckets
from . import schema
from .compute import PreparedItem, Result, Surveyor
from .sources import Item


def windows(items: list[Item], size: int) -> Iterator[list[Item]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def run_local(
    items: list[Item], surveyor: Surveyor, emit: Callable[[Result], None], prefetch: bool | None = None
) -> None:
    """Survey ``items``, handing each batch's :class:`Result` to ``emit`` as it is done.

    Args:
        items: the pictures to do.
        surveyor: the loaded model.
        emit: called with every batch's rows and failures (write them, count them).
        prefetch: read the next window in a background thread (default: when not on the CPU).
    """
    B = surveyor.batch_size
    if prefetch is None:
        prefetch = surveyor.device.type != "cpu"
    buckets: Buckets[PreparedItem] = Buckets(B)

    def run(batch: list[PreparedItem]) -> None:
        emit(surveyor.compute(batch))

    def take(prepared: list[PreparedItem], failed: list[tuple[str, str, str]]) -> None:
        if failed:
            emit(Result(schema.empty_rows(), schema.failures_table(failed)))
        for p in prepared:
            full = buckets.add(tuple(p.raw.shape), p)
            if full is not None:
                run(full)
        while buckets.waiting() > 4 * B:
            run(buckets.fullest())

    if not prefetch:
        for w in windows(items, B):
            take(*surveyor.prepare_all(w))
    else:
        wins = list(windows(items, B))
        with ThreadPoolExecutor(1, thread_name_prefix="survey-read") as pool:
            ahead: Future | None = pool.submit(surveyor.prepare_all, wins[0]) if wins else None
            for k in range(len(wins)):
                assert ahead is not None
                current = ahead.result()
                ahead = pool.submit(surveyor.prepare_all, wins[k + 1]) if k + 1 < len(wins) else None
                take(*current)
    for batch in buckets.rest():
        run(batch)
