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
    add("--smoke", action="store_true", help="quick CI run (< 60 s): few iterations, concurrency 1 and 4")
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


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # SIGTERM (CI timeout, kill): unwind through the finally blocks so the server is stopped too.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    t_start = time.monotonic()
    os.chdir(ROOT)
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    import torch

    from headscope.serving.malloc import tune_malloc

    tune_malloc()  # as the server does at start-up, so the in-process rows see the same allocator

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    from headscope.engine.forward import forward_capture
    from headscope.zoo.loaders import load_embedded

    from . import encoding, inproc, peers, report
    from .common import BenchFailure, LoadMonitor, peak_rss_mib, run_interleaved, summary, throughput_stats, vm_hwm_mib

    verbose = not args.quiet
    monitor = LoadMonitor()
    info = machine_info(args.threads)
    info.update(peers.versions())
    print(
        f"Headscope bench{' (smoke)' if args.smoke else ''}: {info['cpu']}, {info['cores']} cores, "
        f"torch {info['torch']}, {info['threads']} threads, input 224x224"
    )

    checks = inproc.Checks()
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
            return 2
        info["gpu"] = torch.cuda.get_device_name(device)
        sync = lambda: torch.cuda.synchronize(device)  # noqa: E731
    else:
        sync = lambda: None  # noqa: E731
    info["device"] = str(device)
    info["bf16"] = inproc.bf16_status(str(device))[1]
    lm = load_embedded(args.models_dir)
    lm.model.to(device)
    L, H = lm.num_layers, lm.num_heads
    N = 1 + (224 // lm.patch_size[0]) * (224 // lm.patch_size[1])

    # -- 1-3: in-process, interleaved per batch size --------------------------------------------
    variants = inproc.build_variants(lm, not args.no_peers, checks, args.models_dir, str(device))
    print("  cross-check on 2 images ...", flush=True)
    variants = inproc.cross_check(variants, inproc.sample_pixels(lm, 2, device), checks)
    results["inproc"] = {}
    results["phases"] = {}
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
            run_interleaved(variants, lambda: x, B, it, args.warmup, verbose, sync)
        except Exception as e:  # a variant crashing mid-run is a failure, not a traceback
            checks.fail(f"in-process run at batch {B}: {type(e).__name__}: {e}")
            traceback.print_exc()
            continue
        ref_times = next((v.times for v in variants if v.key == "fwd_fp32"), None)
        if ref_times is None:
            checks.fail("the bare fp32 forward did not run; no reference")
            break
        results["inproc"][str(B)] = {
            v.key: {
                "label": v.label,
                "group": v.group,
                "note": v.note,
                **throughput_stats(v.times, B, ref_times),
                "minor_faults_per_call": summary([float(f) for f in v.faults])["median"],
            }
            for v in variants
        }
        results["phases"][str(B)] = {
            v.key: {ph: summary([t * 1000 / B for t in ts]) for ph, ts in v.phases.items()}
            for v in variants
            if v.phases
        }
        results["phases"][str(B)]["fwd_fp32"] = {"forward": summary([t * 1000 / B for t in ref_times])}
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
        results["profile_ops"] = profile.torch_ops(
            {v.label: (lambda v=v: v.fn(x1)) for v in variants if v.key in keep}, cuda=device.type == "cuda"
        )

    # -- statistics and the survey's marginal throughput ------------------------------------------
    if not args.no_survey:
        from . import survey as survey_bench

        results["stats"], results["survey"] = {}, {}
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
                run_interleaved(vs, lambda: None, B, it, args.warmup, verbose, sync)
                ref_times = vs[0].times
                results[part] = {
                    v.key: {"label": v.label, "note": v.note, **throughput_stats(v.times, B, ref_times)} for v in vs
                }
        except Exception as e:
            checks.fail(f"statistics/survey part: {type(e).__name__}: {e}")
            traceback.print_exc()
        finally:
            sb.close()
        gc.collect()

    # capture memory per image (what the results cache holds)
    att = forward_capture(lm, inproc.sample_pixels(lm, 1, device))[0]
    results["capture_bytes_per_image"] = att.nbytes()

    # -- encoding ---------------------------------------------------------------------------------
    if not args.no_encoding:
        from headscope.engine.analysis import attention_tensor
        from headscope.engine.selection import Selection

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
        run_interleaved(enc, lambda: None, 1, 3 if args.smoke else 15, 1, verbose)
        results["encoding"] = {
            v.key: {"label": v.label, "note": v.note, "bytes": sizes[v.key], **throughput_stats(v.times, 1)}
            for v in enc
        }
        del enc
    del att
    gc.collect()
    results["memory"] = {"bench_peak_rss_mib_after_inproc": peak_rss_mib()}

    # -- head importance: the exact sweep against L x H whole-model forwards ------------------------
    if not args.no_ablation:
        from . import ablation

        print("  head importance: exact sweep, L x H whole forwards, gradient ...", flush=True)
        try:
            results["ablation"] = ablation.run(
                lm, device, 1 if args.smoke else 5, 0 if args.smoke else 1, checks, verbose, not args.smoke
            )
        except BenchFailure as e:
            checks.fail(f"ablation: {e}")
        gc.collect()

    # -- relevance: one chefer map against a forward, perturbed forwards against plain ones ---------
    if not args.no_relevance:
        from . import relevance

        print("  relevance: chefer map, perturbed forwards ...", flush=True)
        try:
            results["relevance"] = relevance.run(
                lm, device, 1 if args.smoke else 5, 0 if args.smoke else 1, checks, verbose, smoke=args.smoke
            )
        except BenchFailure as e:
            checks.fail(f"relevance: {e}")
        gc.collect()

    # -- 4: the API -------------------------------------------------------------------------------
    if not args.no_api:
        from . import api

        env = {"HEADSCOPE_THREADS": str(args.threads)} if args.threads > 0 else {}
        env["HEADSCOPE_DEVICE"] = str(device)
        # The load measures throughput: at concurrency C every client may be building a large
        # answer (safetensors of all maps), which the default admission caps at 4 (429 beyond).
        env["HEADSCOPE_MAX_LARGE_ANSWERS"] = str(max(4, *args.concurrency))
        env.update(kv.split("=", 1) for kv in args.server_env)
        results["server_env"] = env
        print("  API: starting server ...", end="", flush=True)
        server = None
        try:
            server = api.start_server(env, ROOT / "bench" / "results")
            monitor.track(server.pid)
            print(
                f" ready in {server.startup_s:.1f}s (pid {server.pid}); levels {args.concurrency}, "
                f"{args.api_rounds} round(s)",
                flush=True,
            )
            bench = api.ApiBench(server, L, H, N, (224 // lm.patch_size[0], 224 // lm.patch_size[1]))
            x1 = inproc.sample_pixels(lm, 1, device)
            ref_iters = 2 if args.smoke else 5

            def ref() -> list[float]:
                out = []
                with torch.inference_mode():
                    lm.model.forward_features(x1)
                    for _ in range(ref_iters):
                        gc.collect()
                        sync()
                        t0 = time.perf_counter()
                        lm.model.forward_features(x1)
                        sync()
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
                    verbose,
                    warmup_requests=4 if args.smoke else 8,
                    client=args.client,
                )
            finally:
                if sampler is not None:
                    results["profile_server"] = sampler.stop()
            results["api"] = api_res
            results["api_client"] = args.client
            results["api_ref"] = throughput_stats(ref_times, 1)
            results["memory"]["server_peak_rss_mib"] = vm_hwm_mib(server.pid)
            results["memory"]["server_cache_limit"] = "HEADSCOPE_CACHE_BYTES default (1 GiB)"
            for f in dict.fromkeys(bench.failures):
                checks.fail(f"API: {f}")
        except BenchFailure as e:
            checks.fail(f"API: {e}")
        except Exception as e:
            checks.fail(f"API: {type(e).__name__}: {e}")
            traceback.print_exc()
        finally:
            if server is not None:
                results["load"] = monitor.result()
                rc = server.stop()
                if rc not in (0, None):
                    checks.note(f"server exited with {rc} after SIGTERM (log: {server.log_path})")
    results.setdefault("load", monitor.result())
    results["memory"]["bench_peak_rss_mib"] = peak_rss_mib()
    results["checks"] = {"failures": checks.failures, "notes": checks.notes, "values": checks.values}
    results["targets"] = report.targets(results)
    results["wall_s"] = time.monotonic() - t_start

    print()
    print(report.table(results))
    if args.profile:
        from . import profile

        print("\nProfile")
        if results.get("profile_ops"):
            print(profile.format_torch_ops(results["profile_ops"]))
        if not args.no_api:
            print(profile.format_fold(results.get("profile_server")))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1, default=float) + "\n")
    print(f"\nresults: {args.out}  ({results['wall_s']:.0f} s)")
    if checks.failures:
        print(f"FAILED: {len(checks.failures)} check(s) failed:", *checks.failures, sep="\n  ")
        return 1
    if args.strict and any(t["pass"] is False for t in results["targets"]):
        print("MISS: performance target(s) missed (--strict)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
