"""Where an output can be written, found before the work (app/outputs.py ``check_writable``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from headscope.outputs import OutputError, check_writable


def test_a_leftover_probe_of_a_killed_run_does_not_refuse_a_writable_place(tmp_path):
    """The probes once had the pid in their names: one left by a killed run (its pid reused), or
    made by a process of the same pid in another container on the same volume, refused a place
    that can be written. Their names are random now, and nothing is left behind."""
    out = tmp_path / "new" / "survey.parquet"  # its folder does not exist: a folder is made as a probe
    (tmp_path / f".{out.name}.{os.getpid()}.probe").mkdir()
    file_out = tmp_path / "attn.safetensors"  # its folder exists: a file is made as a probe
    (tmp_path / f".{file_out.name}.{os.getpid()}.tmp").write_bytes(b"")
    check_writable(out, folder=True)
    check_writable(file_out)
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted([f".{out.name}.{os.getpid()}.probe", f".{file_out.name}.{os.getpid()}.tmp"]), left


def test_a_place_where_nothing_can_be_made_is_refused_even_for_root():
    with pytest.raises(OutputError, match=r"cannot make folders in /proc"):
        check_writable(Path("/proc/headscope-test/survey.parquet"), folder=True)
