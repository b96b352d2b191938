"""The output folder: parts written atomically, failures apart, resume, refusals."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from headscope.survey import output as out_mod
from headscope.survey import schema
from headscope.survey.output import OutputError, SurveyOutput, read_failures, read_table

META = {"model": "m", "resize": "aspect"}


def rows(images: list[str], L: int = 2, H: int = 3) -> pa.Table:
    n = L * H
    recs = []
    for img in images:
        for i in range(n):
            recs.append(
                {
                    "image": img,
                    "layer": i // H,
                    "head": i % H,
                    "entropy": 0.5,
                    "entropy_cls": 0.4,
                    "distance_px": 10.0 + i,
                    "prefix_mass": 0.1,
                    "artifact_mass": 0.0,
                    "mass_patches": 3,
                    "cls_cosine": [1.0] * H,
                    "similarity": None,
                    "rank_numerical": None,
                    "rank_effective": None,
                    "image_height": 30,
                    "image_width": 40,
                    "input_height": 32,
                    "input_width": 48,
                    "grid_rows": 2,
                    "grid_cols": 3,
                    "tokens": 7,
                    "prefix_tokens": 1,
                    "artifact_tokens": 0,
                    "artifact_threshold": 1.0,
                }
            )
    return pa.Table.from_pylist(recs, schema=schema.ROWS)


def test_parts_are_written_as_they_fill_and_read_back_whole(tmp_path):
    out = SurveyOutput(tmp_path / "s.parquet", META, part_images=2)
    out.add(rows(["a.png"]), schema.failures_table([("bad.png", "not_an_image", "no")]), 2)  # due: written
    assert len(out_mod.parts(tmp_path / "s.parquet")) == 1
    out.add(rows(["b.png"]), schema.empty_failures(), 1)  # buffered
    assert len(out_mod.parts(tmp_path / "s.parquet")) == 1
    out.close()
    files = out_mod.parts(tmp_path / "s.parquet")
    assert len(files) == 2 and not list((tmp_path / "s.parquet").glob(".*"))
    t = read_table(tmp_path / "s.parquet")
    assert t.schema.remove_metadata() == schema.ROWS and t.num_rows == 12
    assert sorted(set(t.column("image").to_pylist())) == ["a.png", "b.png"]
    assert read_failures(tmp_path / "s.parquet").to_pylist() == [
        {"image": "bad.png", "error": "not_an_image", "message": "no"}
    ]
    assert schema.meta_of(pq.read_schema(files[0])) == META
    assert (out.images_written, out.failures_written, out.rows_written) == (2, 1, 12)
    # Readers of the folder (pyarrow's dataset discovery, as pandas uses) see rows, not failures.
    assert pq.read_table(tmp_path / "s.parquet").num_rows == 12


def test_an_existing_survey_needs_resume_and_the_same_settings(tmp_path):
    path = tmp_path / "s.parquet"
    out = SurveyOutput(path, META)
    out.add(rows(["a.png"]), schema.failures_table([("b.png", "corrupt_image", "truncated")]), 2)
    out.close()
    with pytest.raises(OutputError, match="--resume"):
        SurveyOutput(path, META)
    with pytest.raises(OutputError, match="model"):
        SurveyOutput(path, {**META, "model": "other"}, resume=True)
    again = SurveyOutput(path, META, resume=True)
    assert again.done() == {"a.png", "b.png"}  # failures count as done: they would fail again
    (tmp_path / "file.parquet").write_bytes(b"x")
    with pytest.raises(OutputError, match="not a survey folder"):
        SurveyOutput(tmp_path / "file.parquet", META)


def test_resume_takes_the_same_methods_in_another_order_and_names_the_default_target(tmp_path):
    """``--faithfulness chefer,random`` then ``random,chefer``: the same test (it was refused); the
    parts keep the first order. A different target names the default as the flag does (region)."""
    path = tmp_path / "s.parquet"
    test = {"methods": ["chefer", "random"], "target": None, "fractions": [0.5], "seed": 0}
    out = SurveyOutput(path, {**META, "faithfulness": test})
    out.add(rows(["a.png"]), schema.empty_failures(), 1)
    out.close()
    meta = {**META, "faithfulness": {**test, "methods": ["random", "chefer"]}}
    again = SurveyOutput(path, meta, resume=True)
    assert again.done() == {"a.png"} and meta["faithfulness"]["methods"] == ["chefer", "random"]
    with pytest.raises(OutputError, match=r"faithfulness.target: 'region' there, 'output' now"):
        SurveyOutput(path, {**META, "faithfulness": {**test, "target": "output"}}, resume=True)
    with pytest.raises(OutputError, match=r"faithfulness.methods: \['chefer', 'random'\] there"):
        SurveyOutput(path, {**META, "faithfulness": {**test, "methods": ["chefer"]}}, resume=True)


def test_a_part_that_failed_midway_is_never_visible_and_is_cleaned_up(tmp_path, monkeypatch):
    path = tmp_path / "s.parquet"
    out = SurveyOutput(path, META)
    real = pq.write_table

    def half_written(table, where, **kw):
        real(table.slice(0, 1), where, **kw)  # something reached the disk...
        raise OSError("disk full")  # ...and then the write failed

    monkeypatch.setattr(out_mod.pq, "write_table", half_written)
    out.add(rows(["a.png"]), schema.empty_failures(), 1)
    with pytest.raises(OSError):
        out.close()
    assert out_mod.parts(path) == [] and read_table(path).num_rows == 0  # nothing half-written is read
    assert list(path.glob(".*.tmp"))
    monkeypatch.setattr(out_mod.pq, "write_table", real)
    SurveyOutput(path, META, resume=True)  # a new run removes the leftover
    assert not list(path.glob(".*.tmp"))


def test_an_out_that_is_someone_elses_folder_or_cannot_be_made_is_refused_before_the_model_loads(tmp_path):
    photos = tmp_path / "photos"
    photos.mkdir()
    (photos / "cat.png").write_bytes(b"...")
    (photos / ".DS_Store").write_bytes(b"")
    with pytest.raises(OutputError, match=r"photos holds files that are not a survey's parts \('cat.png'"):
        out_mod.check_target(photos, resume=False)  # `survey photos --out photos`
    (tmp_path / "notes").write_text("a file")
    with pytest.raises(OutputError, match="notes is a file, not a folder"):
        out_mod.check_target(tmp_path / "notes" / "survey.parquet", resume=False)
    with pytest.raises(OutputError, match="faithfulness.parquet holds files that are not a faithfulness table's"):
        beside = tmp_path / "s.faithfulness.parquet"
        beside.mkdir()
        (beside / "readme.txt").write_text("mine")
        out_mod.check_target(tmp_path / "s.parquet", resume=False, faithfulness=True)
    fresh = tmp_path / "new" / "survey.parquet"
    out_mod.check_target(fresh, resume=False)  # made when the first part is written, not here
    assert not (tmp_path / "new").exists()
    empty = tmp_path / "empty.parquet"
    empty.mkdir()
    out_mod.check_target(empty, resume=False)
    assert list(empty.iterdir()) == []  # the probe file is gone
