"""Where a survey's rows go: a Parquet dataset folder, written in parts, each one atomically.

Layout of ``--out survey.parquet``::

    survey.parquet/                      read it whole: pandas.read_parquet("survey.parquet"),
      part-<run>-00000.parquet           pyarrow.dataset, DuckDB 'survey.parquet/*.parquet', Polars
      part-<run>-00001.parquet
      _failures/part-<run>-00000.parquet pictures that could not be read (image, error, message)

Readers skip names that start with ``_`` or ``.``, so the failures never mix with the rows.
Rows are buffered and written as a part every ``part_images`` pictures or ``part_seconds``
seconds: first to a hidden temporary file, then fsync'ed and renamed into place, so a part is
either whole or absent. Ctrl-C and SIGTERM write the buffer before leaving; a killed process
loses at most the buffer (``--resume`` computes those pictures again). Rows of one picture
always sit in one part.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from . import schema

FAILURES_DIR = "_failures"


class OutputError(ValueError):
    """The output folder cannot be used (exists without --resume, other model, not a survey)."""


def parts(folder: Path) -> list[Path]:
    """The finished part files of a dataset folder (no temporaries), sorted."""
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.glob("*.parquet") if not p.name.startswith((".", "_")))


def read_table(out: Path | str, columns: list[str] | None = None) -> pa.Table:
    """All rows of a survey (its parts, concatenated), or only ``columns``."""
    out = Path(out)
    files = parts(out) if out.is_dir() else [out]
    if not files:
        return schema.ROWS.empty_table() if columns is None else schema.ROWS.empty_table().select(columns)
    return pa.concat_tables(pq.read_table(f, columns=columns) for f in files)


def read_failures(out: Path | str) -> pa.Table:
    files = parts(Path(out) / FAILURES_DIR)
    if not files:
        return schema.empty_failures()
    return pa.concat_tables(pq.read_table(f) for f in files)


def survey_meta(out: Path | str) -> dict[str, Any]:
    """The metadata of the first part (model and settings of the run that wrote it)."""
    files = parts(Path(out)) or parts(Path(out) / FAILURES_DIR)
    return schema.meta_of(pq.read_schema(files[0])) if files else {}


def check_target(out: Path | str, resume: bool) -> None:
    """Refuse early (before a model loads) an ``--out`` that cannot be written."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise OutputError(f"{out} exists and is not a survey folder (a Parquet dataset folder)")
    existing = parts(out) + parts(out / FAILURES_DIR)
    if existing and not resume:
        raise OutputError(
            f"{out} already holds a survey ({len(existing)} part(s)); pass --resume to continue it, "
            f"or choose another --out"
        )


class SurveyOutput:
    """The output folder of one run: what is there already, and the parts this run adds.

    Args:
        out: the dataset folder (created).
        meta: the run's model and settings (written into every part; checked against the
            parts already there on ``resume``).
        resume: keep going in a folder that has parts; without it such a folder is refused.
        part_images: write a part once this many pictures are buffered...
        part_seconds: ...or once the oldest buffered picture waited this long.
    """

    def __init__(
        self,
        out: Path | str,
        meta: dict[str, Any],
        resume: bool = False,
        part_images: int = 256,
        part_seconds: float = 30.0,
    ):
        self.out = Path(out)
        self.meta = meta
        self.part_images = part_images
        self.part_seconds = part_seconds
        check_target(self.out, resume)
        if parts(self.out) + parts(self.out / FAILURES_DIR):
            theirs = survey_meta(self.out)
            diff = {k: (theirs.get(k), v) for k, v in meta.items() if theirs.get(k) != v}
            if diff:
                detail = ", ".join(f"{k}: {a!r} there, {b!r} now" for k, (a, b) in diff.items())
                raise OutputError(f"{self.out} was surveyed with other settings ({detail}); use another --out")
        (self.out / FAILURES_DIR).mkdir(parents=True, exist_ok=True)
        for stale in list(self.out.glob(".*.tmp")) + list((self.out / FAILURES_DIR).glob(".*.tmp")):
            stale.unlink()  # a part that a killed run never finished
        self.run = time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:6]
        self._seq = 0
        self._rows: list[pa.Table] = []
        self._failures: list[pa.Table] = []
        self._buffered = 0
        self._since = 0.0
        self.images_written = 0
        self.failures_written = 0
        self.rows_written = 0

    def done(self) -> set[str]:
        """Pictures already in the output (surveyed or recorded as failures)."""
        seen: set[str] = set()
        for f in parts(self.out):
            seen.update(pq.read_table(f, columns=["image"]).column("image").unique().to_pylist())
        for f in parts(self.out / FAILURES_DIR):
            seen.update(pq.read_table(f, columns=["image"]).column("image").to_pylist())
        return seen

    def add(self, rows: pa.Table, failures: pa.Table, images: int) -> None:
        """Buffer one batch's output; write a part when the buffer is due.

        Args:
            rows: :data:`schema.ROWS` rows.
            failures: :data:`schema.FAILURES` records.
            images: pictures the batch accounts for (surveyed + failed).
        """
        if not self._buffered:
            self._since = time.monotonic()
        if rows.num_rows:
            self._rows.append(rows)
        if failures.num_rows:
            self._failures.append(failures)
        self._buffered += images
        if self._buffered >= self.part_images or time.monotonic() - self._since >= self.part_seconds:
            self.flush()

    def flush(self) -> None:
        """Write what is buffered as one part (rows and failures), atomically."""
        if not self._buffered:
            return
        name = f"part-{self.run}-{self._seq:05d}.parquet"
        if self._rows:
            rows = pa.concat_tables(self._rows)
            self._write(rows.cast(schema.with_meta(schema.ROWS, self.meta)), self.out / name)
            self.rows_written += rows.num_rows
            self.images_written += len(rows.column("image").unique())
        if self._failures:
            fails = pa.concat_tables(self._failures)
            self._write(fails.cast(schema.with_meta(schema.FAILURES, self.meta)), self.out / FAILURES_DIR / name)
            self.failures_written += fails.num_rows
        self._seq += 1
        self._rows, self._failures, self._buffered = [], [], 0

    @staticmethod
    def _write(table: pa.Table, path: Path) -> None:
        tmp = path.with_name(f".{path.name}.tmp")
        pq.write_table(table, tmp, compression="zstd")
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)

    def close(self) -> None:
        self.flush()
