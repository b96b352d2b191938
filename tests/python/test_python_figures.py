"""``Attention.save`` and ``Attention.figure``: SVG with text and a vector colour bar, a one-page
PDF, PNG; the map drawn is the API's; bad arguments; the notebook extra's ImportError."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET

import numpy as np
import pytest
from PIL import Image

import headscope
from headscope.python import figures

SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture(scope="module")
def att(tmp_path_factory):
    scope = headscope.load("random:test_vit", device="cpu", models_dir=tmp_path_factory.mktemp("models"))
    picture = np.random.default_rng(5).integers(0, 256, (90, 120, 3), dtype=np.uint8)
    return scope.attention(picture, layers=[0, -1], heads="all", query="all")


def test_svg_holds_text_and_a_vector_colour_bar(att, tmp_path):
    path = att.save(tmp_path / "fig.svg", layer=-1, head=1, query=(2, 3))
    root = ET.parse(path).getroot()
    text = " ".join("".join(t.itertext()) for t in root.iter(f"{SVG}text"))
    assert "random:test_vit" in text and "layer 5" in text and "head 1" in text and "query patch (2, 3)" in text
    assert "attention weight" in text and "x (pixels)" in text
    # the picture and the map are rasters (matplotlib may composite them into one); the rest vectors
    assert 1 <= len(list(root.iter(f"{SVG}image"))) <= 2
    assert len(list(root.iter(f"{SVG}path"))) > 50  # the colour bar's 256 solids among them


def test_pdf_has_one_page_with_its_caption(att, tmp_path):
    from pypdf import PdfReader

    path = att.save(tmp_path / "fig.pdf", layer=0, head="mean", query="cls")
    reader = PdfReader(path)
    assert len(reader.pages) == 1
    words = reader.pages[0].extract_text()
    assert "random:test_vit" in words and "mean" in words and "CLS" in words


def test_png_and_the_grid(att, tmp_path):
    png = att.save(tmp_path / "fig.png", dpi=100)
    assert Image.open(png).size[0] > 300
    fig = att.figure(path=tmp_path / "grid.pdf")
    L, H = len(att.layers), len(att.heads)
    assert len(fig.axes) == L * H + 1  # one colour bar for every map
    from pypdf import PdfReader

    assert len(PdfReader(tmp_path / "grid.pdf").pages) == 1
    svg = att.figure(layers=-1, heads=[1], query=(0, 0), path=tmp_path / "grid.svg")
    assert len(svg.axes) == 2 and (tmp_path / "grid.svg").stat().st_size > 0


def test_the_map_drawn_is_the_apis(att):
    fig = figures.map_figure(att, layer=-1, head=1, query=(2, 3))
    drawn = np.asarray(fig.axes[0].images[1].get_array())
    rows, cols = att.grid
    token = att.tokens["num_prefix"] + 2 * cols + 3
    want = att.maps[-1, 1, token, att.tokens["num_prefix"] :].reshape(rows, cols).numpy()
    np.testing.assert_array_equal(drawn, want)


def test_bad_arguments(att, tmp_path):
    with pytest.raises(ValueError, match="a figure is saved as .svg, .pdf, .png; got 'fig.gif'"):
        att.save(tmp_path / "fig.gif")
    with pytest.raises(ValueError, match="a figure shows one query token"):
        att.save(tmp_path / "fig.svg", query="all")
    with pytest.raises(ValueError, match="layers: index 40 is out of range"):
        att.save(tmp_path / "fig.svg", layer=40)
    with pytest.raises(TypeError, match="figure\\(\\) draws several"):
        att.save(tmp_path / "fig.svg", layer=[0, 1])
    assert not list(tmp_path.iterdir())


def test_without_matplotlib_the_error_names_the_extra(att, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what a venv without it gives
    with pytest.raises(
        ImportError, match=r"needs matplotlib, part of the notebook extra: pip install 'headscope\[notebook\]'"
    ):
        att.save(tmp_path / "fig.png")
    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(ImportError, match="needs pandas"):
        att.stats()


@pytest.mark.parametrize("shape", [(90, 120, 3), (120, 90, 3), (60, 240, 3)], ids=["landscape", "portrait", "wide"])
def test_the_colour_bar_is_as_tall_as_the_picture(tmp_path_factory, shape):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    scope = headscope.load("random:test_vit", device="cpu", models_dir=tmp_path_factory.mktemp("models"))
    picture = np.random.default_rng(5).integers(0, 256, shape, dtype=np.uint8)
    att = scope.attention(picture, layers=[-1], heads=[1], query="all")
    fig = figures.map_figure(att, -1, 1, (0, 0))
    FigureCanvasAgg(fig).draw()
    ax = fig.axes[0]
    (cax,) = ax.child_axes
    im, bar = ax.get_window_extent(), cax.get_window_extent()
    assert bar.height == pytest.approx(im.height, abs=1.0) and bar.y0 == pytest.approx(im.y0, abs=1.0)
    assert bar.x0 > im.x1  # beside the picture, not over it
    tight = fig.get_tightbbox(fig.canvas.get_renderer())
    assert tight.x1 * fig.dpi <= fig.bbox.x1 + 1  # its labels inside the figure
