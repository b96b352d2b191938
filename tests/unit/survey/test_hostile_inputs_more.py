"""Hostile inputs of the survey and the report: file names that are not UTF-8, failure records
that hold anything, metadata nested deeper than Python recurses, a survey without a statistics
column."""

from __future__ import annotations

import os

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image
from test_report_hostile import report, write
from test_survey_output import rows

from headscope.config import Settings
from headscope.survey import schema
from headscope.survey.output import read_failures, read_table
from headscope.survey.report import COLUMNS, build_report
from headscope.survey.report_input import ReportError, checked_survey
from headscope.survey.run import survey

MODEL = "random:test_vit"
LATIN1 = os.fsdecode(b"caf\xe9.png")  # "café.png" written in Latin-1: 'caf\udce9.png' in Python


@pytest.fixture(scope="module")
def settings(tmp_path_factory):
    return Settings(models_dir=tmp_path_factory.mktemp("models"), max_image_pixels=200 * 200, device="cpu")


def _picture(path, seed):
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 255, (48, 64, 3), dtype=np.uint8)).save(path, "PNG")


def test_schema_text_escapes_what_utf8_cannot_hold():
    assert schema.utf8_text("café.png") == "café.png"  # valid text is left alone
    assert schema.utf8_text(LATIN1) == "caf\\xe9.png"  # the file name's own byte, as \xNN
    assert schema.utf8_text(os.fsdecode(b"sub/\xff\xfe.jpg")) == "sub/\\xff\\xfe.jpg"
    assert schema.utf8_text("lone \ud800") == "lone \\ud800"  # a surrogate no file name has
    assert os.fsencode(LATIN1).decode("utf-8", "backslashreplace") == schema.utf8_text(LATIN1)


def test_a_failure_record_is_always_written():
    why = f"UnicodeEncodeError: 'utf-8' codec can't encode character '\\udce9': {LATIN1}"
    t = schema.failures_table([(LATIN1, "compute_error", why), ("ok.png", "read_error", "lone \ud800")])
    assert t.column("image").to_pylist() == ["caf\\xe9.png", "ok.png"]
    assert t.column("message").to_pylist()[1] == "lone \\ud800"
    assert LATIN1 not in t.column("message").to_pylist()[0]


def test_a_picture_whose_name_is_not_utf8_is_surveyed_under_its_escaped_name(tmp_path, settings):
    src = tmp_path / "in"
    src.mkdir()
    _picture(src / "good.png", 1)
    _picture(src / LATIN1, 2)
    (src / os.fsdecode(b"bad\xff.png")).write_text("not a picture")
    out = tmp_path / "survey.parquet"
    s = survey(src, out, model=MODEL, batch_size=4, progress=False, settings=settings)
    assert (s.surveyed, s.failed) == (2, 1)
    t = read_table(out)
    assert sorted(set(t.column("image").to_pylist())) == ["caf\\xe9.png", "good.png"]
    fails = read_failures(out).to_pylist()
    assert [(f["image"], f["error"]) for f in fails] == [("bad\\xff.png", "not_an_image")]
    # the escape is lossless for these names: the file's bytes again
    name = min(t.column("image").to_pylist())  # "caf\\xe9.png" sorts before "good.png"
    assert os.fsdecode(name.encode().decode("unicode_escape").encode("latin-1")) == LATIN1
    # --resume knows them by the escaped name too: nothing computed or recorded again
    again = survey(src, out, model=MODEL, batch_size=4, progress=False, settings=settings, resume=True)
    assert (again.surveyed, again.failed) == (0, 0)
    assert read_table(out).num_rows == t.num_rows and len(read_failures(out)) == 1


def test_a_picture_whose_name_is_not_utf8_is_a_python_stats_row(tmp_path, settings):
    pytest.importorskip("pandas")
    import headscope

    path = tmp_path / LATIN1
    _picture(path, 3)
    scope = headscope.load(MODEL, device="cpu", models_dir=settings.models_dir)
    frame = scope.attention(path, layers=-1).stats()
    assert set(frame["image"]) == {"caf\\xe9.png"}


# -- the report ---------------------------------------------------------------------------
def test_metadata_nested_deeper_than_python_recurses_is_a_report_error(tmp_path):
    good = rows(["a.png", "b.png"], L=2, H=3)
    table = good.replace_schema_metadata({schema.META_KEY: b"[" * 100_000 + b"]" * 100_000})
    out = tmp_path / "survey"
    out.mkdir()
    pq.write_table(table, out / "part-00000.parquet")
    with pytest.raises(ReportError, match="not a survey Headscope can read"):
        checked_survey(out, COLUMNS)
    done = report(out)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.startswith("headscope report: ")


@pytest.mark.parametrize("column", ["entropy", "entropy_cls", "distance_px", "prefix_mass", "artifact_mass"])
def test_a_missing_statistics_column_is_named_in_one_line(tmp_path, column):
    good = rows(["a.png", "b.png"], L=2, H=3)
    out = write(tmp_path, good.drop([column]), {"model": "m"})
    with pytest.raises(ReportError) as e:
        build_report(out)
    assert f"no {column!r} column" in str(e.value)
    assert "\n" not in str(e.value)
    done = report(out)
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if "INFO" not in line]
    assert len(lines) == 1 and column in lines[0] and "FieldRef" not in lines[0], done.stderr


def test_a_survey_missing_the_optional_columns_still_reports(tmp_path):
    good = rows(["a.png", "b.png"], L=2, H=3)
    optional = ["cls_cosine", "similarity", "rank_numerical", "rank_effective", "artifact_tokens", "stage"]
    out = write(tmp_path, good.drop([c for c in optional if c in good.column_names]), {"model": "m"})
    assert "<html" in build_report(out).lower()
