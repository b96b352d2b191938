"""`headscope survey` and `headscope extract` on files they cannot read (issue 33, items 1-3):
FIFOs, broken and looping symbolic links, unreadable and oversized files are recorded and
skipped, never waited on and never a traceback.

Every test runs the real command line in a child process (a hang is a timeout, a crash a
traceback on stderr). The model is ``random:test_vit``: these tests are about files, not maps.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from safetensors import safe_open

from helpers.cli import run_cli as run
from helpers.server import SAMPLES

CLI_TIMEOUT_S = 600  # a Python that imports torch and timm on a loaded 2-core machine; a hang ends here
# Whole survey and extract runs (a model load and every picture each, 10 s on 2 cores): make test-long
pytestmark = [pytest.mark.timeout(3 * CLI_TIMEOUT_S), pytest.mark.surveys]
MODEL = "random:test_vit"
HUGE = 2 * 1024**3  # the probe's sparse 2 GiB ".png": read whole, it took the survey to 2.98 GB


def unreadable(path: Path) -> Path:
    """A file with an image's name that this process cannot read, also when it runs as root.

    ``chmod 000`` stops every user but root, and these tests run as root here. As root the file is
    a symbolic link to ``/proc/sys/vm/drop_caches``: a regular, write-only file whose sysctl
    permission check applies the owner's bits to root too, so opening it for reading fails with
    ``EACCES`` for everyone (the same ``PermissionError`` a user gets from a ``chmod 000`` file).
    """
    if os.geteuid() != 0:
        shutil.copyfile(SAMPLES / "cat.png", path)
        path.chmod(0)
    else:
        path.symlink_to("/proc/sys/vm/drop_caches")
    try:
        with open(path, "rb"):
            pass
    except PermissionError:
        return path
    pytest.skip("no way here to make a file this user cannot read")


def sparse(path: Path, size: int = HUGE) -> Path:
    with open(path, "wb") as f:
        f.truncate(size)  # no blocks on disk: only reading it costs memory
    return path


def failures(out: Path) -> dict[str, str]:
    """``image -> error code`` of a survey's failures table."""
    table = pq.read_table(out / "_failures")
    return dict(zip(table.column("image").to_pylist(), table.column("error").to_pylist()))


def surveyed(out: Path) -> set[str]:
    return set(pq.read_table(out, columns=["image"]).column("image").to_pylist())


def assert_clean(r: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout, r.stderr


# -- item 1: FIFOs and broken links in the survey -----------------------------------------------


def test_survey_of_a_list_naming_a_fifo_does_not_hang(tmp_path):
    """The probe's command: `ok1.png` is surveyed, the FIFO recorded, the run ends."""
    d = tmp_path / "d"
    d.mkdir()
    shutil.copyfile(SAMPLES / "cat.png", d / "ok1.png")
    os.mkfifo(d / "pipe.png")
    (d / "list.txt").write_text("ok1.png\npipe.png\n")
    out = tmp_path / "o.parquet"
    r = run("survey", str(d / "list.txt"), "--out", str(out), "--model", MODEL, "--quiet")
    assert r.returncode == 0, r.stderr
    assert_clean(r)
    assert surveyed(out) == {"ok1.png"}
    assert failures(out) == {"pipe.png": "not_a_file"}
    assert "surveyed 1 image(s)" in r.stdout and "1 failure(s) recorded" in r.stdout


def test_survey_of_a_fifo_as_source_does_not_hang(tmp_path):
    """A FIFO named like an image is recorded; one named like a list is refused at once."""
    os.mkfifo(tmp_path / "pipe.png")
    out = tmp_path / "o.parquet"
    r = run("survey", str(tmp_path / "pipe.png"), "--out", str(out), "--model", MODEL, "--quiet")
    assert r.returncode == 1, r.stderr  # no picture could be surveyed (as extract): 1, with the reason recorded
    assert_clean(r)
    assert failures(out) == {"pipe.png": "not_a_file"}

    os.mkfifo(tmp_path / "list.txt")
    r = run("survey", str(tmp_path / "list.txt"), "--out", str(tmp_path / "o2.parquet"), "--model", MODEL)
    assert r.returncode == 2
    assert_clean(r)
    assert "not a regular file" in r.stderr


def test_survey_of_a_folder_records_fifos_broken_links_and_loops(tmp_path):
    """A folder walk lists every entry with an image's name; what cannot be read is a failure."""
    d = tmp_path / "d"
    (d / "sub").mkdir(parents=True)
    shutil.copyfile(SAMPLES / "cat.png", d / "ok1.png")
    os.mkfifo(d / "pipe.png")
    os.mkfifo(d / "notes")  # not an image's name: not listed, and not read either
    (d / "sub" / "gone.png").symlink_to(tmp_path / "missing.png")
    (d / "loop.png").symlink_to(d / "loop.png")
    unreadable(d / "locked.png")
    out = tmp_path / "o.parquet"
    r = run("survey", str(d), "--out", str(out), "--model", MODEL, "--quiet")
    assert r.returncode == 0, r.stderr
    assert_clean(r)
    assert surveyed(out) == {"ok1.png"}
    assert failures(out) == {
        "pipe.png": "not_a_file",
        "sub/gone.png": "not_found",
        "loop.png": "symlink_loop",
        "locked.png": "permission_denied",
    }
    assert "4 failure(s) recorded" in r.stdout


# -- item 3: files over the size limit, refused before they are read -----------------------------


def test_survey_refuses_files_over_the_size_limit_before_reading_them(tmp_path):
    """HEADSCOPE_MAX_UPLOAD_BYTES (the server's upload limit) bounds the files the survey reads.

    The sparse 2 GiB file is refused from its size alone: read, it would cost the process 2 GiB
    and then fail as a bad image, not as ``file_too_large``.
    """
    d = tmp_path / "d"
    d.mkdir()
    shutil.copyfile(SAMPLES / "cat.png", d / "cat.png")  # 240,512 bytes
    shutil.copyfile(SAMPLES / "astronaut.png", d / "astronaut.png")  # 791,555 bytes
    sparse(d / "huge.png")
    out = tmp_path / "o.parquet"
    r = run(
        "survey", str(d), "--out", str(out), "--model", MODEL, "--quiet", env={"HEADSCOPE_MAX_UPLOAD_BYTES": "500000"}
    )
    assert r.returncode == 0, r.stderr
    assert_clean(r)
    assert surveyed(out) == {"cat.png"}
    assert failures(out) == {"astronaut.png": "file_too_large", "huge.png": "file_too_large"}
    messages = dict(zip(*pq.read_table(out / "_failures").select(["image", "message"]).to_pydict().values()))
    assert "2,147,483,648 bytes, over the 500,000-byte limit" in messages["huge.png"]


# -- items 2 and 3: extract records what it cannot read and goes on ----------------------------


def test_extract_skips_unreadable_fifo_and_oversized_files_and_says_so(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    shutil.copyfile(SAMPLES / "cat.png", d / "cat.png")
    shutil.copyfile(SAMPLES / "astronaut.png", d / "astronaut.png")  # over the limit set below
    unreadable(d / "locked.png")
    os.mkfifo(d / "pipe.png")
    sparse(d / "huge.png")
    (d / "gone.png").symlink_to(tmp_path / "missing.png")
    fifo = tmp_path / "given.png"  # a FIFO named on the command line: skipped, not "no such file"
    os.mkfifo(fifo)
    out = tmp_path / "attn.safetensors"
    r = run(
        "extract",
        str(d),
        str(fifo),
        "--out",
        str(out),
        "--model",
        MODEL,
        "--layers",
        "-1",
        env={"HEADSCOPE_MAX_UPLOAD_BYTES": "500000"},
    )
    assert r.returncode == 0, r.stderr
    assert_clean(r)
    assert "no such file or folder" not in r.stderr
    with safe_open(str(out), "pt") as f:
        meta = json.loads(f.metadata()["images"])
    assert [Path(m["file"]).name for m in meta.values()] == ["cat.png"]
    assert "wrote 1 tensor to" in r.stdout and "skipped 6" in r.stdout
    lines = [line.strip().removeprefix("skipped ") for line in r.stderr.splitlines()]
    skipped = dict(line.split(": ", 1) for line in lines if line.startswith(str(tmp_path)))
    expected = {
        d / "astronaut.png": "(file_too_large)",
        d / "huge.png": "(file_too_large)",
        d / "locked.png": "permission denied (permission_denied)",
        d / "pipe.png": "not a regular file: a FIFO",
        d / "gone.png": "(not_found)",
        fifo: "not a regular file: a FIFO",
    }
    for path, said in expected.items():
        assert said in skipped.get(str(path), ""), (path, r.stderr)
