"""Survey rows on a tiny random model: the engine's statistics, failures recorded, resume, interruption."""

from __future__ import annotations

import io
import shutil

import numpy as np
import pyarrow.compute as pc
import pytest
import torch
from PIL import Image

from headscope.config import Settings
from headscope.engine.forward import forward_capture
from headscope.engine.stats import compute_stats
from headscope.serving.pictures import Pictures
from headscope.survey import run as run_mod
from headscope.survey import schema
from headscope.survey.compute import Surveyor
from headscope.survey.output import read_failures, read_table
from headscope.survey.run import survey
from headscope.survey.sources import list_images

MODEL = "random:test_vit"
STAT_COLUMNS = ["entropy", "entropy_cls", "distance_px", "prefix_mass", "artifact_mass"]


def picture(path, w, h, seed):
    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(path)
    return path


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """Pictures of three sizes (two aspect ratios), a sub-folder, and four that cannot be read."""
    d = tmp_path_factory.mktemp("pics")
    for i in range(5):
        picture(d / f"p{i}.png", 64, 48, i)
    picture(d / "sub" / "wide.png", 120, 40, 10)
    picture(d / "sub" / "tall.jpg", 40, 64, 11)
    (d / "text.png").write_text("not a picture")
    (d / "empty.jpg").write_bytes(b"")
    buf = io.BytesIO()
    Image.new("RGB", (64, 64), "red").save(buf, "PNG")
    (d / "truncated.png").write_bytes(buf.getvalue()[:60])
    picture(d / "huge.png", 300, 300, 12)  # over the pixel limit the tests set
    return d


@pytest.fixture(scope="module")
def settings(tmp_path_factory):
    return Settings(models_dir=tmp_path_factory.mktemp("models"), max_image_pixels=200 * 200, device="cpu")


@pytest.fixture(scope="module")
def surveyor(settings):
    return Surveyor(MODEL, "cpu", batch_size=3, settings=settings)


def test_rows_hold_the_engines_statistics_and_failures_their_reason(folder, surveyor, settings):
    res = surveyor.process(list_images(folder))
    t = res.rows
    lm = surveyor.lm
    L, H = lm.num_layers, lm.num_heads
    assert t.schema == schema.ROWS
    assert sorted(set(t.column("image").to_pylist())) == [
        "p0.png",
        "p1.png",
        "p2.png",
        "p3.png",
        "p4.png",
        "sub/tall.jpg",
        "sub/wide.png",
    ]
    assert t.num_rows == 7 * L * H
    fails = {r["image"]: r["error"] for r in res.failures.to_pylist()}
    assert fails == {
        "text.png": "not_an_image",
        "empty.jpg": "empty_file",
        "truncated.png": "corrupt_image",
        "huge.png": "image_too_large",
    }
    # Each picture's rows equal the engine's statistics of its own capture, computed apart.
    for name in ("p3.png", "sub/wide.png"):
        prep = Pictures.for_model(lm, settings).prepare((folder / name).read_bytes())
        att = forward_capture(lm, prep.pixels[None])[0]
        layout = lm.layout(prep.input_size)
        st = compute_stats(att, layout, 0.6, similarity=False, with_ranks=False)
        mine = t.filter(pc.equal(t.column("image"), name)).sort_by([("layer", "ascending"), ("head", "ascending")])
        for col in STAT_COLUMNS:
            np.testing.assert_allclose(
                mine.column(col).to_numpy(), getattr(st, col).reshape(-1).numpy(), rtol=1e-5, atol=1e-6, err_msg=col
            )
        assert mine.column("mass_patches").to_pylist() == st.mass_patches.reshape(-1).tolist()
        r0 = mine.slice(0, 1).to_pylist()[0]
        assert (r0["image_height"], r0["image_width"]) == prep.image_size
        assert (r0["input_height"], r0["input_width"]) == prep.input_size
        assert (r0["grid_rows"], r0["grid_cols"], r0["tokens"]) == (*layout.grid, layout.count)
        assert r0["artifact_tokens"] == len(st.artifacts)
        assert r0["similarity"] is None and r0["rank_effective"] is None  # not asked for


def test_batch_size_and_extra_columns_do_not_change_the_values(folder, settings, surveyor):
    items = list_images(folder)[:7]
    a = surveyor.process(items).rows
    b = Surveyor(MODEL, "cpu", batch_size=1, settings=settings, similarity=True, ranks=True).process(items).rows
    key = [("image", "ascending"), ("layer", "ascending"), ("head", "ascending")]
    a, b = a.sort_by(key), b.sort_by(key)
    for col in STAT_COLUMNS:
        np.testing.assert_allclose(a.column(col).to_numpy(), b.column(col).to_numpy(), rtol=1e-5, atol=1e-6)
    H = surveyor.lm.num_heads
    sim = np.array(b.column("similarity").to_pylist())
    assert sim.shape == (b.num_rows, H) and np.allclose(sim[np.arange(b.num_rows), b.column("head").to_numpy()], 1)
    assert b.column("rank_numerical").null_count == 0 and pc.min(b.column("rank_effective")).as_py() >= 1


def test_survey_writes_parts_and_resume_skips_what_is_done(folder, settings, tmp_path):
    out = tmp_path / "s.parquet"
    s1 = survey(folder, out, model=MODEL, batch_size=2, limit=5, progress=False, part_images=2, settings=settings)
    assert (s1.listed, s1.skipped) == (11, 0) and s1.surveyed + s1.failed == 5
    s2 = survey(folder, out, model=MODEL, batch_size=2, resume=True, progress=False, settings=settings)
    assert s2.skipped == 5 and s2.surveyed + s2.failed == 6
    t = read_table(out)
    assert len(set(t.column("image").to_pylist())) == 7 and read_failures(out).num_rows == 4
    s3 = survey(folder, out, model=MODEL, resume=True, progress=False, settings=settings)
    assert s3.skipped == 11 and s3.surveyed == s3.failed == 0


def test_an_interrupted_run_keeps_what_it_computed_and_resume_finishes_it(folder, settings, tmp_path, monkeypatch):
    whole = tmp_path / "whole.parquet"
    survey(folder, whole, model=MODEL, batch_size=2, progress=False, settings=settings)

    out = tmp_path / "cut.parquet"
    real_add = run_mod.SurveyOutput.add
    calls = {"n": 0}

    def add_then_ctrl_c(self, rows, failures, n, *more):
        real_add(self, rows, failures, n, *more)
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt  # as Ctrl-C (or SIGTERM) arrives mid-run

    monkeypatch.setattr(run_mod.SurveyOutput, "add", add_then_ctrl_c)
    cut = survey(folder, out, model=MODEL, batch_size=2, progress=False, settings=settings)
    assert cut.interrupted and 0 < cut.surveyed + cut.failed < 11
    done = set(read_table(out).column("image").to_pylist()) | set(read_failures(out).column("image").to_pylist())
    assert len(done) == cut.surveyed + cut.failed  # the buffer was written on the way out
    monkeypatch.setattr(run_mod.SurveyOutput, "add", real_add)
    rest = survey(folder, out, model=MODEL, batch_size=2, resume=True, progress=False, settings=settings)
    assert not rest.interrupted and rest.skipped == len(done)
    key = [("image", "ascending"), ("layer", "ascending"), ("head", "ascending")]
    a, b = read_table(whole).sort_by(key), read_table(out).sort_by(key)
    assert a.column("image").to_pylist() == b.column("image").to_pylist()
    for col in STAT_COLUMNS:
        np.testing.assert_allclose(a.column(col).to_numpy(), b.column(col).to_numpy(), rtol=1e-5, atol=1e-6)


def test_bad_arguments_are_refused_before_any_work(folder, settings, tmp_path):
    with pytest.raises(ValueError, match="engine"):
        survey(folder, tmp_path / "x", engine="spark", settings=settings)
    for size in (0, 4097, 10**20):  # a huge one broke "at most 4 batches buffered": memory without bound
        with pytest.raises(ValueError, match="--batch-size must be 1 to 4,096"):
            survey(folder, tmp_path / "x", batch_size=size, settings=settings)
    with pytest.raises(FileNotFoundError):
        survey(tmp_path / "missing", tmp_path / "x", settings=settings)


def test_a_picture_that_fails_in_the_forward_is_recorded_and_its_batch_mates_are_kept(folder, settings, monkeypatch):
    sv = Surveyor(MODEL, "cpu", batch_size=4, settings=settings)
    items = [it for it in list_images(folder) if it.image.startswith("p")][:4]
    real = sv._rows

    def rows_or_boom(p, att, st=None):
        if p.item.image == items[1].image:
            raise RuntimeError("boom")
        return real(p, att, st)

    monkeypatch.setattr(sv, "_rows", rows_or_boom)
    res = sv.process(items)
    boom = {"image": items[1].image, "error": "compute_error", "message": "RuntimeError: boom"}
    assert res.failures.to_pylist() == [boom]
    L, H = sv.lm.num_layers, sv.lm.num_heads
    names = res.rows.column("image").to_pylist()
    assert len(set(names)) == 3
    # Each batch-mate once: the rows made before the error are not kept beside the re-run's.
    assert len(names) == 3 * L * H, {n: names.count(n) for n in set(names)}


def test_out_of_memory_splits_the_batch_in_the_batch_runner(folder, settings, monkeypatch):
    # the survey's out-of-memory split is the batch runner's (engine/batching.py): a batch that
    # runs out of memory is halved until it fits; a picture that never fits is a failure record
    # with the device's own message, its batch-mates surveyed
    sv = Surveyor(MODEL, "cpu", batch_size=4, settings=settings)
    items = [it for it in list_images(folder) if it.image.startswith("p")][:4]
    ok, _ = sv.prepare_all(items)
    huge = ok[2].raw
    real = sv.runner.capture
    sizes: list[int] = []

    def capture(x, **kw):
        sizes.append(len(x))
        if len(x) > 2 or any(torch.equal(sv.runner.inputs([huge])[0], xi) for xi in x):
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(x, **kw)

    monkeypatch.setattr(sv.runner, "capture", capture)
    res = sv.compute(ok)
    assert sizes[0] == 4 and 2 in sizes and 1 in sizes  # halved, then the culprit alone
    assert res.failures.to_pylist() == [
        {
            "image": ok[2].item.image,
            "error": "out_of_memory",
            "message": "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        }
    ]
    names = res.rows.column("image").to_pylist()
    assert sorted(set(names)) == sorted(p.item.image for i, p in enumerate(ok) if i != 2)
    assert len(names) == 3 * sv.lm.num_layers * sv.lm.num_heads


def test_copying_a_folder_keeps_the_names(folder, tmp_path):
    shutil.copytree(folder, tmp_path / "copy")
    assert [i.image for i in list_images(tmp_path / "copy")] == [i.image for i in list_images(folder)]
    assert torch.get_num_threads() >= 1
