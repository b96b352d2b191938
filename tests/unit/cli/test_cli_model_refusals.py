"""The commands that load a model (fetch, extract --model, survey --model) say in one line why a
model cannot load, as ``headscope serve`` does: a pretrained tag timm does not know (with the
nearest names), a hybrid ViT (a CNN backbone feeds its tokens). Run in this process: the same
code as the command, without a second interpreter's start; nothing is downloaded."""

from __future__ import annotations

import pytest

from headscope import cli as headscope_cli
from helpers.server import SAMPLES

BAD_TAG = "vit_small_patch16_224.no_such_tag"
CAT = str(SAMPLES / "cat.png")


def _one_line(err: str, command: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith(f"headscope {command}: ")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize(
    "command, argv",
    [
        ("fetch", ["fetch", f"timm:{BAD_TAG}"]),
        ("extract", ["extract", CAT, "--out", "{tmp}/bt.safetensors", "--model", f"timm:{BAD_TAG}"]),
        ("survey", ["survey", CAT, "--out", "{tmp}/bt.parquet", "--quiet", "--model", f"random:{BAD_TAG}"]),
    ],
)
def test_a_tag_timm_does_not_know_is_one_line_with_the_nearest_names(command, argv, tmp_path, capsys):
    code = headscope_cli.main([a.replace("{tmp}", str(tmp_path)) for a in argv])
    line = _one_line(capsys.readouterr().err, command)
    assert code in (1, 2), line
    assert f"timm cannot build '{BAD_TAG}' (RuntimeError: Invalid pretrained tag" in line
    assert "Did you mean " in line and ":vit_small_patch16_224." in line
    assert not list(tmp_path.iterdir())  # nothing written


@pytest.mark.parametrize(
    "command, argv",
    [
        ("fetch", ["fetch", "random:vit_small_r26_s32_224"]),
        ("extract", ["extract", CAT, "--out", "{tmp}/h.safetensors", "--model", "random:vit_tiny_r_s16_p8_224"]),
        ("survey", ["survey", CAT, "--out", "{tmp}/h.parquet", "--quiet", "--model", "random:vit_small_r26_s32_224"]),
    ],
)
def test_a_hybrid_vit_is_refused_in_one_line(command, argv, tmp_path, capsys):
    code = headscope_cli.main([a.replace("{tmp}", str(tmp_path)) for a in argv])
    line = _one_line(capsys.readouterr().err, command)
    assert code in (1, 2) and "CNN backbone" in line, line
    assert not list(tmp_path.iterdir())
