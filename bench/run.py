"""``python -m bench.run``: the whole benchmark in one interleaved run; ``--smoke`` for CI.

Exit status: 0 when every check passed (shapes, values, HTTP answers), 1 when something is
broken; with ``--strict`` also 1 when a performance target is missed. Targets are printed
as PASS/MISS either way.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import os
import platform
import shlex
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "bench" / "results" / "latest.json"


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x.strip()]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.run", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = p.add_argument
    add("--batch-sizes", type=_ints, default=None, help="in-process batch sizes (default 1,8; smoke 1)")
    add("--device", default="cpu", help="cpu (default) or cuda[:N]: model, peers and server")
    add("--threads", type=int, default=0, help="torch intra-op threads here and in the server (0 = torch default)")
    add(
        "--iters",
        type=int,
        default=None,
        help="timed rounds per batch size (default: 40 at B=1, 96/B (min 8) above; smoke 4)",
    )
    add("--warmup", type=int, default=None, help="untimed calls per variant first (default 2; smoke 1)")
    add("--concurrency", type=_ints, default=None, help="API concurrency levels (default 1,4,16; smoke 1,4)")
    add("--api-rounds", type=int, default=None, help="API rounds (default 4; smoke 1)")
    add(
        "--client",
        choices=("lean", "httpx"),
        default="lean",
        help="API load client: lean = http.client keep-alive threads (default), httpx = httpx.AsyncClient",
    )
    add("--smoke", action="store_true", help="quick CI run (about 2 min on 2 cores): few rounds, concurrency 1 and 4")
    add(
        "--gpu-quick",
        action="store_true",
        help="the GPU profile (bench/gpu_quick.py, a few minutes on one GPU): capture at batch 1, 32, 64, 128 "
        "in fp32 and bf16 from tensors and JPEGs, preparation alone, chefer, chefer2021 and attnlrp at 1 and 8, "
        "the API at concurrency "
        "1, 16, 64 with the GPU's busy fraction; smoke-sized on the CPU",
    )
    add("--no-api", action="store_true", help="skip the end-to-end API part")
    add("--no-peers", action="store_true", help="skip timm AttentionExtract and HF transformers")
    add("--no-encoding", action="store_true", help="skip the encoding part")
    add("--no-ablation", action="store_true", help="skip the head-importance rows (exact sweep, gradient)")
    add("--no-relevance", action="store_true", help="skip the relevance rows (chefer map, perturbed forwards)")
    add("--no-survey", action="store_true", help="skip the statistics and survey part")
    add("--strict", action="store_true", help="exit 1 when a performance target is missed")
    add(
        "--profile",
        action="store_true",
        help="also profile: torch.profiler in-process, py-spy on the server (if installed)",
    )
    add(
        "--server-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra environment for the server (repeatable), e.g. HEADSCOPE_MAX_WAIT_MS=0",
    )
    add("--out", type=Path, default=DEFAULT_OUT, help=f"JSON results (default {DEFAULT_OUT.relative_to(ROOT)})")
    add("--models-dir", type=Path, default=ROOT / "models")
    add("--quiet", action="store_true", help="no progress lines")
    a = p.parse_args(argv)
    a.batch_sizes_given, a.concurrency_given = a.batch_sizes is not None, a.concurrency is not None
    a.batch_sizes = a.batch_sizes or ([1] if a.smoke else [1, 8])
    a.concurrency = a.concurrency or ([1, 4] if a.smoke else [1, 4, 16])
    a.warmup = a.warmup if a.warmup is not None else (1 if a.smoke else 2)
    a.api_rounds = a.api_rounds or (1 if a.smoke else 4)
    return a


def iters_for(batch: int, args) -> int:
    if args.iters is not None:
        return args.iters
    if args.smoke:
        return 4
    # per-call spread on a shared 2-core VM is +-20 %: 40 paired rounds put the median ratio
    # within about +-0.03 at batch 1; larger batches vary less per image
    return 40 if batch == 1 else max(8, 96 // batch)


def machine_info(threads: int) -> dict[str, Any]:
    import torch

    model_name = platform.processor() or "?"
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=5).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                model_name = line.split(":", 1)[1].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        mem = next(int(x.split()[1]) for x in open("/proc/meminfo") if x.startswith("MemTotal")) / 2**20
    except (OSError, StopIteration):
        mem = None
    try:
        commit = (
            subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=5
            ).stdout.strip()
            or None
        )
        dirty = bool(
            subprocess.run(
                ["git", "status", "--porcelain", "app"], cwd=ROOT, capture_output=True, text=True, timeout=5
            ).stdout.strip()
        )
    except (OSError, subprocess.SubprocessError):
        commit, dirty = None, None
    return {
        "cpu": model_name,
        "cores": os.cpu_count(),
        "mem_gib": round(mem, 1) if mem else None,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "threads_arg": threads,
        "git_commit": commit,
        "app_dirty": dirty,
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }


@dataclass
class Run:
    """What the steps of one bench run share: the arguments, the model on its device, the
    device's synchronisation, the checks and the results (written after every step)."""

    args: argparse.Namespace
    lm: Any
    device: Any
    sync: Callable[[], None]
    checks: Any
    monitor: Any
    results: dict[str, Any]
    verbose: bool
    t_start: float = field(default_factory=time.monotonic)

    def save(self, done: bool = False) -> None:
        """The JSON as it stands (``"partial": true`` until the last step): a run stopped by a
        timeout keeps what it measured."""
        self.results["partial"] = not done
        self.results["wall_s"] = time.monotonic() - self.t_start
        self.args.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.args.out.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.results, indent=1, default=float) + "\n")
        tmp.replace(self.args.out)


def setup(args: argparse.Namespace, argv: list[str] | None) -> Run | None:
    """The model on the device (every module: ``lm.to``), the machine's description; None when
    the device asked for is missing."""
    import torch

    from headscope.engine.device import exact_fp32_process
    from headscope.serving.malloc import tune_malloc

    tune_malloc()  # as the server does at start-up, so the in-process rows see the same allocator
    # as the server does too: no TF32 in the whole process, so the bare fp32 forward (the
    # reference) and the peers compute what Headscope's fp32 computes (cuDNN's TF32 is on by default)
    exact_fp32_process()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    from headscope.zoo.loaders import load_embedded

    from . import inproc, peers
    from .common import LoadMonitor

    info = machine_info(args.threads)
    info.update(peers.versions())
    print(
        f"Headscope bench{' (smoke)' if args.smoke else ''}{' (gpu-quick)' if args.gpu_quick else ''}: "
        f"{info['cpu']}, {info['cores']} cores, torch {info['torch']}, {info['threads']} threads, input 224x224"
    )
    results: dict[str, Any] = {
        "meta": info,
        # how to reproduce this run (the docs' Performance page prints it beside the tables)
        "command": shlex.join(["python", "-m", "bench.run", *(sys.argv[1:] if argv is None else argv)]),
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
    }
    device = torch.device(args.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            print(f"--device {args.device}: CUDA is not available here", file=sys.stderr)
            return None
        info["gpu"] = torch.cuda.get_device_name(device)
        sync = lambda: torch.cuda.synchronize(device)  # noqa: E731
    else:
        sync = lambda: None  # noqa: E731
    info["device"] = str(device)
    info["bf16"] = inproc.bf16_status(str(device))[1]
    lm = load_embedded(args.models_dir)
    lm.to(device)  # every module: the backbone, the saliency decoder, the peers' copies later
    return Run(args, lm, device, sync, inproc.Checks(), LoadMonitor(), results, not args.quiet)


def step_inproc(run: Run) -> None:
    """1-3: in-process, interleaved per batch size."""
    from . import inproc
    from .common import BenchFailure, run_interleaved, summary, throughput_stats

    args, lm, device, checks = run.args, run.lm, run.device, run.checks
    variants = inproc.build_variants(lm, not args.no_peers, checks, args.models_dir, str(device))
    print("  cross-check on 2 images ...", flush=True)
    variants = inproc.cross_check(variants, inproc.sample_pixels(lm, 2, device), checks)
    run.results["inproc"] = {}
    run.results["phases"] = {}
    for B in args.batch_sizes:
        for v in variants:
            v.clear()
        x = inproc.sample_pixels(lm, B, device)
        it = iters_for(B, args)
        print(
            f"  in-process, batch {B}: {len(variants)} variants x {it} interleaved rounds (+{args.warmup} warm-up)",
            flush=True,
        )
        try:
            run_interleaved(variants, lambda: x, B, it, args.warmup, run.verbose, run.sync)
        except Exception as e:  # a variant crashing mid-run is a failure, not a traceback
            checks.fail(f"in-process run at batch {B}: {type(e).__name__}: {e}")
            traceback.print_exc()
            continue
        ref_times = next((v.times for v in variants if v.key == "fwd_fp32"), None)
        if ref_times is None:
            checks.fail("the bare fp32 forward did not run; no reference")
            break
        run.results["inproc"][str(B)] = {
            v.key: {
                "label": v.label,
                "group": v.group,
                "note": v.note,
                **throughput_stats(v.times, B, ref_times),
                "minor_faults_per_call": summary([float(f) for f in v.faults])["median"],
            }
            for v in variants
        }
        run.results["phases"][str(B)] = {
            v.key: {ph: summary([t * 1000 / B for t in ts]) for ph, ts in v.phases.items()}
            for v in variants
            if v.phases
        }
        run.results["phases"][str(B)]["fwd_fp32"] = {"forward": summary([t * 1000 / B for t in ref_times])}
        # a capture that goes wrong after warm-up: check the last output once more
        for v in variants:
            if v.check is not None:
                try:
                    v.check(v.fn(x), B)
                except BenchFailure as e:
                    checks.fail(f"{v.key} at batch {B}: {e}")
        gc.collect()
    if args.profile:
        from . import profile

        x1 = inproc.sample_pixels(lm, 1, device)
        keep = {"fwd_fp32", "hs_cls", "hs_full", "timm_full", "hf_full"}
        print("  profiling (torch.profiler) ...", flush=True)
        run.results["profile_ops"] = profile.torch_ops(
            {v.label: (lambda v=v: v.fn(x1)) for v in variants if v.key in keep}, cuda=device.type == "cuda"
        )


def step_survey(run: Run) -> None:
    """Statistics and the survey's marginal throughput."""
    from . import survey as survey_bench
    from .common import BenchFailure, run_interleaved, throughput_stats

    args, lm, device, checks = run.args, run.lm, run.device, run.checks
    run.results["stats"], run.results["survey"] = {}, {}
    parts = [("stats", 1, survey_bench.stats_variants(lm, device), 4 if args.smoke else 30)]
    sb = survey_bench.SurveyBench(lm, device)
    parts.append(("survey", survey_bench.SURVEY_BATCH, sb.variants(), 3 if args.smoke else 12))
    try:
        for part, B, vs, it in parts:
            for v in vs:
                if v.check is not None:
                    try:
                        v.check(v.fn(None), B)
                    except BenchFailure as e:
                        checks.fail(f"{v.key}: {e}")
            print(f"  {part}: {len(vs)} variants x {it} interleaved rounds (+{args.warmup} warm-up)", flush=True)
            run_interleaved(vs, lambda: None, B, it, args.warmup, run.verbose, run.sync)
            ref_times = vs[0].times
            run.results[part] = {
                v.key: {"label": v.label, "note": v.note, **throughput_stats(v.times, B, ref_times)} for v in vs
            }
    except Exception as e:
        checks.fail(f"statistics/survey part: {type(e).__name__}: {e}")
        traceback.print_exc()
    finally:
        sb.close()
    gc.collect()


def step_encoding(run: Run) -> None:
    """Capture memory per image (what the results cache holds), then the encoders."""
    from headscope.engine.analysis import attention_tensor
    from headscope.engine.forward import forward_capture
    from headscope.engine.selection import Selection

    from . import encoding, inproc
    from .common import BenchFailure, peak_rss_mib, run_interleaved, throughput_stats

    args, lm, checks = run.args, run.lm, run.checks
    L, H = lm.num_layers, lm.num_heads
    att = forward_capture(lm, inproc.sample_pixels(lm, 1, run.device))[0]
    run.results["capture_bytes_per_image"] = att.nbytes()
    if not args.no_encoding:
        cls_arr = attention_tensor(att, Selection(list(range(L)), list(range(H)), [0])).numpy()
        full_arr = attention_tensor(att, Selection(list(range(L)), list(range(H)), None)).numpy()
        enc = encoding.build_variants(cls_arr, full_arr, stdlib_full_iters=0 if args.smoke else 3)
        sizes = {}
        for v in enc:
            if v.max_iters == 0:
                checks.note(f"{v.label}: skipped in --smoke (seconds per call)")
                continue
            try:
                body = v.fn(None)
                # a body is bytes (JSON) or the parts the API sends in order (header + buffer)
                sizes[v.key] = len(body) if isinstance(body, bytes) else sum(memoryview(b).nbytes for b in body)
                v.check(body, 1)
            except BenchFailure as e:
                checks.fail(f"{v.key}: {e}")
        enc = [v for v in enc if v.key in sizes]
        print(f"  encoding: {len(enc)} variants", flush=True)
        run_interleaved(enc, lambda: None, 1, 3 if args.smoke else 15, 1, run.verbose)
        run.results["encoding"] = {
            v.key: {"label": v.label, "note": v.note, "bytes": sizes[v.key], **throughput_stats(v.times, 1)}
            for v in enc
        }
        del enc
    del att
    gc.collect()
    run.results["memory"] = {"bench_peak_rss_mib_after_inproc": peak_rss_mib()}


def step_ablation(run: Run) -> None:
    """Head importance: the exact sweep against L x H whole-model forwards."""
    from . import ablation
    from .common import BenchFailure

    smoke = run.args.smoke
    print("  head importance: exact sweep, L x H whole forwards, gradient ...", flush=True)
    try:
        run.results["ablation"] = ablation.run(
            run.lm, run.device, 1 if smoke else 5, 0 if smoke else 1, run.checks, run.verbose, not smoke, sync=run.sync
        )
    except BenchFailure as e:
        run.checks.fail(f"ablation: {e}")
    gc.collect()


def step_relevance(run: Run) -> None:
    """Relevance: one chefer map against a forward, perturbed forwards against plain ones."""
    from . import relevance
    from .common import BenchFailure

    smoke = run.args.smoke
    print("  relevance: chefer map, perturbed forwards ...", flush=True)
    try:
        run.results["relevance"] = relevance.run(
            run.lm,
            run.device,
            1 if smoke else 5,
            0 if smoke else 1,
            run.checks,
            run.verbose,
            smoke=smoke,
            sync=run.sync,
        )
    except BenchFailure as e:
        run.checks.fail(f"relevance: {e}")
    gc.collect()


def server_env(run: Run, largest_concurrency: int) -> dict[str, str]:
    """The server's environment: threads, device, the large-answer admission at the load's level."""
    args = run.args
    env = {"HEADSCOPE_THREADS": str(args.threads)} if args.threads > 0 else {}
    env["HEADSCOPE_DEVICE"] = str(run.device)
    # The load measures throughput: at concurrency C every client may be building a large
    # answer (safetensors of all maps), which the default admission caps at 4 (429 beyond).
    env["HEADSCOPE_MAX_LARGE_ANSWERS"] = str(max(4, largest_concurrency))
    env["HEADSCOPE_MAX_QUEUE"] = str(max(32, 2 * largest_concurrency))
    # The load client is one address standing for many users: its share of the upload slots is
    # all of them (the default, half, turned a client at concurrency 64 away with 429 busy).
    env["HEADSCOPE_MAX_UPLOADS_PER_CLIENT"] = env["HEADSCOPE_MAX_QUEUE"]
    env.update(kv.split("=", 1) for kv in args.server_env)
    run.results["server_env"] = env
    return env


def step_api(run: Run) -> None:
    """4: the REST API through a real server."""
    import torch

    from . import api
    from .common import BenchFailure, throughput_stats, vm_hwm_mib

    args, lm, checks = run.args, run.lm, run.checks
    L, H = lm.num_layers, lm.num_heads
    N = 1 + (224 // lm.patch_size[0]) * (224 // lm.patch_size[1])
    env = server_env(run, max(args.concurrency))
    print("  API: starting server ...", end="", flush=True)
    server = None
    try:
        server = api.start_server(env, ROOT / "bench" / "results", models_dir=run.args.models_dir)
        run.monitor.track(server.pid)
        print(
            f" ready in {server.startup_s:.1f}s (pid {server.pid}); levels {args.concurrency}, "
            f"{args.api_rounds} round(s)",
            flush=True,
        )
        bench = api.ApiBench(server, L, H, N, (224 // lm.patch_size[0], 224 // lm.patch_size[1]))
        from . import inproc

        x1 = inproc.sample_pixels(lm, 1, run.device)
        ref_iters = 2 if args.smoke else 5

        def ref() -> list[float]:
            out = []
            with torch.inference_mode():
                lm.model.forward_features(x1)
                for _ in range(ref_iters):
                    gc.collect()
                    run.sync()
                    t0 = time.perf_counter()
                    lm.model.forward_features(x1)
                    run.sync()
                    out.append(time.perf_counter() - t0)
            return out

        sampler = None
        if args.profile:
            from .profile import ServerSampler

            sampler = ServerSampler(server.pid, ROOT / "bench" / "results" / "server-pyspy.txt")
        try:
            api_res, ref_times = api.run(
                bench,
                args.concurrency,
                args.api_rounds,
                ref,
                run.verbose,
                warmup_requests=4 if args.smoke else 8,
                client=args.client,
            )
        finally:
            if sampler is not None:
                run.results["profile_server"] = sampler.stop()
        run.results["api"] = api_res
        run.results["api_client"] = args.client
        run.results["api_ref"] = throughput_stats(ref_times, 1)
        run.results.setdefault("memory", {})["server_peak_rss_mib"] = vm_hwm_mib(server.pid)
        run.results["memory"]["server_cache_limit"] = "HEADSCOPE_CACHE_BYTES default (1 GiB)"
        for f in dict.fromkeys(bench.failures):
            checks.fail(f"API: {f}")
    except BenchFailure as e:
        checks.fail(f"API: {e}")
    except Exception as e:
        checks.fail(f"API: {type(e).__name__}: {e}")
        traceback.print_exc()
    finally:
        if server is not None:
            run.results["load"] = run.monitor.result()
            rc = server.stop()
            if rc not in (0, None):
                checks.note(f"server exited with {rc} after SIGTERM (log: {server.log_path})")


def step_gpu_quick(run: Run) -> None:
    """``--gpu-quick``: the GPU profile's rows (bench/gpu_quick.py), the API part included
    unless ``--no-api``."""
    import headscope

    from . import api, gpu_quick

    args = run.args
    smoke = run.device.type != "cuda" or args.smoke
    batches = args.batch_sizes if args.batch_sizes_given else ([1, 2] if smoke else [1, 32, 64, 128])
    iters, warmup = (2, 1) if smoke else (10, 2)
    precisions = ["fp32", "bf16"]

    def log(msg: str) -> None:
        if run.verbose:
            print(f"  {msg}", flush=True)

    def scope_for(precision: str) -> Any:
        return headscope.load(run.lm, precision=precision, batch_size=max(batches))

    res = run.results["gpu_quick"] = {}
    gpu_quick.inproc(scope_for, run.device, batches, precisions, iters, warmup, run.sync, log, res, run.save)
    run.save()
    if args.no_api:
        return
    levels = args.concurrency if args.concurrency_given else ([1, 2] if smoke else [1, 16, 64])

    def api_rows() -> dict:
        server = api.start_server(server_env(run, max(levels)), ROOT / "bench" / "results", models_dir=args.models_dir)
        try:
            return gpu_quick.api(server.url, run.device, levels, 4 if smoke else 256, log, server_pid=server.pid)
        finally:
            server.stop()

    # a failure keeps the in-process rows, and the run ends with its JSON written
    rows = run.results["gpu_quick"]["api"] = gpu_quick.measured(api_rows, run.device, log, "the API part")
    if "error" in rows:
        run.checks.fail(f"gpu-quick API part: {rows['error']}")
    gpu_quick.api_vs_limit(run.results["gpu_quick"])


def finish(run: Run) -> int:
    """The table, the JSON, the exit status."""
    from . import report
    from .common import peak_rss_mib

    args, checks, results = run.args, run.checks, run.results
    results.setdefault("load", run.monitor.result())
    results.setdefault("memory", {})["bench_peak_rss_mib"] = peak_rss_mib()
    results["checks"] = {"failures": checks.failures, "notes": checks.notes, "values": checks.values}
    if not args.gpu_quick:
        results["targets"] = report.targets(results)
        print()
        print(report.table(results))
    if args.profile:
        from . import profile

        print("\nProfile")
        if results.get("profile_ops"):
            print(profile.format_torch_ops(results["profile_ops"]))
        if not args.no_api:
            print(profile.format_fold(results.get("profile_server")))
    run.save(done=True)
    print(f"\nresults: {args.out}  ({results['wall_s']:.0f} s)")
    if checks.failures:
        print(f"FAILED: {len(checks.failures)} check(s) failed:", *checks.failures, sep="\n  ")
        return 1
    if args.strict and any(t["pass"] is False for t in results.get("targets", [])):
        print("MISS: performance target(s) missed (--strict)")
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # SIGTERM (CI timeout, kill): unwind through the finally blocks so the server is stopped too.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    os.chdir(ROOT)
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    run = setup(args, argv)
    if run is None:
        return 2
    if args.gpu_quick:
        steps = [step_gpu_quick]
    else:
        steps = [step_inproc]
        steps += [] if args.no_survey else [step_survey]
        steps += [step_encoding]
        steps += [] if args.no_ablation else [step_ablation]
        steps += [] if args.no_relevance else [step_relevance]
        steps += [] if args.no_api else [step_api]
    try:
        for step in steps:
            step(run)
            run.save()  # each part on disk as soon as it is measured
    except SystemExit:
        run.save()  # stopped (SIGTERM from a timeout): keep the rows measured so far
        raise
    return finish(run)


if __name__ == "__main__":
    sys.exit(main())
