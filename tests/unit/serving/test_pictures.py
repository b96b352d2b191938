"""One preparation path: every picture reaches a model through ``app.serving.pictures``."""

from __future__ import annotations

import ast
import io

import numpy as np
from PIL import Image

from headscope.serving import preprocess
from headscope.serving.pictures import Pictures
from helpers.server import ROOT

# The steps of a decode: only app/serving/pictures.py puts them together.
STEPS = {"probe", "load", "prepare", "display_png", "to_rgb"}


def _calls_of_steps(tree: ast.AST) -> list[tuple[int, str]]:
    """Calls of ``preprocess.STEP(...)`` and names imported from ``app.serving.preprocess``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("preprocess"):
            found += [(node.lineno, f"import {a.name}") for a in node.names if a.name in STEPS]
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "preprocess"
            and node.func.attr in STEPS
        ):
            found.append((node.lineno, f"preprocess.{node.func.attr}()"))
    return found


def test_nothing_but_pictures_decodes_or_resizes():
    """The server, the survey, ``extract`` and the ablation service call Pictures; a second
    decode path (as the survey's was, which skipped the early reduction) fails here."""
    offenders = []
    for path in sorted((ROOT / "app").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel in ("app/serving/pictures.py", "app/serving/preprocess.py"):
            continue
        offenders += [f"{rel}:{line}: {what}" for line, what in _calls_of_steps(ast.parse(path.read_text()))]
    assert not offenders, "decode outside app/serving/pictures.py:\n" + "\n".join(offenders)


def _png(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return buf.getvalue()


def test_a_large_picture_is_reduced_early_and_planned_from_its_original_size():
    """A 1411 x 1411 picture for a 224 px model: shrunk 2 x 2 by a box filter before the bicubic
    resize (not resized whole), the input planned from 1411 x 1411; a 224 px one is untouched."""
    rng = np.random.default_rng(0)
    big = Image.fromarray(rng.integers(0, 256, (1411, 1411, 3), dtype=np.uint8))
    pictures = Pictures((224, 224), (14, 14), (0.5,) * 3, (0.25,) * 3)
    prep = pictures.prepare(_png(big))
    assert prep.image_size == (1411, 1411) and prep.input_size == (224, 224)
    reduced = big.reduce(2).resize((224, 224), Image.Resampling.BICUBIC)
    want = (np.asarray(reduced, np.float32) / 255 - 0.5) / 0.25
    np.testing.assert_array_equal(prep.pixels.numpy(), want.transpose(2, 0, 1))
    direct = big.resize((224, 224), Image.Resampling.BICUBIC)  # what the survey used to do
    assert not np.array_equal(np.asarray(direct), np.asarray(reduced))

    small = Image.fromarray(rng.integers(0, 256, (224, 224, 3), dtype=np.uint8))
    same = pictures.prepare(_png(small))
    want = (np.asarray(small, np.float32) / 255 - 0.5) / 0.25
    np.testing.assert_array_equal(same.pixels.numpy(), want.transpose(2, 0, 1))


def test_the_display_picture_is_bounded():
    from headscope.serving.pictures import display_finish, display_probe

    data = _png(Image.new("RGB", (4000, 1000), (10, 20, 30)))
    shown = Image.open(io.BytesIO(display_finish(display_probe(data, 40_000_000))))
    assert shown.size == (preprocess.DISPLAY_MAX_SIDE, 400)
