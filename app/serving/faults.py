"""Fault injection for the reliability tests (``X-Headscope-Fault``; off unless
``HEADSCOPE_ENABLE_FAULT_INJECTION`` is set). Never imported by anything but the worker."""

from __future__ import annotations

import time

import torch

MAX_INJECTED_SLEEP_S = 120.0


class InjectedFault(RuntimeError):
    """Raised on purpose by a test."""


def inject(faults: list[str | None]) -> None:
    """Act out the faults of one batch, given one entry per job (None for none).

    ``raise``: the batch fails (the worker then isolates the culprit); ``oom``: out of memory
    while the batch has more than one image; ``oom-always``: out of memory at any size;
    ``sleep:S``: a hung compute of S seconds.
    """
    for f in faults:
        if not f:
            continue
        if f == "raise":
            raise InjectedFault("injected fault")
        if f == "oom" and len(faults) > 1:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (injected)")
        if f == "oom-always":
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (injected)")
        if f.startswith("sleep:"):
            time.sleep(min(float(f[6:]), MAX_INJECTED_SLEEP_S))
