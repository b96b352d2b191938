"""The command line as a new user meets it (issue 30): help for every option, `extract` keeps an
existing --out unless --force, writes with the user's permissions, and refuses a selection the
model cannot answer before the model loads; `serve --model` repeated."""

from __future__ import annotations

import argparse
import stat

import pytest
from safetensors.torch import load_file

from headscope import cli
from helpers.cli import run_cli as run
from helpers.server import ROOT, SAMPLES

CLI_TIMEOUT_S = 600  # a Python that imports torch and timm on a loaded 2-core machine
pytestmark = pytest.mark.timeout(3 * CLI_TIMEOUT_S)


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def test_every_option_of_every_subcommand_has_help():
    undocumented = []
    subs = subcommands(cli.build_parser())
    assert {"serve", "fetch", "extract", "survey", "report"} <= set(subs)
    for name, parser in subs.items():
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            if not (action.help or "").strip() or action.help == argparse.SUPPRESS:
                undocumented.append(f"{name} {'/'.join(action.option_strings) or action.dest}")
    assert not undocumented, f"options without help text: {undocumented}"


def test_the_synopsis_in_the_docs_lists_every_option():
    """docs/cli.md's first block has a line per command: each of the command's options is on it."""
    text = (ROOT / "docs" / "cli.md").read_text()
    block = text.split("```sh\n", 1)[1].split("```", 1)[0]
    lines = {line.split()[1]: line for line in block.splitlines() if line.startswith("headscope ")}
    missing = []
    for name, parser in subcommands(cli.build_parser()).items():
        assert name in lines, f"no synopsis line for {name}"
        for action in parser._actions:
            long = [o for o in action.option_strings if o.startswith("--") and o != "--help"]
            if long and not any(f"[{o}" in lines[name] or f" {o} " in lines[name] for o in long):
                missing.append(f"{name} {long[0]}")
    assert not missing, f"options the synopsis leaves out: {missing}"


def test_serve_model_is_repeatable():
    args = cli.build_parser().parse_args(["serve", "--model", "a", "--model", "timm:b", "--any-model"])
    assert args.model == ["a", "timm:b"] and args.any_model is True
    assert cli.build_parser().parse_args(["serve"]).any_model is None  # unset: the environment decides


def test_extract_never_replaces_a_folder_even_with_force(tmp_path, capsys):
    """The folder may be the pictures' own (``extract photos --out photos``): refused before anything loads."""
    (tmp_path / "keep.png").write_bytes((SAMPLES / "cat.png").read_bytes())
    assert cli.main(["extract", str(tmp_path), "--out", str(tmp_path), "--force", "--model", "timm:nope"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"headscope extract: {tmp_path} is a folder; --out names the file to write (a folder is never replaced)"
    )
    assert [p.name for p in tmp_path.iterdir()] == ["keep.png"]


def test_extract_says_an_out_it_cannot_write_before_the_model_loads(tmp_path, capsys):
    (tmp_path / "notes").write_text("a file")
    out = tmp_path / "notes" / "run" / "attn.safetensors"
    assert cli.main(["extract", str(SAMPLES / "cat.png"), "--out", str(out), "--model", "timm:nope"]) == 2
    said = f"headscope extract: cannot write {out}: {tmp_path / 'notes'} is a file, not a folder"
    assert capsys.readouterr().err.strip() == said
    fresh = tmp_path / "new" / "sub" / "attn.safetensors"  # missing folders are made when it is written
    assert cli.main(["extract", str(SAMPLES / "cat.png"), "--out", str(fresh), "--model", "timm:nope"]) == 2
    assert "timm has no architecture named 'nope'" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()  # ... and not before


@pytest.mark.surveys  # a whole survey or extract run (a model load, every picture): make test-long
def test_extract_refuses_an_existing_out_unless_force_and_writes_normal_permissions(tmp_path):
    out = tmp_path / "attn.safetensors"
    out.write_bytes(b"precious")
    common = [str(SAMPLES / "cat.png"), "--out", str(out), "--layers", "-1"]
    r = run("extract", *common, "--model", "timm:nope")  # had it loaded the model, the error would name it
    assert r.returncode == 2
    said = f"headscope extract: {out} exists (a file); pass --force to replace it, or choose another --out"
    assert r.stderr.strip() == said
    assert out.read_bytes() == b"precious"

    r = run("extract", *common, "--force", umask=0o022)
    assert r.returncode == 0, r.stderr
    assert set(load_file(str(out))) == {"00000"}
    assert stat.S_IMODE(out.stat().st_mode) == 0o644  # what the umask gives, not safetensors' 0600
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary file left

    other = tmp_path / "group.safetensors"
    r = run("extract", str(SAMPLES / "cat.png"), "--out", str(other), "--layers", "-1", umask=0o002)
    assert r.returncode == 0, r.stderr
    assert stat.S_IMODE(other.stat().st_mode) == 0o664


@pytest.mark.parametrize(
    ("model", "flags", "said"),
    [
        ("dinov2-s14-focus", ["--layers", "99"], "layers: index 99 is out of range"),
        ("dinov2-s14-focus", ["--heads", "6"], "heads: index 6 is out of range"),
        ("dinov2-s14-focus", ["--layers", "zero"], "layers"),
        ("dinov2-s14-focus", ["--query", "patch:1"], "query: cannot read"),
        ("timm:vit_base_patch16_siglip_224.webli", ["--query", "cls"], "no CLS token"),
        ("timm:swin_tiny_patch4_window7_224.ms_in1k", ["--layers", "0-3"], "reach over stages"),
    ],
)
def test_extract_refuses_a_bad_selection_before_the_model_loads(tmp_path, model, flags, said, capsys, monkeypatch):
    # In this process (a fresh one per case spent 6-12 s here importing torch and timm): the checkout's
    # models, and a registry that fails the test if extract asks it for the model, whose weights the
    # selection was to be checked before (timm:... weights could not even be downloaded here).
    from headscope.zoo.registry import Registry

    def loaded(*_args, **_kwargs):
        raise AssertionError("extract loaded the model before checking the selection")

    monkeypatch.setenv("HEADSCOPE_MODELS_DIR", str(ROOT / "models"))
    monkeypatch.setenv("HEADSCOPE_DEVICE", "cpu")
    monkeypatch.setattr(Registry, "get", loaded)
    out = tmp_path / "o.safetensors"
    assert cli.main(["extract", str(SAMPLES / "cat.png"), "--out", str(out), "--model", model, *flags]) == 2
    err = capsys.readouterr().err
    assert said in err and err.startswith("headscope extract: ") and "Traceback" not in err, err
    assert not out.exists()


def test_extract_of_an_unknown_model_says_so_in_one_line(tmp_path):
    r = run("extract", str(SAMPLES / "cat.png"), "--out", str(tmp_path / "o.safetensors"), "--model", "timm:nope")
    assert r.returncode == 2 and r.stderr.strip() == "headscope extract: timm has no architecture named 'nope'."


@pytest.mark.surveys  # a whole survey or extract run (a model load, every picture): make test-long
def test_report_and_survey_outputs_get_normal_permissions(tmp_path):
    survey, report = tmp_path / "s.parquet", tmp_path / "r.html"
    r = run("survey", str(SAMPLES / "cat.png"), "--out", str(survey), "--quiet", umask=0o022)
    assert r.returncode == 0, r.stderr
    parts = list(survey.rglob("*.parquet"))
    assert parts and all(stat.S_IMODE(p.stat().st_mode) == 0o644 for p in parts)
    r = run("report", str(survey), "--out", str(report), umask=0o022)
    assert r.returncode == 0, r.stderr
    assert stat.S_IMODE(report.stat().st_mode) == 0o644


def test_report_says_an_out_it_cannot_write_before_reading_the_survey(tmp_path, capsys):
    survey = tmp_path / "s.parquet"
    survey.mkdir()  # not read: the checks come first
    assert cli.main(["report", str(survey), "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"headscope report: {tmp_path} is a folder; --out names the file to write (a folder is never replaced)"
    )
    (tmp_path / "notes").write_text("a file")
    assert cli.main(["report", str(survey), "--out", str(tmp_path / "notes" / "r.html")]) == 2
    assert capsys.readouterr().err.strip().endswith(f"{tmp_path / 'notes'} is a file, not a folder")


def test_a_models_folder_that_cannot_be_written_is_said_before_a_download(tmp_path, capsys, monkeypatch):
    (tmp_path / "models").write_text("a file where the models folder should be")
    monkeypatch.setenv("HEADSCOPE_MODELS_DIR", str(tmp_path / "models"))
    said = (
        f"the default model cannot be converted into the models folder: cannot write {tmp_path / 'models'}: "
        f"{tmp_path / 'models'} is a file, not a folder; set HEADSCOPE_MODELS_DIR to a folder this user can write"
    )
    assert cli.main(["fetch"]) == 1
    assert capsys.readouterr().err.strip() == f"headscope fetch: {said}"
    out = tmp_path / "attn.safetensors"
    # fetch's own work failed: 1; extract cannot start without the model: 2 (docs/cli.md, Exit status)
    assert cli.main(["extract", str(SAMPLES / "cat.png"), "--out", str(out), "--model", "dinov2-s14-focus"]) == 2
    assert capsys.readouterr().err.strip() == f"headscope extract: {said}"
