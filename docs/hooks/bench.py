"""MkDocs hook: the benchmark's tables, generated from the JSON a run wrote (never typed by hand).

A page line ``<!-- bench-tables: bench/cpu-2core-2026-11-24.json -->`` (a path under docs/) becomes
the run's header (machine, date, load, the command that reproduces it, a link to the JSON) and a
Markdown table per part of the run: in-process forwards and captures, statistics and survey,
answer encodings, head importance, the end-to-end API, memory, and the targets with their
verdicts. ``python -m bench.run --out docs/bench/NAME.json`` writes such a file (bench/run.py);
the hook reads only the JSON, so the docs build needs neither torch nor the model.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path
from typing import Any

DIRECTIVE = re.compile(r"^<!-- bench-tables: ([A-Za-z0-9_./-]+\.json) -->[ \t]*$", re.M)


def _f(x: Any, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def _span(s: dict | None, spec: str = ".2f") -> str:
    if not s or s.get("p10") is None:
        return ""
    return f"{format(s['p10'], spec)}-{format(s['p90'], spec)}"


def _table(head: list[str], rows: list[list[str]], align: str | None = None) -> str:
    align = align or "l" + "r" * (len(head) - 1)
    rule = ["---:" if a == "r" else "---" for a in align]
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join(rule) + " |"]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows]
    return "\n".join(lines)


def command(results: dict) -> str:
    """The command line that reproduces the run (recorded by bench/run.py; rebuilt for older files)."""
    if results.get("command"):
        return results["command"]
    a = results.get("args", {})
    parts = ["python", "-m", "bench.run"]
    if a.get("smoke"):
        parts.append("--smoke")
    for flag in ("no_api", "no_peers", "no_encoding", "no_ablation", "no_survey"):
        if a.get(flag):
            parts.append("--" + flag.replace("_", "-"))
    for key, flag in (("batch_sizes", "--batch-sizes"), ("concurrency", "--concurrency")):
        if a.get(key):
            parts += [flag, ",".join(map(str, a[key]))]
    for key in ("iters", "api_rounds", "threads"):
        if a.get(key):
            parts += ["--" + key.replace("_", "-"), str(a[key])]
    if a.get("device", "cpu") != "cpu":
        parts += ["--device", a["device"]]
    return shlex.join(parts)


def header(results: dict, rel: str) -> str:
    """The run's facts, one line each: date, machine, command, code, load, time, the JSON."""
    m = results["meta"]
    device = f"{m['device']} ({m['gpu']})" if m.get("gpu") else "CPU only"
    machine = (
        f"{m.get('cpu', '?')}, {m.get('cores', '?')} cores, {m.get('mem_gib', '?')} GiB; {device}; "
        f"Python {m.get('python', '?')}, torch {m.get('torch', '?')} ({m.get('threads', '?')} threads), "
        f"timm {m.get('timm', '?')}, transformers {m.get('transformers') or 'not installed'}; bf16 {m.get('bf16', '?')}"
    )
    app = f"commit `{m.get('git_commit')}`" + (" with uncommitted changes under app/" if m.get("app_dirty") else "")
    lines = [
        f"- **Date:** {m.get('date', '?')}",
        f"- **Machine:** {machine}",
        f"- **Command:** `{command(results)}`",
        f"- **Code:** {app}",
    ]
    load = results.get("load") or {}
    if load:
        busy = load.get("foreign_cores", 0.0) + load.get("steal_cores", 0.0)
        lines.append(
            f"- **Machine load:** other processes used {load.get('foreign_cores', 0.0):.2f} of "
            f"{m.get('cores', '?')} cores on average, hypervisor steal {load.get('steal_cores', 0.0):.2f}"
            + (" (contended: absolute figures are pessimistic, paired ratios less so)" if busy > 0.25 else "")
        )
    if results.get("wall_s"):
        lines.append(f"- **Run time:** {results['wall_s']:.0f} s")
    lines.append(f"- **Raw results:** [{Path(rel).name}]({rel})")
    return "\n".join(lines)


def inproc(results: dict) -> list[str]:
    out = []
    for b, rows in results.get("inproc", {}).items():
        body = []
        for r in rows.values():
            ra = r.get("ratio") or {}
            body.append(
                [
                    r["label"],
                    _f(r["ips"]["median"]),
                    _span(r["ips"]),
                    _f(r["ms_per_call"]["median"], ".1f"),
                    _f(ra.get("median")) + "x",
                    _span(ra),
                    r.get("note") or "",
                ]
            )
        out += [
            f"**In-process, batch {b}** (ratio: images/s over the bare fp32 forward's, paired per round)",
            _table(["", "img/s", "p10-p90", "ms per call", "ratio", "p10-p90", ""], body, "lrrrrrl"),
        ]
        ph = results.get("phases", {}).get(b, {})
        fwd = ph.get("fwd_fp32", {}).get("forward", {}).get("median")
        parts = [
            [
                rows[k]["label"],
                *(_f(p.get(n, {}).get("median"), ".1f") for n in ("forward_hooked", "results", "select")),
            ]
            for k, p in ph.items()
            if k.startswith("hs_") and k in rows
        ]
        if fwd and parts:
            out += [
                f"Headscope per image at batch {b}, ms (median; the bare forward took {fwd:.1f} ms):",
                _table(["", "hooked forward", "results()", "selection"], parts),
            ]
    return out


def stats_survey(results: dict) -> list[str]:
    body = []
    for part in ("stats", "survey"):
        for r in results.get(part, {}).values():
            n = r.get("batch", 1)
            ms = r["ms_per_call"]
            ra = r.get("ratio") or {}
            if part == "stats" and ra.get("median"):  # time over the forward's time: lower is faster
                med, span = 1 / ra["median"], f"{1 / ra['p90']:.2f}-{1 / ra['p10']:.2f}"
                unit = "time"
            else:
                med, span, unit = ra.get("median"), _span(ra), "img/s"
            body.append(
                [
                    r["label"],
                    str(n),
                    _f(ms["median"] / n, ".1f"),
                    f"{ms['p10'] / n:.1f}-{ms['p90'] / n:.1f}",
                    f"{_f(med)}x ({unit})",
                    span,
                    r.get("note") or "",
                ]
            )
    if not body:
        return []
    return [
        "**Statistics and survey** (statistics: time per image over the bare forward's, lower is faster; "
        "survey: images/s over the bare forward's, higher is better; both paired per round)",
        _table(["", "B", "ms per image", "p10-p90", "ratio", "p10-p90", ""], body, "lrrrrrl"),
    ]


def encoding(results: dict) -> list[str]:
    enc = results.get("encoding")
    if not enc:
        return []
    ref = None
    for b in ("1", *results.get("inproc", {})):
        ref = results.get("inproc", {}).get(b, {}).get("fwd_fp32", {}).get("ips", {}).get("median")
        if ref:
            break
    body = []
    for r in enc.values():
        ms = r["ms_per_call"]
        ratio = (1000 / ms["median"]) / ref if ref else None
        body.append([r["label"], _f(r["bytes"] / 2**20), _f(ms["median"]), _span(ms), _f(ratio, ".1f") + "x"])
    return [
        "**Encoding one image's answer** (ratio: encodings per second over bare fp32 forwards per second at batch 1)",
        _table(["", "MiB", "ms p50", "p10-p90", "ratio"], body),
    ]


def ablation(results: dict) -> list[str]:
    a = results.get("ablation")
    if not a:
        return []
    body = [[r["label"], _f(r["ms"]["median"], ".1f"), _span(r["ms"], ".0f")] for r in a["rows"].values()]
    sw, bb = a["sweep_vs_whole"], a["sweep_vs_whole_backbone"]
    facts = [
        ["exact sweep / L x H whole-model forwards", f"{sw['median']:.2f}x ({_span(sw)})"],
        ["the same, backbone only", f"{bb['median']:.2f}x ({_span(bb)}); arithmetic {a['arithmetic_backbone']:.2f}x"],
        [
            f"exact sweep / {a['layers'] * a['heads']} single-image whole forwards",
            f"{a['sweep_vs_lh_single_forwards']['median']:.2f}x",
        ],
        ["gradient (forward + backward) / one whole forward", f"{a['gradient_vs_forward']['median']:.2f}x"],
        ["sweep max \\|difference\\| to the whole forwards", f"{a['max_abs_diff_vs_whole']:.1e}"],
        [
            "gradient vs exact sweep, Spearman rank correlation",
            ", ".join(f"{k} {v:.2f}" for k, v in a["gradient_spearman"].items()),
        ],
    ]
    return [
        f"**Head importance**, {a['image']}, {a['layers']} x {a['heads']} heads, output {a['kind']} "
        "(ratios: time over time, paired per round; lower is faster)",
        _table(["", "ms p50", "p10-p90"], body),
        _table(["", ""], facts, "ll"),
    ]


def api(results: dict) -> list[str]:
    rows = results.get("api")
    if not rows:
        return []
    ref = results.get("api_ref", {})
    ref_ips = ref.get("ips", {}).get("median")
    body = []
    for r in rows.values():
        lat, st = r["latency_ms"], r.get("server_timing_ms_median", {})
        per_request = r["kind"].startswith(("get_patch", "explain"))
        ratio = (r.get("ratio") or {}).get("median") or (r["ips"] / ref_ips if ref_ips else None)
        body.append(
            [
                r["label"].replace("raw HTTP/1.1 socket (no client library)", "raw socket"),
                str(r["concurrency"]),
                _f(r["ips"]) + (" req/s" if per_request else " img/s"),
                _f(ratio) + "x",
                _span(r.get("ratio")),
                _f(lat.get("p50"), ".1f"),
                _f(lat.get("p95"), ".1f"),
                _f(lat.get("p99"), ".1f"),
                _f(r.get("mean_batch"), ".1f"),
                " / ".join(_f(st.get(k, 0.0), ".1f") for k in ("queue", "compute", "encode")),
                _f(r.get("server_compute_ms_per_image"), ".1f"),
            ]
        )
    ref_text = (
        f"{ref_ips:.2f} img/s = {ref['ms_per_call']['median']:.1f} ms" if ref_ips and ref.get("ms_per_call") else "-"
    )
    return [
        f"**End-to-end API**, a real server, {results.get('api_client', 'lean')} client (c: concurrent clients; "
        f"ratio: paired per round with the bare fp32 forward at batch 1 timed between the blocks, {ref_text}; "
        "server times are the medians of `Server-Timing`; compute/img: the server's forward and capture per image)",
        _table(
            [
                "",
                "c",
                "throughput",
                "ratio",
                "p10-p90",
                "p50 ms",
                "p95",
                "p99",
                "batch",
                "queue / compute / encode ms",
                "compute/img",
            ],
            body,
        ),
    ]


def memory_and_checks(results: dict) -> list[str]:
    mem = results.get("memory", {})
    rows = []
    if mem.get("bench_peak_rss_mib"):
        rows.append(
            [
                "peak resident memory, bench process (models, peers, the largest batch's maps)",
                f"{mem['bench_peak_rss_mib']:.0f} MiB",
            ]
        )
    if mem.get("server_peak_rss_mib"):
        rows.append(
            ["peak resident memory, server (results cache limit 1 GiB)", f"{mem['server_peak_rss_mib']:.0f} MiB"]
        )
    if results.get("capture_bytes_per_image"):
        rows.append(["capture held per image (224 px)", f"{results['capture_bytes_per_image'] / 2**20:.1f} MiB"])
    vals = results.get("checks", {}).get("values", {})
    for k, v in vals.items():
        rows.append([f"max \\|difference\\| of maps, {k.replace('_', ' ')}", f"{v:.1e}"])
    out = [_table(["", ""], rows, "ll")] if rows else []
    notes = results.get("checks", {}).get("notes", [])
    fails = results.get("checks", {}).get("failures", [])
    out += [f"Note from the run: {n}" for n in notes]
    out += [f"**Check failed in this run:** {f}" for f in fails]
    return out


def targets(results: dict) -> list[str]:
    tg = results.get("targets", [])
    if not tg:
        return []
    body = []
    for t in tg:
        verdict = {True: "met", False: "missed", None: "n/a"}[t["pass"]]
        val = "-" if t["value"] is None else (f"{t['value']:.2f}x" if t["unit"] == "x" else f"{t['value']:.2f} ms")
        body.append([t["name"], val, verdict, t.get("detail") or ""])
    smoke = " (a smoke run: few iterations, indicative only)" if results.get("args", {}).get("smoke") else ""
    return [f"**Targets**{smoke}", _table(["target", "this run", "", ""], body, "lrll")]


def render(results: dict, rel: str) -> str:
    blocks = [header(results, rel)]
    for part in (inproc, stats_survey, encoding, ablation, api, memory_and_checks, targets):
        blocks += part(results)
    return "\n\n".join(blocks)


def expand(markdown: str, docs_dir: Path, page_dir: Path | None = None) -> str:
    """Replace every directive by the tables of the JSON it names (a path under ``docs_dir``)."""

    def sub(m: re.Match) -> str:
        path = docs_dir / m.group(1)
        if not path.is_file():
            raise FileNotFoundError(f"docs: {m.group(0)!r} names {path}, which does not exist")
        link = Path(os.path.relpath(path, page_dir or docs_dir)).as_posix()
        return render(json.loads(path.read_text(encoding="utf-8")), link)

    return DIRECTIVE.sub(sub, markdown)


def on_page_markdown(markdown: str, page, config, files) -> str:
    docs_dir = Path(config["docs_dir"])
    return expand(markdown, docs_dir, (docs_dir / page.file.src_uri).parent)
