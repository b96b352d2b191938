"""``headscope survey --faithfulness`` and the report's faithfulness table.

On the command line (real processes, the embedded model, two photos of two input sizes: cat
224 x 336, astronaut 224 x 224; two methods, three fractions): the table's values equal the
engine's functions (app/engine/relevance.py, faithfulness.py, exact against independent
references in tests/unit/engine/) on the same prepared pixels, the report prints the mean-AUC
table with its interval, a bad option is a clean refusal, and the Ray engine writes the same
table. In-process on a tiny random ViT (fast): ``--resume`` skips what is done, refuses other
settings and repairs a run killed between the two tables' parts without duplicating rows;
options the model cannot take are refused before any picture is read.
"""

from __future__ import annotations

import importlib.util
import math
import re
import shutil

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from headscope.survey.output import faithfulness_path, parts, read_faithfulness, read_table
from helpers.cli import CLI_TIMEOUT_S, run_cli
from helpers.server import ROOT

pytestmark = pytest.mark.timeout(4 * CLI_TIMEOUT_S)

BOX = "box:20,20,150,120"
METHODS = ["chefer", "random"]
FRACTIONS = [0.0, 0.3, 0.6]
OPTIONS = ("--faithfulness", ",".join(METHODS), "--target", "BOX: 20, 20, 150, 120", "--fractions", "0,0.3,0.6")
PICTURES = ["astronaut.png", "cat.png"]


@pytest.fixture(scope="module")
def source(tmp_path_factory, samples):
    d = tmp_path_factory.mktemp("faith-source")
    for name in PICTURES:
        shutil.copy(samples[name.split(".")[0]], d / name)
    return d


def survey(source, out, *more: str):
    r = run_cli("survey", str(source), "--out", str(out), "--batch-size", "4", "--quiet", *OPTIONS, *more)
    assert "Traceback" not in r.stderr, r.stderr
    return r


@pytest.fixture(scope="module")
def local(source, tmp_path_factory):
    out = tmp_path_factory.mktemp("faith-out") / "local.parquet"
    r = survey(source, out)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "surveyed 2 image(s)" in r.stdout and f"faithfulness: 4 row(s) in {faithfulness_path(out)}" in r.stdout
    return out


def sorted_tests(out):
    return read_faithfulness(out).sort_by([("image", "ascending"), ("method", "ascending")])


@pytest.mark.surveys  # a whole survey or extract run (a model load, every picture): make test-long
def test_the_table_holds_the_engines_perturbation_test(local, source):
    from headscope.config import Settings
    from headscope.engine.faithfulness import faithfulness
    from headscope.engine.relevance import relevance
    from headscope.serving.pictures import Pictures
    from headscope.zoo.loaders import load_embedded

    assert faithfulness_path(local).name == "local.faithfulness.parquet"
    t = sorted_tests(local)
    assert t.column_names == [
        "image", "method", "target", "class_index", "y", "auc_positive", "auc_negative",
        "fractions", "positive", "negative", "removed", "num_patches", "seed", "box", "protocol", "score0",
        "precision",
    ]  # fmt: skip
    assert set(t.column("protocol").to_pylist()) == {"live"}
    assert set(t.column("precision").to_pylist()) == {"fp32"}
    assert t.column("image").to_pylist() == [p for p in PICTURES for _ in METHODS]
    assert t.column("method").to_pylist() == METHODS * 2
    assert set(t.column("target").to_pylist()) == {BOX} and t.column("class_index").null_count == 4
    assert t.column("seed").to_pylist() == [None, 0] * 2
    assert sorted(set(read_table(local).column("image").to_pylist())) == PICTURES  # the survey's rows too
    lm = load_embedded(ROOT / "models")
    pictures = Pictures.for_model(lm, Settings())
    wants = {}
    for name in PICTURES:
        x = pictures.prepare((source / name).read_bytes()).pixels
        rel = relevance(lm, x[None], BOX, METHODS)[0]
        wants[name] = faithfulness(lm, x, rel.maps, rel.target, FRACTIONS)
    for row in t.to_pylist():
        want = wants[row["image"]]
        got, ref = row, want.methods[row["method"]]
        assert got["fractions"] == FRACTIONS and got["num_patches"] == want.num_patches
        assert got["removed"] == ref.removed and got["y"] == pytest.approx(want.y, rel=1e-5)
        np.testing.assert_allclose(got["positive"], ref.positive, rtol=1e-4, err_msg=str(row))
        np.testing.assert_allclose(got["negative"], ref.negative, rtol=1e-4, err_msg=str(row))
        assert got["auc_positive"] == pytest.approx(ref.auc_positive, rel=1e-4)
        assert got["auc_negative"] == pytest.approx(ref.auc_negative, rel=1e-4)
        assert got["score0"] == pytest.approx(want.score0, rel=1e-5)


@pytest.mark.surveys  # a whole survey or extract run (a model load, every picture): make test-long
def test_the_report_prints_the_mean_auc_table_with_its_interval(local, tmp_path):
    page = tmp_path / "report.html"
    r = run_cli("report", str(local), "--out", str(page))
    assert r.returncode == 0, r.stderr
    t = read_faithfulness(local)
    chefer = t.filter(pc.equal(t.column("method"), "chefer"))
    aucs = np.array(chefer.column("auc_positive").to_pylist())
    half = 12.7062 * aucs.std(ddof=1) / math.sqrt(2)  # Student's t(0.975) with one degree of freedom
    cell = f"{aucs.mean():.3f} [{aucs.mean() - half:.3f}, {aucs.mean() + half:.3f}]"
    assert "t-based 95 % interval" in r.stdout and f"| {BOX} | chefer | 2 | {cell} |" in r.stdout, r.stdout
    html = page.read_text()
    assert "How faithful each relevance map is" in html and cell in html
    # a region keyboard users can scroll (axe: scrollable-region-focusable with the paper's long names)
    assert 'id="faithfulness-table" tabindex="0" role="region" aria-label="faithfulness table"' in html
    assert "fig-faithfulness" in html and "Mean attention distance against depth" in html


def test_a_bad_option_is_a_clean_refusal_on_the_command_line(source, tmp_path):
    out = tmp_path / "x.parquet"
    r = run_cli("survey", str(source), "--out", str(out), "--quiet", "--faithfulness", "chefer,chefr")
    assert r.returncode == 2 and "method 'chefr': unknown" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not out.exists() and not faithfulness_path(out).exists()


# -- in-process, a tiny random ViT: resume and refusals ---------------------------------------
TINY = "random:test_vit"
TINY_OPTIONS = dict(faithfulness="chefer,random", fractions="0,0.5")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from PIL import Image

    d = tmp_path_factory.mktemp("faith-tiny")
    rng = np.random.default_rng(0)
    for i, (w, h) in enumerate([(64, 48), (64, 48), (48, 64)]):
        Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(d / f"p{i}.png")
    return d


@pytest.fixture(scope="module")
def tiny_settings(tmp_path_factory):
    from headscope.config import Settings

    return Settings(models_dir=tmp_path_factory.mktemp("models"), device="cpu")


def tiny_survey(source, out, settings, **more):
    from headscope.survey.run import survey as run_survey

    options = {"model": TINY, **TINY_OPTIONS, **more}
    return run_survey(source, out, batch_size=2, progress=False, settings=settings, **options)


def test_resume_skips_what_is_done_and_repairs_a_half_written_flush(tiny, tiny_settings, tmp_path):
    from headscope.survey.output import OutputError

    whole = tmp_path / "whole.parquet"
    s = tiny_survey(tiny, whole, tiny_settings, part_images=1)
    assert (s.surveyed, s.tests, s.tests_out) == (3, 6, faithfulness_path(whole))
    before = sorted_tests(whole)
    assert before.column("image").to_pylist() == ["p0.png", "p0.png", "p1.png", "p1.png", "p2.png", "p2.png"]
    assert set(before.column("target").to_pylist()) == {"embedding"}  # test_vit has no head: the default
    assert before.column("fractions")[0].as_py() == [0, 0.5]
    again = tiny_survey(tiny, whole, tiny_settings, resume=True)
    assert (again.skipped, again.surveyed, again.tests) == (3, 0, 0) and sorted_tests(whole).equals(before)
    with pytest.raises(OutputError, match="other settings.*faithfulness"):
        tiny_survey(tiny, whole, tiny_settings, resume=True, faithfulness=None, fractions=None)
    with pytest.raises(OutputError, match="other settings.*faithfulness") as refused:
        tiny_survey(tiny, whole, tiny_settings, resume=True, fractions="0,0.4")
    # the one setting that differs, named, not the whole test's settings as a dict
    assert "(faithfulness.fractions: [0.0, 0.5] there, [0.0, 0.4] now)" in str(refused.value), refused.value
    with pytest.raises(OutputError, match="already holds a survey"):
        tiny_survey(tiny, whole, tiny_settings)
    # A run killed between the two tables' parts of a flush: one of them misses that part.
    for lost in ("survey", "faithfulness"):
        out = tmp_path / f"{lost}.parquet"
        shutil.copytree(whole, out)
        shutil.copytree(faithfulness_path(whole), faithfulness_path(out))
        folder = out if lost == "survey" else faithfulness_path(out)
        first = parts(folder)[0]
        gone = set(pq.read_table(first, columns=["image"]).column("image").to_pylist())
        first.unlink()
        s = tiny_survey(tiny, out, tiny_settings, resume=True)
        # that picture is computed again and written only where it was missing
        assert s.skipped == 3 - len(gone) and s.tests == (2 * len(gone) if lost == "faithfulness" else 0), (lost, s)
        assert s.surveyed == (len(gone) if lost == "survey" else 0), (lost, s)
        assert sorted_tests(out).equals(before), lost  # no row twice, none missing
        assert sorted(read_table(out).column("image").to_pylist()) == sorted(
            read_table(whole).column("image").to_pylist()
        )


def test_the_progress_bar_counts_whole_pictures_with_one_decimal(tiny, tiny_settings, tmp_path, capsys):
    """The perturbed forwards move the bar by parts of a picture; it ends at the pictures done,
    exactly, and prints one decimal (it printed 3.9999999999999964/4)."""
    from headscope.survey.run import survey as run_survey

    options = {"model": TINY, **TINY_OPTIONS}
    run_survey(tiny, tmp_path / "p.parquet", batch_size=2, progress=True, settings=tiny_settings, **options)
    err = capsys.readouterr().err
    assert "3.0/3" in err.split("\r")[-1], err[-300:]
    assert not re.search(r"\d\.\d{2,}/3", err), err[-300:]


def test_options_the_model_cannot_take_are_refused_before_any_picture(tiny, tiny_settings, tmp_path):
    from headscope.engine.faithfulness import FractionsError, ProtocolError
    from headscope.engine.relevance import MethodError, RelevanceUnsupportedError, TargetError

    out = tmp_path / "x.parquet"
    cases = [
        (dict(target="output"), TargetError, "target .output. is for"),  # an embedding model
        (dict(target="blob"), TargetError, "unknown"),
        (dict(faithfulness="chefr"), MethodError, "method 'chefr': unknown"),
        (dict(fractions="0,2"), FractionsError, r"outside \[0, 1\)"),
        (dict(faithfulness=None, target="top"), ValueError, "belong to --faithfulness"),
        (dict(actors=2), ValueError, "belong to --engine ray"),  # taken and ignored by the local engine
        (dict(protocol="paper"), ProtocolError, "class target"),  # an embedding model: no top-1 to score
        (dict(protocol="theirs"), ProtocolError, "unknown"),
    ]
    for more, error, words in cases:
        with pytest.raises(error, match=words):
            tiny_survey(tiny, out, tiny_settings, **more)
        assert not out.exists() and not faithfulness_path(out).exists(), more
    with pytest.raises(RelevanceUnsupportedError, match="windowed"):
        tiny_survey(tiny, out, tiny_settings, model="random:swin_tiny_patch4_window7_224")
    assert not out.exists() and not faithfulness_path(out).exists()


@pytest.mark.ray  # a local Ray cluster: `make test-long`
@pytest.mark.skipif(
    importlib.util.find_spec("ray") is None,
    reason="Ray is not installed (the optional extra: pip install -e '.[ray]'; make test installs it)",
)
def test_the_ray_engine_writes_the_same_table(local, source, tmp_path):
    out = tmp_path / "ray.parquet"
    r = survey(source, out, "--engine", "ray")
    assert r.returncode == 0 and "faithfulness: 4 row(s)" in r.stdout, r.stdout + r.stderr
    a, b = sorted_tests(local), sorted_tests(out)
    for col in ("image", "method", "target", "fractions", "removed", "num_patches", "seed"):
        assert a.column(col).to_pylist() == b.column(col).to_pylist(), col
    for col in ("y", "auc_positive", "auc_negative", "positive", "negative"):
        want, got = (np.array(x.column(col).to_pylist(), float) for x in (a, b))
        np.testing.assert_allclose(got, want, rtol=1e-5, err_msg=col)
