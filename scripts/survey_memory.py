"""Is a survey's memory flat? Survey N generated pictures and sample the resident memory as it goes.

    python scripts/survey_memory.py --images 10000 [--model random:test_vit] [--engine local|ray]

Writes N JPEGs of mixed sizes and aspect ratios (so several input sizes share the batching
buckets) into a temporary folder, runs ``python -m headscope.cli survey`` on them in a child process,
and samples the resident set size (VmRSS) of that process and all its descendants (a local
Ray's raylet and workers included) once a second, together with how many pictures the
progress bar says are done. Prints RSS at every tenth of the run and the verdict: the growth
from the first tenth to the end. Not a test (it takes minutes to hours); docs/survey.md quotes it.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
SIZES = [(96, 64), (64, 96), (80, 80), (120, 60), (100, 75)]  # w, h: five aspect ratios


def make_pictures(folder: Path, n: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    for i in range(n):
        w, h = SIZES[i % len(SIZES)]
        sub = folder / f"d{i // 1000:02d}"
        sub.mkdir(exist_ok=True)
        a = rng.integers(0, 255, (h, w, 3), dtype=np.uint8)
        Image.fromarray(a).save(sub / f"p{i:06d}.jpg", quality=85)


def tree_rss_mib(pid: int) -> float:
    """VmRSS of ``pid`` and every descendant, in MiB."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(d))
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        todo += children.get(p, [])
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
        except OSError:
            pass
    return total / 1024


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=10_000)
    ap.add_argument("--model", default="random:test_vit", help="model id (default: a tiny random ViT)")
    ap.add_argument("--engine", default="local", choices=["local", "ray"])
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--keep", type=Path, help="generate the pictures here and keep them (default: a temp folder)")
    a = ap.parse_args()

    tmp = None if a.keep else tempfile.TemporaryDirectory(prefix="headscope-survey-mem-")
    folder = a.keep or Path(tmp.name)  # type: ignore[union-attr]
    src = folder / "pictures"
    if not src.exists() or sum(1 for _ in src.rglob("*.jpg")) < a.images:
        src.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        make_pictures(src, a.images)
        print(f"generated {a.images} pictures in {time.monotonic() - t0:.0f} s", flush=True)
    out = folder / f"survey-{int(time.time())}.parquet"
    cmd = [sys.executable, "-m", "headscope.cli", "survey", str(src), "--out", str(out), "--model", a.model]
    cmd += ["--engine", a.engine, "--batch-size", str(a.batch_size)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stderr=subprocess.PIPE, stdout=subprocess.PIPE)
    done = {"n": 0}

    def read_progress() -> None:
        buf = b""
        assert proc.stderr is not None
        while True:
            chunk = proc.stderr.read1(4096)  # type: ignore[attr-defined]
            if not chunk:
                return
            buf = (buf + chunk)[-4096:]
            for m in re.finditer(rb"(\d+)/(\d+) \[", buf):
                done["n"] = int(m.group(1))

    threading.Thread(target=read_progress, daemon=True).start()
    samples: list[tuple[float, int, float]] = []
    t0 = time.monotonic()
    while proc.poll() is None:
        rss = tree_rss_mib(proc.pid)
        if rss > 0 and proc.poll() is None:
            samples.append((time.monotonic() - t0, done["n"], rss))
        time.sleep(1.0)
    stdout = proc.stdout.read().decode() if proc.stdout else ""
    print(stdout.strip())
    if proc.returncode != 0 or not samples:
        print(f"survey failed with {proc.returncode}", file=sys.stderr)
        return 1
    print(f"\n{'images done':>12} {'elapsed s':>10} {'RSS MiB':>9}")
    marks = [int(a.images * k / 10) for k in range(1, 11)]
    for m in marks:
        row = next((s for s in samples if s[1] >= m), samples[-1])
        print(f"{row[1]:>12} {row[0]:>10.0f} {row[2]:>9.0f}")
    first = [s[2] for s in samples if s[1] >= marks[0]] or [samples[-1][2]]
    peak = max(s[2] for s in samples)
    print(
        f"\nRSS after the first tenth: {first[0]:.0f} MiB; peak over the run: {peak:.0f} MiB; "
        f"at the end: {samples[-1][2]:.0f} MiB (growth after the first tenth: {peak - first[0]:+.0f} MiB)"
    )
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
