"""Pictures in, survey rows out: the one computation both engines run.

:class:`Surveyor` holds a loaded model and turns a list of :class:`~app.survey.sources.Item`
into an Arrow table of rows (:data:`~app.survey.schema.ROWS`) and one of failures. The local
engine calls it in its own process; the Ray engine calls it inside each actor. Pictures are
prepared by the server's own path (:class:`app.serving.pictures.Pictures` under the same
``Settings``: early reduction of large pictures, resize, normalisation), batched by input
size, captured with the same forward (:func:`app.engine.forward.forward_capture`) and reduced
with the same statistics (:meth:`app.engine.captured_image.CapturedImage.stats`): a survey row holds
the values the stats endpoint gives for that picture.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from ..config import Settings
from ..engine.batching import BatchRunner, OutOfMemory
from ..engine.captured_image import CapturedImage, stats_batch
from ..engine.device import autocast_dtype, exact_fp32, is_oom, resolve_device
from ..engine.model import LoadedModel
from ..engine.stats import DEFAULT_MASS, HeadStats
from ..serving import preprocess
from ..serving.pictures import Pictures, read_picture_file
from ..zoo.registry import Registry
from . import schema
from .faithfulness import FaithfulnessPlan
from .sources import Item

log = logging.getLogger(__name__)


@dataclass
class PreparedItem:
    item: Item
    raw: torch.Tensor  # 3, H, W uint8 (normalised on the device by the batch runner)
    image_size: tuple[int, int]
    input_size: tuple[int, int]


@dataclass
class Result:
    """A batch's output: rows of the pictures that worked, records of those that did not, and
    (``--faithfulness``) the perturbation test's rows."""

    rows: pa.Table
    failures: pa.Table
    faithfulness: pa.Table = field(default_factory=schema.empty_faithfulness)

    @property
    def images(self) -> int:
        """Pictures this result accounts for (surveyed or failed; a picture whose survey rows
        are there but whose test failed counts once)."""
        return len(set(self.rows.column("image").to_pylist()) | set(self.failures.column("image").to_pylist()))


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
        faithfulness: also run the perturbation test of these relevance maps (a second table);
            its target is checked against the model here (TargetError, RelevanceUnsupportedError).
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
        faithfulness: FaithfulnessPlan | None = None,
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
        self.runner = BatchRunner(lm, self.amp, self.batch_size)
        self.similarity = similarity
        self.ranks = ranks
        self.faithfulness = faithfulness
        # Called with the share of a picture each batch of perturbed forwards did (the command
        # line's progress bar moves with them, not only when a picture's test is done).
        self.on_progress: Callable[[float], None] | None = None
        if faithfulness is not None:
            faithfulness.resolve(lm)  # the target's kind, before a picture is read

    @property
    def meta(self) -> dict[str, Any]:
        """What decides the rows' values, written into every part and checked on ``--resume``."""
        s = self.settings
        meta = {
            "model": self.lm.id,
            "arch": self.lm.arch,
            "resize": s.resize,
            "max_aspect": s.max_aspect,
            "precision": self.runner.precision,
            "mass": DEFAULT_MASS,
            "similarity": self.similarity,
            "ranks": self.ranks,
        }
        if self.faithfulness is not None:
            meta["faithfulness"] = self.faithfulness.meta()
        return meta

    # -- reading --------------------------------------------------------------------------
    def prepare(self, item: Item) -> PreparedItem:
        """Read one picture and prepare it as the server does; raises ImageError (PictureFileError).

        The file is read by :func:`~app.serving.pictures.read_picture_file`: a FIFO or device
        is refused without blocking, a file over the upload limit (``max_upload_bytes``)
        before a byte of it is read.
        """
        data = read_picture_file(item.path, self.settings.max_upload_bytes)
        prep = self.pictures.prepare(data)
        return PreparedItem(item, prep.raw, prep.image_size, prep.input_size)

    def prepare_all(self, items: list[Item]) -> tuple[list[PreparedItem], list[tuple[str, str, str]]]:
        """Every picture that reads, and ``(image, error, message)`` for every one that does not.

        The pictures are read and prepared in parallel (a thread pool the size of the machine's
        cores: Pillow releases the GIL while it decodes and resizes), in order.
        """

        def one(it: Item) -> PreparedItem | tuple[str, str, str]:
            try:
                return self.prepare(it)
            except preprocess.ImageError as e:  # PictureFileError included: missing, FIFO, too large...
                return (it.image, e.code, str(e))
            except OSError as e:  # the decoder's own reads
                return (it.image, "read_error", f"{type(e).__name__}: {e.strerror or e}")

        if len(items) > 1:
            with ThreadPoolExecutor(min(len(items), _cores()), thread_name_prefix="survey-prepare") as pool:
                done = list(pool.map(one, items))
        else:
            done = [one(it) for it in items]
        ok = [d for d in done if isinstance(d, PreparedItem)]
        failed = [d for d in done if not isinstance(d, PreparedItem)]
        return ok, failed

    # -- computing ------------------------------------------------------------------------
    def process(self, items: list[Item]) -> Result:
        """Survey ``items``: read them, run them in batches of one input size, compute the rows."""
        ok, failed = self.prepare_all(items)
        return self.compute(ok, failed)

    def compute(self, ok: list[PreparedItem], failed: list[tuple[str, str, str]] | None = None) -> Result:
        """The rows of pictures already prepared (see :meth:`prepare_all`)."""
        failed = list(failed or [])
        tables: list[pa.Table] = []
        tests: list[pa.Table] = []
        with exact_fp32():  # fp32 means fp32: the forward, the statistics, the perturbation test
            for idx in self.runner.groups([tuple(prep.raw.shape) for prep in ok]):
                self._run([ok[i] for i in idx], tables, failed, tests)
        rows = pa.concat_tables(tables) if tables else schema.empty_rows()
        faith = pa.concat_tables(tests) if tests else schema.empty_faithfulness()
        return Result(rows, schema.failures_table(failed), faith)

    def _run(
        self,
        batch: list[PreparedItem],
        tables: list[pa.Table],
        failed: list[tuple[str, str, str]],
        tests: list[pa.Table] | None = None,
    ) -> None:
        """``batch`` through the batch runner's out-of-memory split (:meth:`BatchRunner.run`:
        split in halves on out-of-memory, the culprit isolated on another error); a picture that
        fails alone becomes a failure record."""
        tests = [] if tests is None else tests
        results = self.runner.run(self._batch, batch)
        for prep, res in zip(batch, results):
            if isinstance(res, BaseException):
                e = res.__cause__ if isinstance(res, OutOfMemory) and res.__cause__ is not None else res
                code = "out_of_memory" if isinstance(res, OutOfMemory) or is_oom(res) else "compute_error"
                log.warning("%s: %s: %s", prep.item.image, type(e).__name__, e)
                failed.append((prep.item.image, code, f"{type(e).__name__}: {str(e)[:300]}"))
                continue
            rows, test, refused = res
            tables.append(rows)
            if test is not None:
                tests.append(test)
            failed.extend(refused)

    def _batch(self, batch: list[PreparedItem]) -> list[tuple[pa.Table, pa.Table | None, list]]:
        """One forward for ``batch`` (and its perturbation tests): each picture's rows; the
        batch's test table and the pictures it refused go with its first picture. All or
        nothing: an error raises, and the runner runs the batch again, split or alone."""
        x = self.runner.inputs([prep.raw for prep in batch])  # B, 3, H, W normalised, on the device
        input_size = batch[0].input_size
        # Every row of every map is needed: keep the unfused forward's maps where that pays
        # (as the server does for query=all) instead of recomputing them from q and k.
        with self.lm.lock:
            atts = self.runner.capture(x, materialise=self.lm.keeps_maps(input_size))
        captured = [self.lm.captured(att, input_size) for att in atts]
        # The batch's maps together, as the forward left them, where they are one batch tensor.
        stats = stats_batch(captured, DEFAULT_MASS, similarity=self.similarity, ranks=self.ranks)
        done = [self._rows(prep, image, st) for prep, image, st in zip(batch, captured, stats)]
        del atts, captured, stats
        test: pa.Table | None = None
        refused: list[tuple[str, str, str]] = []
        if self.faithfulness is not None:
            names = [schema.utf8_text(prep.item.image) for prep in batch]
            test, refused = self.faithfulness.table(
                self.lm, names, x, self.amp, self.batch_size, progress=self.on_progress
            )
        return [(rows, test, refused) if i == 0 else (rows, None, []) for i, rows in enumerate(done)]

    def _rows(self, prep: PreparedItem, image: CapturedImage, st: HeadStats) -> pa.Table:
        return self.head_rows(prep.item.image, prep.image_size, prep.input_size, image, st, self.runner.precision)

    @staticmethod
    def head_rows(
        name: str,
        image_size: tuple[int, int],
        input_size: tuple[int, int],
        image: CapturedImage,
        st: HeadStats,
        precision: str = "fp32",
    ) -> pa.Table:
        """The rows of one picture: one per layer and head, ``sum_l H_l`` (each layer of a windowed
        model has its stage's heads). ``name`` goes into the ``image`` column (as
        :func:`~.schema.utf8_text` writes it: a file name's bytes that are not UTF-8 as
        ``\\xNN``); ``image_size`` and ``input_size`` are the picture's and the model input's
        (height, width). The Python API's
        ``Attention.stats()`` builds its DataFrame here too.

        The values are those of ``GET …/stats`` for the picture (:class:`HeadStats`); what the
        statistics leave out (not asked for, or meaningless for the model: no prefix, no CLS, no
        artifact mass for windows) is null. ``grid_rows``, ``grid_cols``, ``tokens`` and
        ``prefix_tokens`` are those of the row's layer (a windowed model's stage, named in
        ``stage``; null for global attention).
        """
        heads = np.asarray(st.heads_per_layer)
        L, H = len(heads), int(st.entropy.shape[1])
        keep = np.arange(H)[None, :] < heads[:, None]  # L, H: each layer's heads
        n = int(keep.sum())
        layouts = [image.layout_at(layer) for layer in range(L)]
        stages = [image.stage_at(layer) for layer in range(L)]

        def per_head(t: torch.Tensor | None, dtype) -> pa.Array:
            return pa.nulls(n, dtype) if t is None else pa.array(t.numpy()[keep], dtype)

        def pairs(t: torch.Tensor | None) -> pa.Array:  # [L, H, H]: each row's list over its layer's heads
            if t is None:
                return pa.nulls(n, pa.list_(pa.float32()))
            offsets = np.concatenate([[0], np.cumsum(np.repeat(heads, heads))]).astype(np.int32)
            values = t.numpy()[keep[:, :, None] & keep[:, None, :]]
            return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, pa.float32()))

        def per_layer(values, dtype) -> pa.Array:
            if values is None:
                return pa.nulls(n, dtype)
            return pa.array([v for v, h in zip(list(values), heads) for _ in range(h)], dtype)

        def const(v, dtype) -> pa.Array:
            return pa.array(np.full(n, v), dtype)

        cols = {
            "image": pa.array([schema.utf8_text(name)] * n, pa.string()),
            "layer": pa.array(np.repeat(np.arange(L), heads), pa.int16()),
            "head": pa.array(np.concatenate([np.arange(h) for h in heads]), pa.int16()),
            "entropy": per_head(st.entropy, pa.float32()),
            "entropy_cls": per_head(st.entropy_cls, pa.float32()),
            "distance_px": per_head(st.distance_px, pa.float32()),
            "prefix_mass": per_head(st.prefix_mass, pa.float32()),
            "artifact_mass": per_head(st.artifact_mass, pa.float32()),
            "mass_patches": per_head(st.mass_patches, pa.int32()),
            "cls_cosine": pairs(st.cls_cosine),
            "similarity": pairs(st.similarity),
            "rank_numerical": per_layer(_listed(st.rank_numerical), pa.int32()),
            "rank_effective": per_layer(_listed(st.rank_effective), pa.float64()),
            "image_height": const(image_size[0], pa.int32()),
            "image_width": const(image_size[1], pa.int32()),
            "input_height": const(input_size[0], pa.int32()),
            "input_width": const(input_size[1], pa.int32()),
            "grid_rows": per_layer([lo.grid[0] for lo in layouts], pa.int16()),
            "grid_cols": per_layer([lo.grid[1] for lo in layouts], pa.int16()),
            "tokens": per_layer([lo.count for lo in layouts], pa.int32()),
            "prefix_tokens": per_layer([lo.num_prefix for lo in layouts], pa.int16()),
            "artifact_tokens": const(len(st.artifacts), pa.int32()),
            "artifact_threshold": const(st.artifact_threshold, pa.float32()),
            "stage": per_layer([s.index if s is not None else None for s in stages], pa.int16()),
            "precision": pa.array([precision] * n, pa.string()),
        }
        return pa.table(list(cols.values()), schema=schema.ROWS)


def _cores() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))


def _listed(t: torch.Tensor | None) -> list | None:
    return None if t is None else t.tolist()
