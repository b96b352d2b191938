"""The survey report picture of docs/survey.md: survey variants of the sample photos, write the report, screenshot it.

    python scripts/survey_demo.py [--variants 16] [--out test-artifacts/survey-demo] [--png docs/survey-report.png]

Makes ``4 x variants`` pictures from ``static/samples`` (random crops of 40-100 % of the shorter
side, mirrored half of the time, so the set has many aspect ratios and contents), surveys them
with the default model, writes ``report.html`` next to the survey and, with ``--png``, a
full-page screenshot of it taken with headless Chromium (Playwright, Debian's ``chromium``).
The sample photos are few: the figures show the mechanics, not findings about the model.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "static" / "samples"


def make_variants(dst: Path, per_sample: int, seed: int = 0) -> int:
    rng = np.random.default_rng(seed)
    n = 0
    for src in sorted(p for p in SAMPLES.iterdir() if p.suffix in (".png", ".jpg")):
        img = Image.open(src).convert("RGB")
        sub = dst / src.stem
        sub.mkdir(parents=True, exist_ok=True)
        for i in range(per_sample):
            s = min(img.size) * rng.uniform(0.4, 1.0)
            w = min(img.width, s * rng.uniform(0.75, 1.5))
            h = min(img.height, s * rng.uniform(0.75, 1.5))
            x, y = rng.uniform(0, img.width - w), rng.uniform(0, img.height - h)
            crop = img.crop((int(x), int(y), int(x + w), int(y + h)))
            if rng.random() < 0.5:
                crop = ImageOps.mirror(crop)
            crop.save(sub / f"{src.stem}-{i:02d}.jpg", quality=92)
            n += 1
    return n


def screenshot(html: Path, png: Path, width: int = 1240) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(
            executable_path=os.environ.get("HEADSCOPE_CHROMIUM", "/usr/bin/chromium"), args=["--no-sandbox"]
        )
        ctx = b.new_context(viewport={"width": width, "height": 900}, device_scale_factor=1, offline=True)
        pg = ctx.new_page()
        pg.goto(html.as_uri())
        pg.wait_for_function("document.querySelectorAll('.js-plotly-plot .main-svg').length >= 4", timeout=120_000)
        pg.wait_for_timeout(500)
        png.parent.mkdir(parents=True, exist_ok=True)
        pg.screenshot(path=str(png), full_page=True)
        b.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", type=int, default=16, help="pictures per sample photo")
    ap.add_argument("--out", type=Path, default=ROOT / "test-artifacts" / "survey-demo")
    ap.add_argument("--png", type=Path, help="also write a screenshot of the report here")
    ap.add_argument("--engine", default="local", choices=["local", "ray"])
    a = ap.parse_args()
    pictures = a.out / "pictures"
    if not pictures.exists():
        print(f"made {make_variants(pictures, a.variants)} pictures in {pictures}")
    survey = a.out / "survey.parquet"
    run = [sys.executable, "-m", "headscope.cli"]
    if not survey.exists():
        subprocess.run(
            [*run, "survey", str(pictures), "--out", str(survey), "--engine", a.engine, "--similarity", "--ranks"],
            cwd=ROOT,
            check=True,
        )
    html = a.out / "report.html"
    subprocess.run([*run, "report", str(survey), "--out", str(html)], cwd=ROOT, check=True)
    if a.png:
        screenshot(html, a.png)
        print(f"screenshot: {a.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
