"""Issue 39 item 7: ``headscope report`` on a hostile Parquet file: a clear message and exit 2, in
bounded time, never a traceback (a head number out of range, a huge one, metadata of another
shape, wrong column types, lists of the wrong length, a file that is not Parquet)."""

from __future__ import annotations

import json
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_survey_output import rows

from headscope.survey import schema
from headscope.survey.report import build_report
from headscope.survey.report_input import ReportError

ROOT_TIMEOUT_S = 120  # a hang (the old 32767-head case ran for minutes) fails here, not in CI's budget


def write(tmp_path, table: pa.Table, meta=None, folder: bool = True):
    """``table`` as a survey folder's one part (or a lone file), with ``meta`` as its metadata."""
    if meta is not None:
        table = table.replace_schema_metadata({schema.META_KEY: json.dumps(meta).encode()})
    if not folder:
        path = tmp_path / "rows.parquet"
        pq.write_table(table, path)
        return path
    out = tmp_path / "survey"
    out.mkdir()
    pq.write_table(table, out / "part-00000.parquet")
    return out


def with_value(table: pa.Table, column: str, row: int, value) -> pa.Table:
    values = table.column(column).to_pylist()
    values[row] = value
    i = table.schema.get_field_index(column)
    return table.set_column(i, table.schema.field(i), pa.array(values, table.schema.field(i).type))


def report(path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "headscope.cli", "report", str(path), "--out", str(path.parent / "r.html")]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=ROOT_TIMEOUT_S)


def hostile():
    good = rows(["a.png", "b.png"], L=2, H=3)
    cases = {
        "head 300": (with_value(good, "head", 4, 300), {"model": "m"}),
        "head 32767": (with_value(good, "head", 0, 32767), {"model": "m"}),
        "negative layer": (with_value(good, "layer", 1, -1), {"model": "m"}),
        "metadata list": (good, [1, 2, 3]),
        "metadata types": (good, {"model": ["x"], "similarity": "yes"}),
        "layers disagree": (good, {"model": "m", "layers": 12}),
        "short list": (with_value(good, "cls_cosine", 2, [1.0]), {"model": "m"}),
        "string layer": (good.set_column(1, "layer", pa.array([str(v) for v in good.column("layer").to_pylist()])), {}),
    }
    return cases


CASES = [
    "head 300",
    "head 32767",
    "negative layer",
    "metadata list",
    "metadata types",
    "layers disagree",
    "short list",
    "string layer",
]


@pytest.mark.parametrize("case", CASES)
def test_a_hostile_survey_is_a_clear_report_error(tmp_path, case):
    table, meta = hostile()[case]
    path = write(tmp_path, table, meta)
    with pytest.raises(ReportError):
        build_report(path)


@pytest.mark.parametrize("case", ["head 300", "head 32767", "metadata list"])
def test_the_command_exits_2_with_one_line_and_no_traceback(tmp_path, case):
    table, meta = hostile()[case]
    out = report(write(tmp_path, table, meta))
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr.startswith("headscope report: ") and "Traceback" not in out.stderr


def test_a_file_that_is_not_parquet_exits_2(tmp_path):
    path = tmp_path / "rows.parquet"
    path.write_bytes(b"PAR1" + b"\0" * 100)
    out = report(path)
    assert out.returncode == 2 and "not a survey" in out.stderr and "Traceback" not in out.stderr


def test_a_good_survey_still_reports(tmp_path):
    path = write(tmp_path, rows(["a.png", "b.png"], L=2, H=3), {"model": "m", "similarity": False}, folder=True)
    assert "<html" in build_report(path)
    (tmp_path / "lone").mkdir()
    assert "<html" in build_report(write(tmp_path / "lone", rows(["a.png"]), None, folder=False))


def test_a_picture_named_like_markup_is_data_in_the_report(tmp_path):
    """#39 item 6: the report's embedded JSON (its metadata, Plotly's figures) escapes ``<``."""
    name = "<!--<script>x.png"
    path = write(tmp_path, rows([name, "b.png"], L=2, H=3), {"model": name, "similarity": False})
    page = build_report(path)
    scripts = page.split("<script", 1)[1]  # everything from the first script element on
    assert name not in scripts and "\\u003c!--\\u003cscript\\u003ex.png" in scripts
