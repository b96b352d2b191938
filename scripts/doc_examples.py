"""The documentation's examples, run against a real server: nothing a page shows can drift.

A fenced ``sh`` or ``python`` block in README.md, CONTRIBUTING.md or a page under docs/ whose
line above (blank lines between allowed) is ``<!-- test -->`` is an example that must work as
written. The blocks of one file run in order, in one fresh folder that holds a copy of
``static/samples/`` (so the paths read as they do in a checkout), with ``http://127.0.0.1:8000``
replaced by the server's address and ``headscope`` on PATH. Shell blocks run in
``bash -euo pipefail``; ``curl`` in a block without an answer fails on an HTTP error.

A ``json`` or ``text`` block marked ``<!-- answer -->`` right after a tested block is what that
block prints. JSON answers are shown trimmed: lists of more than 6 numbers keep their first 3 and
a string ``"… N more"`` (lists of more than 3 lists or objects their first 2), floats keep 4
significant digits. The check applies the same trimming to
the real answer and compares key by key (numbers to 0.5 %); fields that change from run to run
(``timing_ms`` values, ``cached``, ``request_id``, ...) are compared by type only. Text answers
compare line by line, their numbers to 0.5 % as well.

A file whose examples need a server with other settings says so once, in a line
``<!-- examples-env: HEADSCOPE_EXTRA_MODELS=["random:swin_tiny_patch4_window7_224"] -->``: they
run against a server started with that environment. A line
``<!-- examples-hub: vit_tiny_patch16_224.augreg_in21k_ft_in1k -->`` gives that server a local
stand-in for the Hugging Face hub (tests/helpers/hub_standin.py) that serves random weights of the timm
names listed (same shapes, so the same file size as the real ones), and an empty Hugging Face
cache: the examples can load those models on demand, with a real download, and no request
leaves the machine.

Blocks that talk to the server but cannot run in a test (a cluster, Docker) say why:
``<!-- not tested: REASON -->``; every other block naming ``http://127.0.0.1:8000`` must be tested
(tests/docs/test_doc_examples.py checks both).

    python scripts/doc_examples.py              # run every example against a fresh server; report
    python scripts/doc_examples.py --write      # the same, then rewrite the answers from the run
    python scripts/doc_examples.py docs/api.md  # one file
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DOCS_URL = "http://127.0.0.1:8000"
FENCE = re.compile(r"^(```+|~~~+)\s*([A-Za-z0-9_+-]*)[^\n]*$")
ENV = re.compile(r"^<!--\s*examples-env:\s*([A-Z0-9_]+)=(.*?)\s*-->\s*$", re.M)
HUB = re.compile(r"^<!--\s*examples-hub:\s*([A-Za-z0-9_.,\s-]+?)\s*-->\s*$", re.M)
MARKER = re.compile(r"^<!--\s*(test|answer|not tested:[^>]*?)\s*-->\s*$")
RUNNABLE = {"sh": "sh", "bash": "sh", "shell": "sh", "console": "sh", "python": "python", "py": "python"}
# Lists longer than MAX keep their first KEEP items: numbers 3 of more than 6, nested lists and
# objects 2 of more than 3 (a [12][6][6] answer shows two layers of two rows).
LIST_KEEP, LIST_MAX = 3, 6
NESTED_KEEP, NESTED_MAX = 2, 3
SIGNIFICANT = 4
# Fields whose values change from run to run: compared by type (dicts: by keys) only.
VOLATILE = {"timing_ms", "cached", "request_id", "eta_s", "elapsed_s", "seconds"}
BLOCK_TIMEOUT_S = 900


@dataclass
class Block:
    """One fenced block of a Markdown file."""

    path: Path
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    marker: str | None  # "test", "answer", "not tested: ...", or None
    start: int = 0  # index of the first code line in the file's lines
    end: int = 0  # index of the closing fence
    answer: Block | None = None

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def kind(self) -> str | None:
        return RUNNABLE.get(self.lang)


@dataclass
class Outcome:
    block: Block
    rc: int
    stdout: str
    stderr: str
    problems: list[str] = field(default_factory=list)


def sources() -> list[Path]:
    """The Markdown files whose examples are checked."""
    pages = sorted(p for p in (ROOT / "docs").rglob("*.md") if "hooks" not in p.parts)
    return [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *pages]


def blocks(path: Path) -> list[Block]:
    """Every top-level fenced block of ``path``, with its marker, answers attached to their examples."""
    lines = path.read_text(encoding="utf-8").split("\n")
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, lang = m.group(1), m.group(2).lower()
        j = i + 1
        while j < len(lines) and not lines[j].startswith(fence[0] * len(fence)):
            j += 1
        k = i - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        mm = MARKER.match(lines[k].strip()) if k >= 0 else None
        out.append(
            Block(path, i + 1, lang, "\n".join(lines[i + 1 : j]), mm.group(1) if mm else None, start=i + 1, end=j)
        )
        i = j + 1
    for prev, b in zip(out, out[1:]):
        if b.marker == "answer" and prev.marker == "test":
            prev.answer = b
    return out


def server_env(path: Path) -> dict[str, str]:
    """The server settings a file's examples need (``<!-- examples-env: NAME=VALUE -->`` lines)."""
    return dict(ENV.findall(path.read_text(encoding="utf-8")))


def hub_models(path: Path) -> list[str]:
    """The timm names a file's stand-in hub serves (``<!-- examples-hub: NAME ... -->`` lines)."""
    return [n for m in HUB.findall(path.read_text(encoding="utf-8")) for n in m.replace(",", " ").split()]


@contextmanager
def stand_in_hub(names: list[str], folder: Path) -> Iterator[dict[str, str]]:
    """A local stand-in for the Hugging Face hub serving random weights of the timm ``names``
    (``timm/NAME/model.safetensors``), and the server environment that reaches it, with an empty
    cache under ``folder``. Nothing (and no environment) when ``names`` is empty."""
    if not names:
        yield {}
        return
    if str(ROOT / "tests") not in sys.path:
        sys.path.insert(0, str(ROOT / "tests"))
    from helpers.hub_standin import StandInHub, weights

    hub = StandInHub({f"timm/{n}/model.safetensors": weights(n) for n in names}, seconds=2.0)
    try:
        yield {
            "HF_HOME": str(folder / "hf-home"),
            "HF_HUB_CACHE": str(folder / "hf-home" / "hub"),
            "HF_ENDPOINT": hub.url,
            "HF_HUB_DISABLE_TELEMETRY": "1",
        }
    finally:
        hub.stop()


def tested(path: Path) -> list[Block]:
    return [b for b in blocks(path) if b.marker == "test"]


def marking_problems(path: Path) -> list[str]:
    """Blocks that name the server but are neither tested nor say why not; stray markers."""
    bad = []
    bs = blocks(path)
    for prev, b in zip([None, *bs], bs):
        if b.marker == "test" and not b.kind:
            bad.append(f"{b.where}: <!-- test --> on a ```{b.lang} block (sh or python only)")
        if b.marker == "answer" and (prev is None or prev.marker != "test"):
            bad.append(f"{b.where}: <!-- answer --> does not follow a tested block")
        if b.marker == "answer" and b.lang not in ("json", "text"):
            bad.append(f"{b.where}: an answer is a ```json or ```text block")
        if b.kind and DOCS_URL in b.code and b.marker is None:
            why = "neither <!-- test --> nor <!-- not tested: why -->"
            bad.append(f"{b.where}: a ```{b.lang} example naming {DOCS_URL} is {why}")
    return bad


# ------------------------------------------------------------------ trimming and comparing
def trim(x: Any) -> Any:
    """What a page shows of a JSON value: long lists cut, floats to 4 significant digits."""
    if isinstance(x, dict):
        return {k: trim(v) for k, v in x.items()}
    if isinstance(x, list):
        nested = any(isinstance(v, (list, dict)) for v in x)
        keep, most = (NESTED_KEEP, NESTED_MAX) if nested else (LIST_KEEP, LIST_MAX)
        if len(x) > most:
            return [trim(v) for v in x[:keep]] + [f"… {len(x) - keep} more"]
        return [trim(v) for v in x]
    if isinstance(x, float) and math.isfinite(x):
        return float(f"{x:.{SIGNIFICANT}g}")
    return x


def _kind(x: Any) -> str:
    if isinstance(x, bool):
        return "bool"
    if isinstance(x, (int, float)):
        return "number"
    return type(x).__name__


def compare(shown: Any, real: Any, where: str = "$", volatile: bool = False) -> list[str]:
    """Differences between a shown (trimmed) answer and the real one, trimmed the same way."""
    if _kind(shown) != _kind(real):
        return [f"{where}: the page shows {json.dumps(shown)[:60]}, the server answers {json.dumps(real)[:60]}"]
    if isinstance(shown, dict):
        out = []
        if shown.keys() != real.keys():
            missing, extra = sorted(real.keys() - shown.keys()), sorted(shown.keys() - real.keys())
            out.append(f"{where}: fields differ (the answer has {missing} more, the page {extra} that it lacks)")
        for k in shown.keys() & real.keys():
            out += compare(shown[k], real[k], f"{where}.{k}", volatile or k in VOLATILE)
        return out
    if isinstance(shown, list):
        if len(shown) != len(real):
            return [f"{where}: {len(shown)} items shown, {len(real)} in the answer"]
        return [p for i, (a, b) in enumerate(zip(shown, real)) for p in compare(a, b, f"{where}[{i}]", volatile)]
    if volatile or shown == real:
        return []
    if _kind(shown) == "number" and math.isclose(shown, real, rel_tol=5e-3, abs_tol=1e-7):
        return []
    return [f"{where}: the page shows {json.dumps(shown)}, the server answers {json.dumps(real)}"]


def dumps(x: Any, indent: int = 0, width: int = 100, start: int | None = None) -> str:
    """JSON as a page shows it: a value on one line where it fits, else one item per line.

    ``indent`` is the indentation of the value's lines, ``start`` the column its first line
    starts at (after a key), which decides whether it fits.
    """
    flat = json.dumps(x, ensure_ascii=False)
    if len(flat) + (indent if start is None else start) <= width or not isinstance(x, (dict, list)) or not x:
        return flat
    pad = " " * (indent + 2)
    if isinstance(x, dict):
        items = []
        for k, v in x.items():
            key = f"{pad}{json.dumps(k, ensure_ascii=False)}: "
            items.append(key + dumps(v, indent + 2, width, start=len(key)))
        return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"
    items = [pad + dumps(v, indent + 2, width) for v in x]
    return "[\n" + ",\n".join(items) + "\n" + " " * indent + "]"


NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")


def same_text_line(shown: str, real: str) -> bool:
    """Equal lines, numbers compared to 0.5 % (a printed float may differ in its last digit)."""
    if NUMBER.sub("#", shown) != NUMBER.sub("#", real):
        return False
    return all(
        math.isclose(float(a), float(b), rel_tol=5e-3, abs_tol=1e-7)
        for a, b in zip(NUMBER.findall(shown), NUMBER.findall(real))
    )


def answer_problems(answer: Block, stdout: str) -> list[str]:
    if answer.lang == "text":
        shown = [line.rstrip() for line in answer.code.strip("\n").split("\n")]
        real = [line.rstrip() for line in stdout.strip("\n").split("\n")]
        if len(shown) != len(real) or not all(same_text_line(a, b) for a, b in zip(shown, real)):
            page, printed = "\n    ".join(shown), "\n    ".join(real)
            return [f"{answer.where}: the page shows\n    {page}\n  the command printed\n    {printed}"]
        return []
    try:
        shown = json.loads(answer.code)
    except json.JSONDecodeError as e:
        return [f"{answer.where}: the answer shown is not JSON ({e})"]
    try:
        real = json.loads(stdout)
    except json.JSONDecodeError:
        return [f"{answer.where}: the command printed no JSON: {stdout[:300]!r}"]
    return [f"{answer.where}: {p}" for p in compare(shown, trim(real))]


def keep_volatile(old: Any, new: Any, volatile: bool = False) -> Any:
    """``new``, with the values of run-to-run fields taken from ``old`` where it has them (so that
    rewriting the answers does not churn timings)."""
    if volatile and _kind(old) == _kind(new) and not isinstance(new, (dict, list)):
        return old
    if isinstance(old, dict) and isinstance(new, dict):
        return {k: keep_volatile(old[k], v, volatile or k in VOLATILE) if k in old else v for k, v in new.items()}
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [keep_volatile(a, b, volatile) for a, b in zip(old, new)]
    return new


def shown_answer(answer: Block, stdout: str) -> str:
    """The text an answer block should hold for this output."""
    if answer.lang == "text":
        return stdout.strip("\n")
    new = trim(json.loads(stdout))
    try:
        new = keep_volatile(json.loads(answer.code), new)
    except json.JSONDecodeError:
        pass
    return dumps(new)


# ------------------------------------------------------------------ running
def session_dir(parent: Path) -> Path:
    """A fresh folder that looks like a checkout to the examples: static/samples, a headscope
    command on PATH and in .venv/bin, .venv/bin/python."""
    work = Path(tempfile.mkdtemp(prefix="examples-", dir=parent))
    shutil.copytree(ROOT / "static" / "samples", work / "static" / "samples")
    bin_dir = work / ".bin"
    bin_dir.mkdir()
    venv_bin = work / ".venv" / "bin"  # the README runs `.venv/bin/headscope`, as in a checkout
    venv_bin.mkdir(parents=True)
    for folder in (bin_dir, venv_bin):
        shim = folder / "headscope"
        # This checkout's code, whatever the venv's entry point was installed from.
        shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m headscope.cli "$@"\n')
        shim.chmod(0o755)
    # A shim, not a link: a link's interpreter looks for pyvenv.cfg beside the link, finds none,
    # and runs without the venv's packages (no Pillow for api.md's example).
    python = venv_bin / "python"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    return work


def environment(work: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEADSCOPE_")}
    env.update(
        PATH=f"{work / '.bin'}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        # The checkout first; a PYTHONPATH already set (a worktree's `headscope` link) after it.
        PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p),
        PYTHONUNBUFFERED="1",
        HEADSCOPE_MODELS_DIR=str(ROOT / "models"),
    )
    return env


def run_block(b: Block, base_url: str, work: Path) -> Outcome:
    code = b.code.replace(DOCS_URL, base_url)
    env = environment(work)
    if b.kind == "python":
        cmd = [sys.executable, "-c", code]
    else:
        # curl fails on an HTTP error unless the block shows the (error) answer it gets.
        prelude = "" if b.answer else 'curl() { command curl --fail-with-body "$@"; }\n'
        cmd = ["bash", "-euo", "pipefail", "-c", prelude + code]
    try:
        p = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S)
        rc, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        rc, out, err = -1, str(e.stdout or ""), f"timed out after {BLOCK_TIMEOUT_S} s"
    o = Outcome(b, rc, out, err)
    if rc != 0:
        o.problems.append(f"{b.where}: exited with {rc}\n  stdout: {out[-800:]}\n  stderr: {err[-1500:]}")
    elif b.answer is not None:
        o.problems += answer_problems(b.answer, out)
    return o


def run_file(path: Path, base_url: str, parent: Path) -> list[Outcome]:
    """Run the tested blocks of ``path`` in order, in one fresh folder under ``parent``."""
    work = session_dir(parent)
    try:
        return [run_block(b, base_url, work) for b in tested(path)]
    finally:
        shutil.rmtree(work, ignore_errors=True)


def rewrite_answers(path: Path, outcomes: list[Outcome]) -> int:
    """Put each answer block's real output into the file; returns how many changed."""
    lines = path.read_text(encoding="utf-8").split("\n")
    changed = 0
    # bottom up, so that earlier blocks' line numbers stay valid
    for o in sorted(outcomes, key=lambda o: -o.block.line):
        a = o.block.answer
        if a is None or o.rc != 0:
            continue
        new = shown_answer(a, o.stdout).split("\n")
        if lines[a.start : a.end] != new:
            lines[a.start : a.end] = new
            changed += 1
    path.write_text("\n".join(lines), encoding="utf-8")
    return changed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="*", type=Path, help="Markdown files (default: README, CONTRIBUTING, docs/)")
    ap.add_argument("--write", action="store_true", help="rewrite the answers shown from this run")
    ap.add_argument("--url", help="use this running server instead of starting one")
    a = ap.parse_args(argv)
    files = [f.resolve() for f in a.files] or sources()
    problems = [p for f in files for p in marking_problems(f)]
    sys.path.insert(0, str(ROOT / "tests"))
    from helpers.server import Server

    servers: dict[str, Server] = {}
    hubs = ExitStack()

    def url_for(f: Path, tmp: Path) -> str:
        env = server_env(f)
        names = hub_models(f)
        if a.url and not env and not names:
            return a.url
        if names:  # a stand-in hub and a fresh cache of its own: a server of its own
            env = {**env, **hubs.enter_context(stand_in_hub(names, Path(tempfile.mkdtemp(dir=tmp))))}
        key = json.dumps(env, sort_keys=True)
        if key not in servers:
            servers[key] = Server(env)
        return servers[key].url

    try:
        with tempfile.TemporaryDirectory() as tmp:
            for f in files:
                if not tested(f):
                    continue
                outcomes = run_file(f, url_for(f, Path(tmp)), Path(tmp))
                if a.write:
                    n = rewrite_answers(f, outcomes)
                    print(f"{f.relative_to(ROOT)}: {len(outcomes)} examples, {n} answers rewritten")
                    problems += [p for o in outcomes for p in o.problems if "exited with" in p]
                else:
                    print(f"{f.relative_to(ROOT)}: {len(outcomes)} examples")
                    problems += [p for o in outcomes for p in o.problems]
    finally:
        for server in servers.values():
            server.stop()
        hubs.close()
    for p in problems:
        print(p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
