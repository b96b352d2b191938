"""``--profile``: where the time goes, to explain a missed target.

* In-process: ``torch.profiler`` over the bare forward and Headscope's captures (top operators
  by self CPU time), so the extra work of a capture shows up operator by operator.
* Server: ``py-spy`` (if installed) samples the real server during the API part; the samples are
  folded into self and inclusive time per function and per thread, and the functions of
  ``app/`` are listed separately.
"""

from __future__ import annotations

import collections
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def torch_ops(
    fns: dict[str, Callable[[], Any]], calls: int = 3, top: int = 12, cuda: bool = False
) -> dict[str, list[dict]]:
    """Top operators by self CPU time for each function (``calls`` profiled calls after one warm-up).

    With ``cuda`` the CUDA activity is recorded too (the CPU column then shows launch and copy
    overhead; see the trace for kernel time).
    """
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    out: dict[str, list[dict]] = {}
    for name, fn in fns.items():
        fn()
        with profile(activities=acts) as prof:
            for _ in range(calls):
                fn()
        rows = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)[:top]
        total = sum(e.self_cpu_time_total for e in prof.key_averages()) or 1
        out[name] = [
            {
                "op": e.key,
                "calls_per_run": e.count / calls,
                "self_ms_per_run": e.self_cpu_time_total / 1000 / calls,
                "share": e.self_cpu_time_total / total,
            }
            for e in rows
        ]
    return out


def format_torch_ops(res: dict[str, list[dict]]) -> str:
    lines = []
    for name, rows in res.items():
        lines.append(f"  torch.profiler, {name}: top operators by self CPU time (ms per call)")
        for r in rows:
            lines.append(f"    {r['self_ms_per_run']:8.2f} ms {r['share']:6.1%}  x{r['calls_per_run']:<6g} {r['op']}")
    return "\n".join(lines)


class ServerSampler:
    """py-spy record on a pid (raw folded stacks) while the block runs."""

    def __init__(self, pid: int, out: Path, rate: int = 100):
        self.exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        self.available = Path(self.exe).exists()
        self.out = out
        self.proc = None
        if self.available:
            self.proc = subprocess.Popen(
                [
                    self.exe,
                    "record",
                    "-p",
                    str(pid),
                    "-r",
                    str(rate),
                    "-f",
                    "raw",
                    "-o",
                    str(out),
                    "--threads",
                    "--nonblocking",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )

    def stop(self) -> dict[str, Any] | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if not self.out.is_file():
            err = self.proc.stderr.read().decode(errors="replace")[-300:] if self.proc.stderr else ""
            return {"error": f"py-spy wrote nothing: {err}"}
        return fold(self.out)


APP = Path(__file__).resolve().parent.parent / "app"
APP_FILES = {p.name for p in APP.rglob("*.py")}


def _is_app(frame: str) -> bool:
    """py-spy prints app files relative to the server's sys.path: ``worker.py`` or ``app/worker.py``."""
    loc = frame.rpartition(" (")[2].rstrip(")").rpartition(":")[0]
    return loc.startswith("app/") or ("/" not in loc and loc in APP_FILES)


def fold(path: Path, top: int = 25) -> dict[str, Any]:
    """Self/inclusive sample shares per function and per thread from py-spy raw output."""
    total = 0
    self_c: collections.Counter = collections.Counter()
    incl: collections.Counter = collections.Counter()
    threads: collections.Counter = collections.Counter()
    app_incl: collections.Counter = collections.Counter()
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        stack, _, n = line.rpartition(" ")
        n = int(n)
        total += n
        frames = stack.split(";")
        thread = frames[0].split("):", 1)[-1].strip() if frames[0].startswith("thread") else "?"
        threads[thread] += n
        self_c[_short(frames[-1])] += n
        seen = set()
        for f in frames[1:]:
            s = _short(f, line_no=False)
            if s in seen:
                continue
            seen.add(s)
            incl[s] += n
            if _is_app(f):
                app_incl[s] += n
    share = lambda c: [{"fn": k, "share": v / total} for k, v in c.most_common(top)]  # noqa: E731
    return {
        "samples": total,
        "threads": share(threads),
        "self": share(self_c),
        "inclusive": share(incl),
        "app_inclusive": share(app_incl),
    }


def _short(frame: str, line_no: bool = True) -> str:
    """``fn (path/to/file.py:12)`` -> ``fn (file.py:12)``, keeping ``app/`` visible."""
    name, _, loc = frame.partition(" (")
    loc = loc.rstrip(")")
    path, _, ln = loc.rpartition(":")
    parts = path.split("/")
    short = "/".join(parts[-2:]) if len(parts) > 1 and parts[-2] in ("app", "api") else parts[-1]
    return f"{name} ({short}:{ln})" if line_no and ln else f"{name} ({short})"


def format_fold(res: dict[str, Any] | None, top: int = 12) -> str:
    if not res:
        return "  py-spy: not available (pip install py-spy)"
    if "error" in res:
        return f"  py-spy: {res['error']}"
    lines = [
        f"  py-spy on the server during the API part ({res['samples']} samples)",
        "    threads: " + ", ".join(f"{t['fn']} {t['share']:.0%}" for t in res["threads"][:5]),
    ]
    lines.append("    self time:")
    lines += [f"      {r['share']:6.1%}  {r['fn']}" for r in res["self"][:top]]
    lines.append("    inclusive, app/ functions:")
    lines += [f"      {r['share']:6.1%}  {r['fn']}" for r in res["app_inclusive"][:top]]
    return "\n".join(lines)
