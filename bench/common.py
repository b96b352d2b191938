"""Timing helpers shared by the benchmark parts: interleaved runs, robust statistics, load."""

from __future__ import annotations

import gc
import os
import resource
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


class BenchFailure(RuntimeError):
    """Something is broken (wrong shape, wrong values, failed request): the run exits non-zero."""


def quantile(xs: list[float], q: float) -> float:
    """Linear-interpolated quantile (``q`` in 0..1) of a non-empty list."""
    s = sorted(xs)
    if len(s) == 1:
        return s[0]
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def summary(xs: list[float]) -> dict[str, float]:
    """median, p10, p90, IQR, min, max and n of a sample."""
    if not xs:
        return {"n": 0}
    return {
        "n": len(xs),
        "median": statistics.median(xs),
        "p10": quantile(xs, 0.10),
        "p90": quantile(xs, 0.90),
        "q1": quantile(xs, 0.25),
        "q3": quantile(xs, 0.75),
        "min": min(xs),
        "max": max(xs),
    }


def paired(num: list[float], den: list[float]) -> dict[str, float]:
    """The :func:`summary` of the ratios of rounds timed side by side (``num[i] / den[i]``)."""
    return summary([a / b for a, b in zip(num, den)])


def minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def peak_rss_mib() -> float:
    """Peak resident set size of this process (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def vm_hwm_mib(pid: int) -> float | None:
    """Peak resident set size of another process (``VmHWM`` in /proc/PID/status)."""
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def cpu_jiffies_total() -> tuple[int, int, int]:
    """(busy, total, steal) jiffies of the whole machine from /proc/stat.

    ``steal`` is time the hypervisor gave our virtual CPUs to someone else: on a VM it shows
    contention that no process here can see.
    """
    with open("/proc/stat") as f:
        parts = [int(x) for x in f.readline().split()[1:]]
    idle = parts[3] + (parts[4] if len(parts) > 4 else 0)  # idle + iowait
    steal = parts[7] if len(parts) > 7 else 0
    total = sum(parts[:8])  # guest time is already inside user
    return total - idle - steal, total, steal


def proc_jiffies(pid: int, thread: int | None = None) -> int:
    """utime + stime of a process (or of one of its threads: ``thread``, a thread id; the
    process's own id is its main thread) in jiffies (0 if it is gone)."""
    path = f"/proc/{pid}/stat" if thread is None else f"/proc/{pid}/task/{thread}/stat"
    try:
        with open(path) as f:
            rest = f.read().rsplit(")", 1)[1].split()
        return int(rest[11]) + int(rest[12])
    except (OSError, IndexError, ValueError):
        return 0


class LoadMonitor:
    """How busy the machine was with *other* processes while the benchmark ran.

    ``foreign_cores`` is the average number of cores used by processes other than this one and
    the pids passed to :meth:`track` (the server): a number well above 0 means the figures of
    this run are contended and ratios are more trustworthy than absolute numbers.
    """

    def __init__(self) -> None:
        self.pids: set[int] = {os.getpid()}
        self._ours0 = {p: proc_jiffies(p) for p in self.pids}
        self._busy0, self._total0, self._steal0 = cpu_jiffies_total()
        self._t0 = time.monotonic()
        self.ncpu = os.cpu_count() or 1

    def track(self, pid: int) -> None:
        self.pids.add(pid)
        self._ours0[pid] = proc_jiffies(pid)

    def snapshot_ours(self) -> dict[int, int]:
        return {p: proc_jiffies(p) for p in self.pids}

    def result(self, ours_end: dict[int, int] | None = None) -> dict[str, float]:
        busy1, total1, steal1 = cpu_jiffies_total()
        ours_end = ours_end or self.snapshot_ours()
        ours = sum(max(0, ours_end.get(p, 0) - self._ours0.get(p, 0)) for p in self.pids)
        dt_total = max(1, total1 - self._total0)
        busy = busy1 - self._busy0
        foreign = max(0, busy - ours)
        return {
            "wall_s": time.monotonic() - self._t0,
            "machine_busy_cores": busy / dt_total * self.ncpu,
            "ours_cores": ours / dt_total * self.ncpu,
            "foreign_cores": foreign / dt_total * self.ncpu,
            "steal_cores": (steal1 - self._steal0) / dt_total * self.ncpu,
            "loadavg_1m": os.getloadavg()[0],
        }


@dataclass
class Variant:
    """One thing to time: ``fn(x)`` on a batch; ``check(out, batch)`` raises if wrong."""

    key: str
    label: str
    fn: Callable[[Any], Any]
    check: Callable[[Any, int], None] | None = None
    group: str = "model"
    note: str = ""
    max_iters: int | None = None  # slow variants (stdlib JSON of full maps) run fewer rounds
    times: list[float] = field(default_factory=list)
    faults: list[int] = field(default_factory=list)
    phases: dict[str, list[float]] = field(default_factory=dict)  # filled by fn, seconds

    def clear(self) -> None:
        self.times.clear()
        self.faults.clear()
        self.phases.clear()


def run_interleaved(
    variants: list[Variant],
    make_input: Callable[[], Any],
    batch: int,
    iters: int,
    warmup: int,
    verbose: bool = True,
    sync: Callable[[], None] = lambda: None,
) -> None:
    """Warm up every variant, then ``iters`` rounds calling each once, in rotating order.

    The order rotates every round so that no variant always runs right after the same
    neighbour (allocator and cache state). Garbage is collected outside the timed region.
    Times (seconds per call) and minor page faults per call are appended to each variant.
    """
    x = make_input()
    for v in variants:
        for _ in range(warmup if v.max_iters is None else 0):  # slow ones: the check call warmed them
            out = v.fn(x)
            del out
        v.phases.clear()
    gc.collect()
    n = len(variants)
    for r in range(iters):
        for j in range(n):
            v = variants[(r + j) % n]
            if v.max_iters is not None and len(v.times) >= v.max_iters:
                continue
            gc.collect()
            f0 = minor_faults()
            sync()
            t0 = time.perf_counter()
            out = v.fn(x)
            sync()  # CUDA: the kernels have finished (the answers' .cpu() already waited)
            dt = time.perf_counter() - t0
            v.faults.append(minor_faults() - f0)
            v.times.append(dt)
            del out
        progress(f"batch {batch}: round {r + 1}/{iters}", verbose)
    progress("", verbose)


def progress(msg: str, verbose: bool = True) -> None:
    """A self-overwriting progress line on a terminal; nothing when output is a file or pipe."""
    if verbose and sys.stdout.isatty():
        print(f"\r  {msg:<60}\r" if msg else "\r" + " " * 64 + "\r", end="", flush=True)


def throughput_stats(times: list[float], batch: int, ref_times: list[float] | None = None) -> dict[str, Any]:
    """Images/s (median and spread) and ms per call from per-call times.

    With ``ref_times`` (the reference's times from the same interleaved rounds) also the paired
    ratio: per round ``t_ref / t``, i.e. this variant's images/s over the reference's in the
    same round, summarised over rounds. Pairing cancels drift and contention that last longer
    than a round; what is left is the per-call noise of the machine.
    """
    ips = [batch / t for t in times]
    out = {"batch": batch, "ips": summary(ips), "ms_per_call": summary([t * 1000 for t in times])}
    if ref_times is not None and len(ref_times) == len(times):
        out["ratio"] = summary([r / t for r, t in zip(ref_times, times)])
    return out
