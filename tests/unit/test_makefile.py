"""The Makefile's install and serve command lines (issue 30), read with `make -n` (nothing runs).

PyTorch's CPU wheel index cannot be reached from the test machine, so TORCH=cpu is checked as
the commands it would run: torch and torchvision alone from that index, everything else from PyPI.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest

from helpers.server import ROOT

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="no make")


def dry_run(tmp_path, *args: str) -> list[str]:
    venv = tmp_path / "venv"  # absent: make plans the whole install
    r = subprocess.run(
        ["make", "-n", "--no-print-directory", f"VENV={venv}", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()


def pip_installs(lines: list[str]) -> list[str]:
    return [line for line in lines if " -m pip install " in line]


def test_default_install_is_pypi_only_and_shows_progress(tmp_path):
    lines = dry_run(tmp_path, "setup")
    (pip,) = pip_installs(lines)
    assert pip.endswith(" -e .") and "--index-url" not in pip and "download.pytorch.org" not in pip
    assert " -q" not in pip  # pip's own lines and progress bar are shown
    said = "\n".join(line for line in lines if line.startswith("echo"))
    assert "GB to download" in said and "TORCH=cpu" in said  # what it does, how much, and the smaller way


def test_torch_cpu_takes_torch_and_torchvision_alone_from_the_cpu_index(tmp_path):
    lines = dry_run(tmp_path, "setup", "TORCH=cpu")
    torch_step, rest = pip_installs(lines)
    assert torch_step.split()[-3:] == ["https://download.pytorch.org/whl/cpu", "torch", "torchvision"]
    assert "--index-url https://download.pytorch.org/whl/cpu" in torch_step and "--no-deps" in torch_step
    assert "--extra-index-url" not in torch_step  # nothing else comes from there...
    assert rest.endswith(" -e .") and "download.pytorch.org" not in rest  # ...and the rest from PyPI
    assert lines.index(torch_step) < lines.index(rest)
    steps = [line for line in lines if line.startswith('echo "==>')]
    assert len(steps) == 2 and "1/2" in steps[0] and "2/2" in steps[1] and "GB" in steps[0]


def test_torch_index_can_point_at_a_mirror(tmp_path):
    lines = dry_run(tmp_path, "setup", "TORCH=cpu", "TORCH_INDEX=https://mirror.example/torch-cpu")
    assert "--index-url https://mirror.example/torch-cpu" in pip_installs(lines)[0]


@pytest.mark.parametrize(
    ("args", "any_model"),
    [
        ([], True),  # 127.0.0.1 by default: loopback
        (["HOST=127.0.0.1"], True),
        (["HOST=localhost"], True),
        (["HOST=0.0.0.0"], False),  # reachable from the network: opt in explicitly
        (["HOST=0.0.0.0", "ANY_MODEL=1"], True),
        (["ANY_MODEL=0"], False),
    ],
)
def test_serve_turns_any_model_on_for_loopback_only(tmp_path, args, any_model):
    serve = [line for line in dry_run(tmp_path, "serve", *args) if "headscope serve" in line]
    assert len(serve) == 1
    assert ("--any-model" in serve[0]) is any_model, serve[0]


def test_the_install_records_the_torch_build_really_installed(tmp_path):
    lines = dry_run(tmp_path, "setup", "TORCH=cpu")
    check = [line for line in lines if "scripts/torch_build.py" in line]
    assert check == [
        f'{tmp_path / "venv"}/bin/python scripts/torch_build.py --asked "cpu" --record {tmp_path / "venv"}/.torch'
    ]
    assert lines.index(check[0]) > lines.index(pip_installs(lines)[-1])  # after pip had its last word
    assert not [line for line in lines if "> " in line and ".torch" in line]  # no longer what was asked


def test_a_torch_build_other_than_the_one_asked_is_said_loudly(tmp_path):
    import subprocess
    import sys

    import torch

    real = "cpu" if torch.version.cuda is None else "cu" + torch.version.cuda.replace(".", "")
    other = "cu999" if real == "cpu" else "cpu"
    record = tmp_path / ".torch"
    cmd = [sys.executable, "scripts/torch_build.py", "--asked", other, "--record", str(record)]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr  # the venv works: a warning, not a failure
    assert record.read_text() == real + "\n"  # what is really there, not what was asked
    assert f"you asked for the '{other}' build (TORCH={other}), but the venv has torch" in r.stderr
    assert f"the '{real}' build" in r.stderr and f"make clean && make serve TORCH={other}" in r.stderr
    assert r.stderr.startswith("!!!!")
    same = subprocess.run([*cmd[:3], real, *cmd[4:]], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert same.returncode == 0 and same.stderr == "" and f"the '{real}' build, as asked" in same.stdout


def test_check_torch_compares_the_recorded_build(tmp_path):
    venv = tmp_path / "venv"
    venv.mkdir()
    said = {}
    for had, torch_arg in [("cu130", "cpu"), ("cpu", ""), ("cpu", "cpu"), ("cu126", "")]:
        (venv / ".torch").write_text(had + "\n")
        r = subprocess.run(
            ["make", "--no-print-directory", f"VENV={venv}", "check-torch", f"TORCH={torch_arg}"],
            cwd=ROOT, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        said[(had, torch_arg)] = r.stdout.strip()
    assert (
        said[("cu130", "cpu")] == f"note: {venv} has the PyTorch build 'cu130', not 'cpu'; make clean first to switch"
    )
    assert "PyTorch CPU build (made with TORCH=cpu); for PyPI's build with CUDA" in said[("cpu", "")]
    assert said[("cpu", "cpu")] == "" and said[("cu126", "")] == ""


def test_make_test_installs_node_for_the_javascript_tests(tmp_path):
    """`make test` (and test-fast) run js-deps, which installs node where it is missing, so that
    tests/unit/test_parity.py runs the JavaScript tests (in CI a missing node fails it)."""
    for target in ("test", "test-fast"):
        lines = "\n".join(dry_run(tmp_path, target))
        assert "apt-get install -y -q nodejs" in lines, target


def test_make_test_installs_legrads_authors_code_without_its_open_clip_pin(tmp_path):
    """legrad_torch (LeGrad's exactness test) pins open-clip-torch<=2.23.0, which the clip extra's
    open_clip>=3.0 contradicts: the test tools' install adds it with --no-deps, after the extras."""
    lines = pip_installs(dry_run(tmp_path, "setup-dev"))
    extras = next(i for i, line in enumerate(lines) if line.endswith(" -e '.[test,dev,clip]'"))
    (legrad,) = [line for line in lines if "legrad_torch" in line]
    assert legrad.endswith(" --no-deps legrad_torch==1.1") and lines.index(legrad) > extras
