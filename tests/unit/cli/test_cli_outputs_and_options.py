"""What a review of the command line from its docs found (2026-12-01): ``report`` replaced any
file, its own survey included; ``extract --force --out /dev/null`` made a device a file;
``--layers -3,-1`` (the docs' own spelling) was an argparse error; Ctrl-C in ``extract`` was a
traceback; ``extract`` read hidden files (``.ipynb_checkpoints``) that ``survey`` skips; a URL
given to ``survey`` lost a slash in its message. Run in this process, with ``random:test_vit``.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from safetensors import safe_open

from headscope import cli as headscope_cli
from helpers.server import SAMPLES

MODEL = "random:test_vit"  # 6 layers, 2 heads


def run(capsys, *argv: str) -> tuple[int, str]:
    code = headscope_cli.main(list(argv))
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return code, err


def _said(err: str, command: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith(f"headscope {command}: ")]
    assert len(lines) == 1, err
    return lines[0]


@pytest.fixture
def pictures(tmp_path) -> Path:
    """One picture, and two hidden ones: a notebook's checkpoint folder and macOS's ``._`` file."""
    folder = tmp_path / "pics"
    (folder / ".ipynb_checkpoints").mkdir(parents=True)
    shutil.copyfile(SAMPLES / "cat.png", folder / "cat.png")
    shutil.copyfile(SAMPLES / "cat.png", folder / ".ipynb_checkpoints" / "cat-checkpoint.png")
    (folder / "._cat.png").write_bytes(b"\0\5\26\7 AppleDouble")
    return folder


def test_extract_reads_negative_lists_and_skips_hidden_files(capsys, pictures, tmp_path):
    out = tmp_path / "a.safetensors"
    code, err = run(capsys, "extract", str(pictures), "--model", MODEL, "--out", str(out), "--layers", "-3,-1",
                    "--heads", "-1", "--query", "-1,0")  # fmt: skip
    assert code == 0, err
    with safe_open(str(out), "np") as f:
        images = json.loads(f.metadata()["images"])
        assert list(f.keys()) == ["00000"] and f.get_tensor("00000").shape[:3] == (2, 1, 2)
    assert [Path(i["file"]).name for i in images.values()] == ["cat.png"]  # neither hidden copy
    meta = images["00000"]
    assert meta["layers"] == [3, 5] and meta["heads"] == [1] and meta["query"] == [meta["tokens"]["count"] - 1, 0]
    code, err = run(capsys, "extract", str(pictures), "--model", MODEL, "--out", str(out), "--force",
                    "--layers", "-3--1")  # fmt: skip
    assert code == 0, err


def test_only_a_regular_file_is_replaced(capsys, pictures, tmp_path):
    fifo = tmp_path / "pipe.safetensors"
    os.mkfifo(fifo)
    code, err = run(capsys, "extract", str(pictures / "cat.png"), "--model", MODEL, "--out", str(fifo), "--force")
    assert code == 2 and "a FIFO (named pipe), not a regular file" in _said(err, "extract")
    assert Path(fifo).is_fifo()


def test_report_never_replaces_its_survey_and_asks_before_replacing_a_page(capsys, pictures, tmp_path):
    survey = tmp_path / "s.parquet"
    code, err = run(capsys, "survey", str(pictures), "--model", MODEL, "--out", str(survey), "--quiet")
    assert code == 0, err
    page = tmp_path / "r.html"
    assert run(capsys, "report", str(survey), "--out", str(page))[0] == 0
    page.write_text("a page of the user's")
    code, err = run(capsys, "report", str(survey), "--out", str(page))
    assert code == 2 and "exists (a file); pass --force" in _said(err, "report")
    assert page.read_text() == "a page of the user's"
    assert run(capsys, "report", str(survey), "--out", str(page), "--force")[0] == 0
    assert page.read_text().startswith("<!doctype html>")
    part = next(survey.glob("*.parquet"))
    for given in (survey, part):
        code, err = run(capsys, "report", str(given), "--out", str(part), "--force")
        said = _said(err, "report")  # a .parquet name is refused first, for its suffix
        assert code == 2 and ("this command's own input" in said or "not .parquet" in said), said
        link = tmp_path / "page"  # the same file under a name that is not a format's
        link.unlink(missing_ok=True)
        link.symlink_to(part)
        code, err = run(capsys, "report", str(given), "--out", str(link), "--force")
        assert code == 2 and "this command's own input" in _said(err, "report")
    assert part.read_bytes()[:4] == b"PAR1"  # still the survey's


def test_ctrl_c_is_one_line_and_exit_130(capsys, monkeypatch, tmp_path):
    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(headscope_cli, "_extract", interrupted)
    code, err = run(capsys, "extract", str(SAMPLES / "cat.png"), "--out", str(tmp_path / "x.safetensors"))
    assert code == 130 and "interrupted" in _said(err, "extract")


def test_a_url_as_survey_source_is_named_as_such(capsys, tmp_path):
    code, err = run(capsys, "survey", "https://example.org/a.png", "--out", str(tmp_path / "u.parquet"))
    assert code != 0 and "https://example.org/a.png: a URL" in _said(err, "survey")


def test_a_survey_with_nothing_to_survey_says_so(capsys, tmp_path):
    """An empty folder was "surveyed 0 image(s)", exit 0, and left a folder ``report`` refuses; a
    list whose every picture fails was exit 0 too (extract says "no picture could be written", 1)."""
    (tmp_path / "empty").mkdir()
    out = tmp_path / "e.parquet"
    code, err = run(capsys, "survey", str(tmp_path / "empty"), "--model", MODEL, "--out", str(out))
    assert code == 2 and "no images found in" in _said(err, "survey") and not out.exists()
    listed = tmp_path / "list.txt"
    listed.write_text("gone1.png\ngone2.png\n")
    out = tmp_path / "l.parquet"
    assert run(capsys, "survey", str(listed), "--model", MODEL, "--out", str(out), "--quiet")[0] == 1
    assert any((out / "_failures").glob("*.parquet"))  # what failed, and why, is still recorded


def test_a_report_of_one_part_file_has_the_surveys_metadata(capsys, pictures, tmp_path):
    survey = tmp_path / "s.parquet"
    assert run(capsys, "survey", str(pictures), "--model", MODEL, "--out", str(survey), "--quiet")[0] == 0
    page = tmp_path / "one.html"
    assert run(capsys, "report", str(next(survey.glob("*.parquet"))), "--out", str(page))[0] == 0
    assert f"<title>Headscope survey: {MODEL}, 1 images</title>" in page.read_text()


def test_an_out_ending_in_a_slash_is_refused_with_the_name_meant(capsys, tmp_path):
    # Path() drops the slash: --out x.safetensors/ wrote the file x.safetensors
    code, err = run(
        capsys, "extract", str(SAMPLES / "cat.png"), "--model", MODEL, "--out", f"{tmp_path}/x.safetensors/"
    )
    assert code == 2 and f"e.g. --out {tmp_path}/x.safetensors" in _said(err, "extract")
    code, err = run(capsys, "extract", str(SAMPLES / "cat.png"), "--model", MODEL, "--out", f"{tmp_path}/res/")
    assert code == 2 and f"e.g. --out {tmp_path}/res/out.safetensors" in _said(err, "extract")
    survey = tmp_path / "s.parquet"
    survey.mkdir()
    code, err = run(capsys, "report", str(survey), "--out", f"{tmp_path}/page/")
    assert code == 2 and f"e.g. --out {tmp_path}/page/out.html" in _said(err, "report")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.parquet"]


def test_a_source_that_faithfulness_took_is_named(capsys, pictures, tmp_path):
    out = str(tmp_path / "s.parquet")
    # --faithfulness [METHODS] takes the word after it: argparse said only "required: SOURCE"
    code, err = run(capsys, "survey", "--out", out, "--faithfulness", str(pictures))
    line = _said(err, "survey")
    assert code == 2 and line.startswith("headscope survey: SOURCE is missing")
    assert (
        f"headscope survey {pictures} --out {out} --faithfulness" in line and f"--faithfulness all {pictures}" in line
    )
    code, err = run(capsys, "survey", "--out", out, "--faithfulness", str(pictures), str(SAMPLES / "cat.png"))
    line = _said(err, "survey")
    assert code == 2 and "unknown; use one of chefer" in line and f"--faithfulness took {pictures}" in line
    code, err = run(capsys, "survey", "--out", out)
    assert code == 2 and "SOURCE is missing" in _said(err, "survey") and "took" not in err
    assert not Path(out).exists()


def test_exit_codes_of_a_model_id_and_of_random_weights(capsys, tmp_path):
    cat = str(SAMPLES / "cat.png")
    code, err = run(capsys, "extract", cat, "--model", "timm:nope", "--out", str(tmp_path / "o.safetensors"))
    assert code == 2 and "no architecture named 'nope'" in _said(err, "extract")  # was 1; survey's is 2
    (tmp_path / "empty").mkdir()
    code, err = run(capsys, "extract", str(tmp_path / "empty"), "--out", str(tmp_path / "o.safetensors"))
    assert code == 2 and f"no images found in {tmp_path / 'empty'}" in _said(err, "extract")
    assert headscope_cli.main(["fetch", MODEL]) == 0
    said = capsys.readouterr().out
    assert said.startswith(f"{MODEL}: random weights, nothing to download (test_vit, 6 layers, 2 heads)"), said


def test_an_out_named_for_another_format_is_refused(capsys, tmp_path):
    # the file was safetensors under the name x.npy, and np.load then spoke of pickles
    code, err = run(capsys, "extract", str(SAMPLES / "cat.png"), "--model", MODEL, "--out", str(tmp_path / "x.npy"))
    assert code == 2 and f"name it {tmp_path / 'x.safetensors'}" in _said(err, "extract")
    survey = tmp_path / "s.parquet"
    survey.mkdir()
    code, err = run(capsys, "report", str(survey), "--out", str(tmp_path / "r.png"))
    assert code == 2 and f"this writes an HTML page, not .png; name it {tmp_path / 'r.html'}" in _said(err, "report")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.parquet"]


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["survey", "p", "--out", "s", "--limt", "2"], "--limt is not an option of headscope survey; did you mean"),
        (["extract", "p", "--ot", "x"], "required: --out; --ot is not an option of headscope extract; did you mean"),
        (["serve", "--modle", "x"], "serve: error: unrecognized arguments: --modle x; --modle is not an option"),
        ([], "the following arguments are required: COMMAND"),
    ],
)  # fmt: skip
def test_a_misspelt_option_gets_the_option_meant(capsys, argv, said):
    with pytest.raises(SystemExit) as stop:
        headscope_cli.main(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and said in err, err
    assert err.count("did you mean") == (1 if argv else 0), err
    assert "did you mean --limit?" in err or "did you mean --out?" in err or "did you mean --model?" in err or not argv


def test_a_model_id_near_the_default_is_named(capsys, tmp_path):
    code, err = run(capsys, "extract", str(SAMPLES / "cat.png"), "--model", "dinov2-s14",
                    "--out", str(tmp_path / "o.safetensors"))  # fmt: skip
    assert code == 2 and "Did you mean dinov2-s14-focus?" in _said(err, "extract")
