"""Survey rows of a windowed model (a tiny random Swin): the window statistics per stage, and a report."""

from __future__ import annotations

import numpy as np
import pyarrow.compute as pc
import pytest
from PIL import Image

from headscope.config import Settings
from headscope.engine.forward import forward_capture
from headscope.engine.window_stats import window_stats
from headscope.serving.pictures import Pictures
from headscope.survey import schema
from headscope.survey.compute import Surveyor
from headscope.survey.output import SurveyOutput
from headscope.survey.report import build_report
from headscope.survey.sources import list_images
from headscope.zoo.ids import ModelSpec
from headscope.zoo.loaders import load_random

NULL_FOR_WINDOWS = ["entropy_cls", "prefix_mass", "artifact_mass", "mass_patches", "cls_cosine"]
KEY = [("layer", "ascending"), ("head", "ascending")]


@pytest.fixture(scope="module")
def tiny_swin():
    """Swin with two stages of two blocks (2 and 4 heads), 32 channels: 12 rows per picture."""
    spec = ModelSpec.parse("random:swin_tiny_patch4_window7_224")
    return load_random(spec, depths=(2, 2), num_heads=(2, 4), embed_dim=32)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    d = tmp_path_factory.mktemp("swin-pics")
    rng = np.random.default_rng(0)
    for name, (w, h) in {"square.png": (90, 90), "wide.png": (160, 96), "sub/tall.png": (96, 150)}.items():
        (d / name).parent.mkdir(exist_ok=True)
        Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(d / name)
    (d / "broken.png").write_text("not a picture")
    return d


@pytest.fixture(scope="module")
def result(tiny_swin, folder, tmp_path_factory):
    settings = Settings(device="cpu", models_dir=tmp_path_factory.mktemp("models"))
    s = Surveyor(lm=tiny_swin, device="cpu", batch_size=2, similarity=True, ranks=True, settings=settings)
    return s.process(list_images(folder)), settings


def test_swin_rows_are_the_stats_endpoints_window_statistics(tiny_swin, folder, result):
    res, settings = result
    t = res.rows
    lm = tiny_swin
    assert t.schema == schema.ROWS
    assert res.failures.column("image").to_pylist() == ["broken.png"]
    assert sorted(set(t.column("image").to_pylist())) == ["square.png", "sub/tall.png", "wide.png"]
    assert t.num_rows == 3 * (2 * 2 + 2 * 4)  # each layer has its stage's heads
    for col in NULL_FOR_WINDOWS:
        assert t.column(col).null_count == t.num_rows, col
    for name in ("square.png", "wide.png", "sub/tall.png"):
        # The endpoint's computation on a capture of this picture alone (batch of one).
        prep = Pictures.for_model(lm, settings).prepare((folder / name).read_bytes())
        att = forward_capture(lm, prep.pixels[None])[0]
        want = window_stats(att).as_dict(prep.input_size)
        mine = t.filter(pc.equal(t.column("image"), name)).sort_by(KEY)
        assert mine.column("layer").to_pylist() == [0, 0, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3]
        assert mine.column("head").to_pylist() == [0, 1, 0, 1, 0, 1, 2, 3, 0, 1, 2, 3]
        assert mine.column("stage").to_pylist() == [0] * 4 + [1] * 8
        for col in ("entropy", "distance_px"):
            np.testing.assert_allclose(
                mine.column(col).to_numpy(), np.concatenate(want[col]), rtol=1e-5, atol=1e-6, err_msg=col
            )
        sims = mine.column("similarity").to_pylist()
        np.testing.assert_allclose(
            np.concatenate([np.ravel(s) for s in sims]),
            np.concatenate([np.ravel(s) for s in want["similarity"]]),
            atol=1e-5,
        )
        per_layer = mine.filter(pc.equal(mine.column("head"), 0))
        assert per_layer.column("rank_numerical").to_pylist() == want["rank"]["numerical"]
        np.testing.assert_allclose(per_layer.column("rank_effective").to_numpy(), want["rank"]["effective"], rtol=1e-5)
        grids = {s.index: s.grid for s in att.stages}
        for r in mine.to_pylist():
            assert (r["grid_rows"], r["grid_cols"]) == grids[r["stage"]]
            assert r["tokens"] == grids[r["stage"]][0] * grids[r["stage"]][1] and r["prefix_tokens"] == 0
            assert (r["input_height"], r["input_width"]) == prep.input_size
            assert r["artifact_tokens"] == len(want["artifacts"]["tokens"])


def test_a_report_of_a_swin_survey_shows_each_stages_heads(result, tmp_path):
    res, _ = result
    out = SurveyOutput(tmp_path / "swin.parquet", {"model": "tiny-swin"})
    out.add(res.rows, res.failures, 4)
    out.close()
    page = build_report(tmp_path / "swin.parquet")
    assert "Mean attention distance against depth" in page
    assert "Not measured for this model" in page  # no prefix, no CLS, no artifact mass
    assert "over the W x W keys of the query" in page
    assert "Most similar pairs" in page and "Most specialised heads" in page
    # Layers 0 and 1 have two heads: no head 2 or 3 of theirs shows up anywhere.
    assert not any(f"layer {lyr} head {h}" in page for lyr in (0, 1) for h in (2, 3))
    assert "<b>4, 2-4</b>layers, heads per layer" in page
