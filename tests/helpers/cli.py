"""Running ``headscope`` as a user runs it: a fresh Python process from the checkout, on the CPU."""

from __future__ import annotations

import os
import subprocess
import sys

from .server import ROOT

# A command starts a Python that imports torch and timm and loads a model: on a loaded 2-core
# machine that alone can take minutes, so the limit is generous.
CLI_TIMEOUT_S = 600


# `headscope ARGS` as run_cli runs it, then the heavy libraries the command imported, on stdout's last line.
_SAYING_IMPORTS = (
    "import json, sys\n"
    "from headscope import cli\n"
    "rc = cli.main(sys.argv[1:])\n"
    "print(json.dumps(sorted(m for m in ('torch', 'timm') if m in sys.modules)))\n"
    "sys.exit(rc)\n"
)


def run_cli(
    *args: str,
    timeout: float = CLI_TIMEOUT_S,
    env: dict | None = None,
    umask: int | None = None,
    say_imports: bool = False,
) -> subprocess.CompletedProcess:
    """``python -m headscope.cli ARGS`` in the checkout: the checkout's models, the CPU, no Ray cluster
    (a survey with ``--engine ray`` starts its own local Ray); ``umask`` for the child process.
    ``say_imports``: stdout's last line is a JSON list of torch and timm where the command imported
    them (a refusal that needs neither should come before their seconds of importing)."""
    full = {
        **os.environ,
        "HEADSCOPE_MODELS_DIR": str(ROOT / "models"),
        "HEADSCOPE_DEVICE": "cpu",
        "PYTHONUNBUFFERED": "1",
        **(env or {}),
    }
    full.pop("RAY_ADDRESS", None)
    return subprocess.run(
        [sys.executable, *(["-c", _SAYING_IMPORTS] if say_imports else ["-m", "headscope.cli"]), *args],
        cwd=ROOT,
        env=full,
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=(lambda: os.umask(umask)) if umask is not None else None,
    )
