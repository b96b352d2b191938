"""Which PyTorch build the venv really has, recorded for `make` and said loudly when it is not the
one asked for (issue 41).

`make serve TORCH=cpu` installs torch from PyTorch's CPU index, then headscope from PyPI; where
that index cannot be reached, or where pip decides the CPU wheel does not satisfy a requirement,
pip installs PyPI's CUDA build instead (gigabytes of NVIDIA libraries) and nothing said so. This
runs after the install: it reads ``torch.version.cuda`` (and ``.hip``), writes the build that is
really there (``cpu``, ``cu126``, ``rocm6.2``) to ``--record`` (the venv's ``.torch``), and
prints a warning box when ``--asked`` names another build. It never fails the install: the
venv works either way, only larger.

Usage: python scripts/torch_build.py --asked cpu --record .venv/.torch
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def build_of(cuda: str | None, hip: str | None) -> str:
    """The build's name as PyTorch's wheel indexes spell it: ``cpu``, ``cu126``, ``rocm6.2``."""
    if cuda:
        return "cu" + cuda.replace(".", "")
    if hip:
        return "rocm" + ".".join(hip.split(".")[:2])
    return "cpu"


def warning(asked: str, got: str, version: str) -> str:
    lines = [
        f"PyTorch: you asked for the '{asked}' build (TORCH={asked}), but the venv has torch {version}, the "
        f"'{got}' build.",
        "pip installed another wheel: PyTorch's index could not be reached, or a requirement made pip replace "
        "its wheel with PyPI's.",
        "It works, but it is not what you asked for"
        + (" (CUDA's libraries are gigabytes you do not need on a CPU)." if asked == "cpu" else "."),
        f"To get the '{asked}' build: make clean && make serve TORCH={asked} "
        "(or TORCH_INDEX=<a mirror of the index> if it cannot be reached from here).",
    ]
    width = max(len(x) for x in lines)
    bar = "!" * (width + 4)
    return "\n".join([bar, *(f"! {x.ljust(width)} !" for x in lines), bar])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--asked", default="", help="the build make asked for (TORCH=...; empty: PyPI's)")
    p.add_argument("--record", type=Path, help="write the build that is really installed to this file")
    args = p.parse_args(argv)
    import torch

    got = build_of(torch.version.cuda, getattr(torch.version, "hip", None))
    if args.record is not None:
        args.record.write_text(got + "\n")
    if args.asked and args.asked != got:
        print(warning(args.asked, got, torch.__version__), file=sys.stderr)
    else:
        print(f"==> PyTorch {torch.__version__}: the '{got}' build" + (", as asked" if args.asked else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
