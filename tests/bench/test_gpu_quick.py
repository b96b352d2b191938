"""``python -m bench.run --gpu-quick`` runs its code path end to end, tiny, on the CPU: every row
present with positive times, the JSON written (and marked whole), the device's sync called."""

from __future__ import annotations

import json
import time

import pytest
import torch

from bench import gpu_quick
from bench.run import main


@pytest.mark.heavy
def test_the_gpu_profile_runs_tiny_on_the_cpu(tmp_path):
    out = tmp_path / "quick.json"
    rc = main(["--device", "cpu", "--gpu-quick", "--no-api", "--batch-sizes", "1", "--quiet", "--out", str(out)])
    assert rc == 0
    res = json.loads(out.read_text())
    assert res["partial"] is False and res["meta"]["device"] == "cpu"
    q = res["gpu_quick"]
    assert set(q["capture"]) == {"fp32/1", "bf16/1"}
    for key, rows in q["capture"].items():
        want = {"forward", "capture_tensors"} | (
            {"capture_jpegs", "prepare_jpegs", "forward_jpegs", "capture_pil"} if key.startswith("fp32") else set()
        )
        assert set(rows) == want
        assert all(r["ms"]["median"] > 0 and r["images_per_s"] > 0 for r in rows.values())
        assert rows["capture_tensors"]["vs_forward"] > 0
        if key.startswith("fp32"):
            limit = min(rows["prepare_jpegs"]["images_per_s"], rows["forward_jpegs"]["images_per_s"])
            assert rows["capture_jpegs"]["vs_limit"] == rows["capture_jpegs"]["images_per_s"] / limit
    for method in ("chefer", "chefer2021", "attnlrp"):  # issue #40's targets, measured where the bench runs
        assert set(q[method]) == {"1"} and q[method]["1"]["vs_forward_time"] > 0


def test_a_run_stopped_by_a_timeout_keeps_the_rows_it_measured(tmp_path, monkeypatch):
    """bench/gpu_run.sh runs the profile under `timeout` (SIGTERM: SystemExit through main's
    handler): the rows measured before the signal are on disk, marked partial."""
    out = tmp_path / "quick.json"
    real = gpu_quick.timed

    def stop_after_the_first_row(*args, **kwargs):
        if out.exists() and "fp32/1" in json.loads(out.read_text()).get("gpu_quick", {}).get("capture", {}):
            raise SystemExit(143)
        return real(*args, **kwargs)

    monkeypatch.setattr(gpu_quick, "timed", stop_after_the_first_row)
    with pytest.raises(SystemExit):
        main(["--device", "cpu", "--gpu-quick", "--no-api", "--batch-sizes", "1", "--quiet", "--out", str(out)])
    res = json.loads(out.read_text())
    assert res["partial"] is True
    assert list(res["gpu_quick"]["capture"]) == ["fp32/1"]
    assert res["gpu_quick"]["capture"]["fp32/1"]["capture_tensors"]["ms"]["median"] > 0


@pytest.mark.heavy
def test_a_row_that_fails_is_recorded_and_the_rows_after_it_are_measured(tmp_path, monkeypatch):
    """One GPU session runs the profile once: a row that fails (out of memory at batch 128, say)
    is its error in the JSON, and the rows after it are measured (the first failure ended the step,
    and the API part and the run's checks with it)."""
    out = tmp_path / "quick.json"
    real = gpu_quick._capture_rows

    def oom_at_fp32(scope, runner, device, B, precision, *rest):
        if precision == "fp32":
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore lines")
        return real(scope, runner, device, B, precision, *rest)

    monkeypatch.setattr(gpu_quick, "_capture_rows", oom_at_fp32)
    rc = main(["--device", "cpu", "--gpu-quick", "--no-api", "--batch-sizes", "1", "--quiet", "--out", str(out)])
    assert rc == 0
    q = json.loads(out.read_text())["gpu_quick"]
    assert q["capture"]["fp32/1"] == {"error": "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB"}
    assert q["capture"]["bf16/1"]["capture_tensors"]["ms"]["median"] > 0  # measured after it
    assert q["chefer"]["1"]["vs_forward_time"] > 0
    quick = {"capture": {}, "api": {"64": {"error": "ConnectionError"}}}
    gpu_quick.api_vs_limit(quick)  # a failed level has no numbers to hold against the limit
    assert quick["api"]["64"] == {"error": "ConnectionError"}


def test_timed_synchronises_around_every_call():
    calls: list[str] = []
    times = gpu_quick.timed(lambda: calls.append("fn"), 3, 1, lambda: calls.append("sync"))
    assert len(times) == 3
    assert calls == ["fn", "sync"] + ["sync", "fn", "sync"] * 3


def test_distinct_jpegs_and_no_busy_fraction_without_a_gpu():
    files = gpu_quick.jpegs(3)
    assert len(set(files)) == 3 and all(f[:2] == b"\xff\xd8" for f in files)
    with gpu_quick.BusySampler(torch.device("cpu")) as busy:
        pass
    assert busy.fraction is None


def test_the_pil_inputs_bench_runs_and_checks_its_pixels():
    from bench.pil_inputs import measure

    res = measure(rounds=1)  # asserts the two paths give the same pixels
    rows = [v for v in res.values() if isinstance(v, dict)]
    assert len(rows) == 4 and all(r["png_round_trip_ms"] > 0 and r["direct_ms"] > 0 for r in rows)


def test_the_one_command_gpu_script_refuses_a_machine_without_cuda(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    if torch.cuda.is_available():
        pytest.skip("a GPU is here: bench/gpu_run.sh would run for minutes")
    script = Path(__file__).resolve().parents[2] / "bench" / "gpu_run.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    env = {**os.environ, "PYTHON": sys.executable}
    env.pop("DEVICE", None)
    r = subprocess.run(["bash", str(script), str(tmp_path)], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "no CUDA GPU here" in r.stderr and "DEVICE=cpu" in r.stderr
    assert not list(tmp_path.glob("gpu-quick-*.json"))  # nothing ran


def test_the_api_rows_are_held_against_the_jpeg_limit_at_the_nearest_batch():
    def rows(prepare: float, forward: float) -> dict:
        return {"prepare_jpegs": {"images_per_s": prepare}, "forward_jpegs": {"images_per_s": forward}}

    quick = {
        "capture": {"fp32/1": rows(50.0, 10.0), "fp32/64": rows(400.0, 800.0), "bf16/64": {"forward": {}}},
        "api": {"1": {"images_per_s": 5.0}, "16": {"images_per_s": 100.0}, "64": {"images_per_s": 300.0}},
    }
    gpu_quick.api_vs_limit(quick)
    api = quick["api"]
    assert (api["1"]["limit_batch"], api["1"]["vs_limit"]) == (1, 0.5)
    assert (api["16"]["limit_batch"], api["16"]["vs_limit"]) == (1, 10.0)  # 16 is nearer 1 than 64
    assert (api["64"]["limit_batch"], api["64"]["vs_limit"]) == (64, 0.75)  # the slower limit: decoding
    assert "binds" not in api["64"]
    quick["api"]["http"] = {"images_per_s": 200.0}  # the server's HTTP path alone
    gpu_quick.api_vs_limit(quick)
    assert [api[c]["binds"] for c in ("1", "16", "64")] == ["jpeg", "jpeg", "http"]
    assert "vs_limit" not in api["http"]
    assert "cores_at_target" not in api["64"]  # no CPU time measured
    api["64"]["server_cpu_ms_per_request"] = 20.0  # 20 ms of CPU an answer
    gpu_quick.api_vs_limit(quick)
    # 0.7 x 400 answers a second x 20 ms = 5.6 cores
    assert api["64"]["cores_at_target"] == pytest.approx(5.6) and api["64"]["machine_cores"] >= 1


def test_the_server_s_cpu_time_is_read_from_proc():
    import os

    if not os.path.exists(f"/proc/{os.getpid()}/stat"):
        pytest.skip("no /proc here")
    import threading

    def spin(seconds: float) -> None:
        t = time.thread_time()
        while time.thread_time() - t < seconds:
            pass

    with gpu_quick.ServerCpu(os.getpid()) as cpu:
        spin(0.2)  # a fifth of a second of CPU here
        other = threading.Thread(target=spin, args=(0.3,))  # and more on another thread
        other.start()
        other.join()
    assert 0.4 < cpu.seconds < 1.5 and cpu.cores > 0.3
    assert cpu.per_request_ms(10) == pytest.approx(100 * cpu.seconds)
    if threading.get_native_id() == os.getpid():  # this thread is the process's main thread: the "loop"
        assert 0.1 < cpu.loop_seconds < 0.45, (cpu.loop_seconds, cpu.seconds)
        row = cpu.row(10)
        assert row["server_loop_ms_per_request"] == pytest.approx(100 * cpu.loop_seconds)
        assert row["loop_limit_per_s"] == pytest.approx(10 / cpu.loop_seconds)
    with gpu_quick.ServerCpu(None) as none:
        pass
    assert none.seconds is None and none.per_request_ms(10) is None and none.row(10)["loop_limit_per_s"] is None


def test_the_host_overhead_script_runs_tiny_on_the_cpu(tmp_path):
    """``python -m bench.host_overhead --smoke``: every row, positive times, the host's time per
    picture and the operator counts (the capture runs more operators than its bare forward)."""
    from bench import host_overhead

    out = tmp_path / "host.json"
    assert host_overhead.main(["--smoke", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert set(res["capture"]) == {"1", "2"}
    for row in res["capture"].values():
        assert row["ms_p50"] > 0 and row["forward_ms_p50"] > 0 and row["ops"] > row["forward_ops"] > 0
        assert "host_ms_per_picture" in row
    for method in ("chefer", "chefer2021", "attnlrp"):
        assert res[method]["batch"] == 2 and res[method]["vs_forward_p50"] > 0 and res[method]["ops"] > 0
    assert res["pictures"]["batch"] == 2
    for kind in ("jpeg", "pil"):
        row = res["pictures"][kind]
        assert row["prepare_per_s"] > 0 and row["capture_per_s"] > 0 and row["vs_prepare"] > 0
    assert res["convoy"] and res["convoy"][0]["threads"] == 1
    for row in res["convoy"]:
        assert row["alone_ms"] > 0 and row["beside_ms"] > 0 and row["slowdown"] > 0 and row["preparations_per_s"] > 0
