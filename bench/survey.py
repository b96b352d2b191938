"""Statistics and survey rows: what ``GET …/stats`` and ``headscope survey`` cost next to a forward.

* *statistics of one image*: the statistics of a capture already made (a default POST's: q and
  k kept, maps recomputed) as a fresh cache entry computes them, i.e. the worker's whole share of
  a ``GET /api/v1/attention/{id}/stats``; then without the ranks, and without ranks and
  similarity (what a survey computes by default). Timed interleaved with the bare forward at
  batch 1; the ratio printed is *time* over the bare forward's time (lower is better).
* *survey, local engine*: one batch of 8 pictures through :class:`app.survey.compute.Surveyor`
  as the local engine runs it (read the JPEG files, decode, resize, hooked forward with the
  maps kept, statistics, Arrow rows), interleaved with the bare forward of 8 pictures; the
  ratio is images/s over the bare forward's images/s (higher is better). Model loading and
  writing the Parquet parts (every 256 pictures) are left out: this is the marginal
  throughput of a long survey.
* *survey of large photos*: the same, on 8 square 3000 x 3000 JPEGs (a phone's square photo;
  square, so the forward is the bare forward's 224 x 224): decoding takes the early reduction
  (the JPEG decoder's DCT scaling to 750 x 750, then bicubic to 224), as the server does.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch
from PIL import Image

from headscope.config import Settings
from headscope.engine.forward import forward_capture
from headscope.engine.model import LoadedModel
from headscope.serving.store import CachedCapture
from headscope.survey.compute import Surveyor
from headscope.survey.sources import Item

from .common import BenchFailure, Variant
from .inproc import INPUT, SAMPLES, sample_pixels

SURVEY_BATCH = 8


def stats_variants(lm: LoadedModel, device: str | torch.device = "cpu") -> list[Variant]:
    """The bare forward at batch 1 and the statistics of one captured 224 px image."""
    model = lm.model
    x1 = sample_pixels(lm, 1, device)
    image = lm.captured(forward_capture(lm, x1)[0], INPUT)  # as the server caches it after a default POST
    L, H = lm.num_layers, lm.num_heads

    def bare(x):
        with torch.inference_mode():
            return model.forward_features(x1)

    def check_stats(out, batch):
        ent = torch.tensor(out["entropy"]) if isinstance(out, dict) else out.entropy
        if tuple(ent.shape) != (L, H) or not torch.isfinite(ent).all() or not ((ent > 0) & (ent <= 1)).all():
            raise BenchFailure(f"statistics of shape {tuple(ent.shape)} out of range")

    return [
        Variant("fwd_fp32", "bare forward fp32 (reference)", bare, None, "model"),
        Variant(
            "stats_all",
            "statistics of one image (GET .../stats)",
            lambda x: CachedCapture(lm.id, image, INPUT).stats(),
            check_stats,
            "stats",
            note="entropy, distance, masses, CLS, similarity, ranks",
        ),
        Variant(
            "stats_noranks",
            "  without the ranks",
            lambda x: image.stats(ranks=False),
            check_stats,
            "stats",
        ),
        Variant(
            "stats_survey",
            "  without ranks and similarity (survey default)",
            lambda x: image.stats(similarity=False, ranks=False),
            check_stats,
            "stats",
        ),
    ]


LARGE_SIDE = 3000


def write_pictures(folder: Path, n: int, side: int = INPUT[0], prefix: str = "img") -> list[Item]:
    """``n`` square JPEGs of ``side`` pixels (the samples, centre-cropped and nudged so they differ)."""
    files = sorted(p for p in SAMPLES.iterdir() if p.suffix in (".png", ".jpg")) if SAMPLES.is_dir() else []
    items = []
    for i in range(n):
        if files:
            img = Image.open(files[i % len(files)]).convert("RGB")
            s = min(img.size)
            img = img.crop(((img.width - s) // 2, (img.height - s) // 2, (img.width + s) // 2, (img.height + s) // 2))
            img = img.resize((side, side), Image.BICUBIC).rotate(i * 3)
        else:
            img = Image.effect_noise((side, side), 40 + i).convert("RGB")
        path = folder / f"{prefix}{i:03d}.jpg"
        img.save(path, quality=90)
        items.append(Item(path.name, str(path)))
    return items


class SurveyBench:
    """A folder of 224 px JPEGs and a :class:`Surveyor` over the already loaded model."""

    def __init__(self, lm: LoadedModel, device: str | torch.device = "cpu"):
        self._tmp = tempfile.TemporaryDirectory(prefix="headscope-bench-survey-")
        self.items = write_pictures(Path(self._tmp.name), SURVEY_BATCH)
        self.large = write_pictures(Path(self._tmp.name), SURVEY_BATCH, LARGE_SIDE, "large")
        # The bench's model (no second copy), fp32 like the bare forward it is compared with.
        self.surveyor = Surveyor(
            device=str(device), batch_size=SURVEY_BATCH, settings=Settings(precision="fp32"), lm=lm
        )
        self.x = sample_pixels(lm, SURVEY_BATCH, device)
        L, H = lm.num_layers, lm.num_heads
        self.rows_per_batch = SURVEY_BATCH * L * H

    def variants(self) -> list[Variant]:
        model = self.surveyor.lm.model

        def bare(x):
            with torch.inference_mode():
                return model.forward_features(self.x)

        def survey(x):
            return self.surveyor.process(self.items)

        def survey_large(x):
            return self.surveyor.process(self.large)

        def check(out, batch):
            if out.failures.num_rows or out.rows.num_rows != self.rows_per_batch:
                raise BenchFailure(f"survey batch: {out.rows.num_rows} rows, {out.failures.num_rows} failures")

        return [
            Variant("fwd_fp32", "bare forward fp32 (reference)", bare, None, "model"),
            Variant(
                "survey_local",
                f"survey, local engine, {SURVEY_BATCH} JPEGs -> rows",
                survey,
                check,
                "survey",
                note="read+decode, hooked forward, statistics, Arrow rows",
            ),
            Variant(
                "survey_large",
                f"  the same on {SURVEY_BATCH} {LARGE_SIDE} x {LARGE_SIDE} JPEGs",
                survey_large,
                check,
                "survey",
                note="early reduction (DCT scaling), then as above",
            ),
        ]

    def close(self) -> None:
        self._tmp.cleanup()
