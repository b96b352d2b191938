"""Pictures in, survey rows out: the one computation both engines run.

:class:`Surveyor` holds a loaded model and turns a list of :class:`~app.survey.sources.Item`
into an Arrow table of rows (:data:`~app.survey.schema.ROWS`) and one of failures. The local
engine calls it in its own process; the Ray engine calls it inside each actor. Pictures are
prepared by the server's own path (:class:`app.serving.pictures.Pictures` under the same
``Settings``: early reduction of large pictures, resize, normalisation), batched by input
size, captured with the same forward (:func:`app.engine.forward.forward_capture`) and reduced with the same statistics
(:func:`app.engine.stats.compute_stats`): a survey row holds the values the stats endpoint
gives for that picture.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import pyarrow as pa
import torch

from ..config import Settings
from ..engine.capture import ImageAttention
from ..engine.device import autocast_dtype, is_oom, release_memory, resolve_device
from ..engine.forward import forward_capture
from ..engine.layout import TokenLayout
from ..engine.stats import HeadStats, compute_stats, compute_stats_batch
from ..engine.window_stats import window_head_stats
from ..engine.windows import WindowedAttention
from ..serving import images
from ..serving.pictures import Pictures, read_picture_file
from ..zoo.loaded import LoadedModel
from ..zoo.registry import Registry
from . import schema
from .sources import Item

log = logging.getLogger(__name__)

# What a survey records besides the model id (checked on --resume: rows of one output agree).
MASS = 0.6


@dataclass
class Prepared:
    item: Item
    pixels: torch.Tensor  # 3, H, W
    image_size: tuple[int, int]
    input_size: tuple[int, int]


@dataclass
class Result:
    """A batch's output: rows of the pictures that worked, records of those that did not."""

    rows: pa.Table
    failures: pa.Table

    @property
    def images(self) -> int:
        """Pictures this result accounts for (surveyed or failed)."""
        return len(set(self.rows.column("image").to_pylist())) + self.failures.num_rows


class Surveyor:
    """A model ready to survey pictures.

    Args:
        model: model id (the ``HEADSCOPE_MODEL`` default when None).
        device: ``auto``, ``cpu``, ``cuda``... (``HEADSCOPE_DEVICE`` when None).
        batch_size: most pictures in one forward pass.
        similarity: also compute the head-pair similarity (1 - JS/log 2 over all rows: 15 log
            passes over the maps of a 6-head layer, about 0.15x a forward on a CPU).
        ranks: also compute the ranks of the head outputs per layer (float64 eigenvalues of
            one Gram matrix per layer: about 0.3x a forward on a CPU, little on a GPU).
        settings: decoding limits, resize mode, precision and models folder (from the
            environment when None, as the server reads them).
        lm: an already loaded model to use (then ``model`` is ignored; ``device`` must be
            where it is).
    """

    def __init__(
        self,
        model: str | None = None,
        device: str | None = None,
        batch_size: int = 8,
        similarity: bool = False,
        settings: Settings | None = None,
        ranks: bool = False,
        lm: LoadedModel | None = None,
    ):
        self.settings = settings or Settings()
        if self.settings.threads > 0:
            torch.set_num_threads(self.settings.threads)
        self.device = resolve_device(device or self.settings.device)
        if lm is None:
            lm = Registry([model or self.settings.model], self.settings.models_dir, self.device).get()
        self.lm: LoadedModel = lm
        self.pictures = Pictures.for_model(lm, self.settings)
        self.amp = autocast_dtype(self.device.type, self.settings.precision)
        self.batch_size = max(1, batch_size)
        self.similarity = similarity
        self.ranks = ranks

    @property
    def meta(self) -> dict[str, Any]:
        """What decides the rows' values, written into every part and checked on ``--resume``."""
        s = self.settings
        return {
            "model": self.lm.id,
            "arch": self.lm.arch,
            "resize": s.resize,
            "max_aspect": s.max_aspect,
            "precision": str(self.amp).replace("torch.", "") if self.amp else "fp32",
            "mass": MASS,
            "similarity": self.similarity,
            "ranks": self.ranks,
        }

    # -- reading --------------------------------------------------------------------------
    def prepare(self, item: Item) -> Prepared:
        """Read one picture and prepare it as the server does; raises ImageError (PictureFileError).

        The file is read by :func:`~app.serving.pictures.read_picture_file`: a FIFO or device
        is refused without blocking, a file over the upload limit (``max_upload_bytes``)
        before a byte of it is read.
        """
        data = read_picture_file(item.path, self.settings.max_upload_bytes)
        prep = self.pictures.prepare(data)
        return Prepared(item, prep.pixels, prep.image_size, prep.input_size)

    def prepare_all(self, items: list[Item]) -> tuple[list[Prepared], list[tuple[str, str, str]]]:
        """Every picture that reads, and ``(image, error, message)`` for every one that does not."""
        ok: list[Prepared] = []
        failed: list[tuple[str, str, str]] = []
        for it in items:
            try:
                ok.append(self.prepare(it))
            except images.ImageError as e:  # PictureFileError included: missing, FIFO, too large...
                failed.append((it.image, e.code, str(e)))
            except OSError as e:  # the decoder's own reads
                failed.append((it.image, "read_error", f"{type(e).__name__}: {e.strerror or e}"))
        return ok, failed

    # -- computing ------------------------------------------------------------------------
    def process(self, items: list[Item]) -> Result:
        """Survey ``items``: read them, run them in batches of one input size, compute the rows."""
        ok, failed = self.prepare_all(items)
        return self.compute(ok, failed)

    def compute(self, ok: list[Prepared], failed: list[tuple[str, str, str]] | None = None) -> Result:
        """The rows of pictures already prepared (see :meth:`prepare_all`)."""
        failed = list(failed or [])
        groups: dict[tuple[int, ...], list[Prepared]] = {}
        for p in ok:
            groups.setdefault(tuple(p.pixels.shape), []).append(p)
        tables: list[pa.Table] = []
        for group in groups.values():
            for i in range(0, len(group), self.batch_size):
                self._run(group[i : i + self.batch_size], tables, failed)
        rows = pa.concat_tables(tables) if tables else schema.empty_rows()
        return Result(rows, schema.failures_table(failed))

    def _run(self, batch: list[Prepared], tables: list[pa.Table], failed: list[tuple[str, str, str]]) -> None:
        """One forward for ``batch``; on out-of-memory split it, on an error isolate the culprit."""
        try:
            x = torch.stack([p.pixels for p in batch]).to(self.device)  # B, 3, H, W
            # Every row of every map is needed: keep the unfused forward's maps where that pays
            # (as the server does for query=all) instead of recomputing them from q and k.
            layout = self.lm.layout(batch[0].input_size)
            materialise = isinstance(layout, TokenLayout) and self.lm.capture.materialise_pays(layout.count)
            with self.lm.lock:
                atts = forward_capture(self.lm, x, materialise=materialise, amp_dtype=self.amp)
            if isinstance(layout, TokenLayout) and all(isinstance(a, ImageAttention) for a in atts):
                # The batch's maps together, as the forward left them (see compute_stats_batch).
                stats = compute_stats_batch(
                    cast(list[ImageAttention], atts), layout, MASS, similarity=self.similarity, with_ranks=self.ranks
                )
                done = [self._rows(p, att, st) for p, att, st in zip(batch, atts, stats)]
            else:
                done = [self._rows(p, att) for p, att in zip(batch, atts)]
            # All or nothing: on an error below, every picture of the batch is run again alone.
            tables.extend(done)
        except Exception as e:
            if len(batch) > 1:
                if is_oom(e):
                    release_memory(self.device)
                    half = len(batch) // 2
                    self._run(batch[:half], tables, failed)
                    self._run(batch[half:], tables, failed)
                else:
                    for p in batch:
                        self._run([p], tables, failed)
                return
            code = "out_of_memory" if is_oom(e) else "compute_error"
            if code == "out_of_memory":
                release_memory(self.device)
            log.warning("%s: %s: %s", batch[0].item.image, type(e).__name__, e)
            failed.append((batch[0].item.image, code, f"{type(e).__name__}: {str(e)[:300]}"))

    def _rows(self, p: Prepared, att: ImageAttention | WindowedAttention, st: HeadStats | None = None) -> pa.Table:
        """The ``L * H`` rows of one picture (``st``: its statistics, if already computed)."""
        if isinstance(att, WindowedAttention):
            return self._window_rows(p, att)
        layout = self.lm.layout(p.input_size)
        assert isinstance(layout, TokenLayout)
        if st is None:
            st = compute_stats(att, layout, MASS, similarity=self.similarity, with_ranks=self.ranks)
        L, H = att.num_layers, att.num_heads
        n = L * H

        def flat(t: torch.Tensor | None, dtype) -> pa.Array:
            if t is None:
                return pa.nulls(n, dtype)
            return pa.array(t.reshape(n).numpy(), dtype)

        def per_layer(t: torch.Tensor | None, dtype) -> pa.Array:
            if t is None:
                return pa.nulls(n, dtype)
            return pa.array(np.repeat(t.numpy(), H), dtype)

        def lists(t: torch.Tensor | None) -> pa.Array:
            if t is None:
                return pa.nulls(n, pa.list_(pa.float32()))
            offsets = pa.array(np.arange(0, n * H + 1, H, dtype=np.int32))
            return pa.ListArray.from_arrays(offsets, pa.array(t.reshape(-1).numpy(), pa.float32()))

        def const(v, dtype) -> pa.Array:
            return pa.array(np.full(n, v), dtype)

        cols = {
            "image": pa.array([p.item.image] * n, pa.string()),
            "layer": pa.array(np.repeat(np.arange(L), H), pa.int16()),
            "head": pa.array(np.tile(np.arange(H), L), pa.int16()),
            "entropy": flat(st.entropy, pa.float32()),
            "entropy_cls": flat(st.entropy_cls, pa.float32()),
            "distance_px": flat(st.distance_px, pa.float32()),
            "prefix_mass": flat(st.prefix_mass, pa.float32()),
            "artifact_mass": flat(st.artifact_mass, pa.float32()),
            "mass_patches": flat(st.mass_patches, pa.int32()),
            "cls_cosine": lists(st.cls_cosine),
            "similarity": lists(st.similarity),
            "rank_numerical": per_layer(st.rank_numerical, pa.int32()),
            "rank_effective": per_layer(st.rank_effective, pa.float64()),
            "image_height": const(p.image_size[0], pa.int32()),
            "image_width": const(p.image_size[1], pa.int32()),
            "input_height": const(p.input_size[0], pa.int32()),
            "input_width": const(p.input_size[1], pa.int32()),
            "grid_rows": const(layout.grid[0], pa.int16()),
            "grid_cols": const(layout.grid[1], pa.int16()),
            "tokens": const(layout.count, pa.int32()),
            "prefix_tokens": const(layout.num_prefix, pa.int16()),
            "artifact_tokens": const(len(st.artifacts), pa.int32()),
            "artifact_threshold": const(st.artifact_threshold, pa.float32()),
            "stage": pa.nulls(n, pa.int16()),
        }
        return pa.table(list(cols.values()), schema=schema.ROWS)

    def _window_rows(self, p: Prepared, att: WindowedAttention) -> pa.Table:
        """The rows of one picture under a windowed model (Swin): ``sum_l H_l`` rows.

        The values are :func:`~app.engine.window_stats.window_head_stats`'s, which the stats
        endpoint answers for Swin: entropy over each query's window, distance between the cells
        of the layer's stage grid; the columns that mean nothing for windows (no prefix, no CLS,
        artifact tokens only on the last stage's grid) are null. ``grid_rows``, ``grid_cols``
        and ``tokens`` are those of the row's stage, named in ``stage``.
        """
        st = window_head_stats(att, p.input_size, MASS)
        heads = st["heads_per_layer"]
        layers = np.repeat(np.arange(len(heads)), heads)
        n = len(layers)
        stages = [att.stage_of(int(layer)) for layer in layers]

        def flat(v: list[list[float]]) -> pa.Array:
            return pa.array(np.concatenate([np.asarray(x, np.float32) for x in v]), pa.float32())

        def per_layer(v: list, dtype) -> pa.Array:
            return pa.array(np.repeat(np.asarray(v), heads), dtype)

        def const(v, dtype) -> pa.Array:
            return pa.array(np.full(n, v), dtype)

        similarity = (
            pa.array([row for layer in st["similarity"] for row in layer], pa.list_(pa.float32()))
            if self.similarity
            else pa.nulls(n, pa.list_(pa.float32()))
        )
        rank = st["rank"]
        cols = {
            "image": pa.array([p.item.image] * n, pa.string()),
            "layer": pa.array(layers, pa.int16()),
            "head": pa.array(np.concatenate([np.arange(h) for h in heads]), pa.int16()),
            "entropy": flat(st["entropy"]),
            "entropy_cls": pa.nulls(n, pa.float32()),
            "distance_px": flat(st["distance_px"]),
            "prefix_mass": pa.nulls(n, pa.float32()),
            "artifact_mass": pa.nulls(n, pa.float32()),
            "mass_patches": pa.nulls(n, pa.int32()),
            "cls_cosine": pa.nulls(n, pa.list_(pa.float32())),
            "similarity": similarity,
            "rank_numerical": per_layer(rank["numerical"], pa.int32()) if self.ranks else pa.nulls(n, pa.int32()),
            "rank_effective": per_layer(rank["effective"], pa.float64()) if self.ranks else pa.nulls(n, pa.float64()),
            "image_height": const(p.image_size[0], pa.int32()),
            "image_width": const(p.image_size[1], pa.int32()),
            "input_height": const(p.input_size[0], pa.int32()),
            "input_width": const(p.input_size[1], pa.int32()),
            "grid_rows": pa.array([s.grid[0] for s in stages], pa.int16()),
            "grid_cols": pa.array([s.grid[1] for s in stages], pa.int16()),
            "tokens": pa.array([s.grid[0] * s.grid[1] for s in stages], pa.int32()),
            "prefix_tokens": const(0, pa.int16()),
            "artifact_tokens": const(len(st["artifacts"]["tokens"]), pa.int32()),
            "artifact_threshold": const(st["artifacts"]["threshold"], pa.float32()),
            "stage": pa.array([s.index for s in stages], pa.int16()),
        }
        return pa.table(list(cols.values()), schema=schema.ROWS)
