"""Where a survey's rows go: a Parquet dataset folder, written in parts, each one atomically.

Layout of ``--out survey.parquet``::

    survey.parquet/                      read it whole: pandas.read_parquet("survey.parquet"),
      part-<run>-00000.parquet           pyarrow.dataset, DuckDB 'survey.parquet/*.parquet', Polars
      part-<run>-00001.parquet
      _failures/part-<run>-00000.parquet pictures that could not be read or computed, and refused
                                         tests (image, error, message)

Readers skip names that start with ``_`` or ``.``, so the failures never mix with the rows.
With ``--faithfulness`` the perturbation test's rows go to a second dataset folder beside it,
``survey.faithfulness.parquet`` (:func:`faithfulness_path`), written in parts the same way and
at the same moments (its part first, then the survey's).
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
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..outputs import check_writable
from . import schema

FAILURES_DIR = "_failures"


class OutputError(ValueError):
    """The output folder cannot be used (exists without --resume, other model, not a survey)."""


def faithfulness_path(out: Path | str) -> Path:
    """Where ``--faithfulness`` writes beside the survey ``out``: ``survey.parquet`` ->
    ``survey.faithfulness.parquet`` (``out`` -> ``out.faithfulness.parquet``)."""
    out = Path(out)
    stem = out.name.removesuffix(".parquet") if out.name != ".parquet" else out.name
    return out.with_name(f"{stem}.faithfulness.parquet")


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


def read_faithfulness(out: Path | str) -> pa.Table:
    """The perturbation test's rows of the survey ``out`` (empty when it was run without
    ``--faithfulness``); ``out`` may also name the faithfulness folder itself."""
    out = Path(out)
    folder = out if out.name.endswith(".faithfulness.parquet") else faithfulness_path(out)
    files = parts(folder) if folder.is_dir() else ([folder] if folder.is_file() else [])
    if not files:
        return schema.empty_faithfulness()
    return pa.concat_tables(pq.read_table(f) for f in files)


def read_failures(out: Path | str) -> pa.Table:
    files = parts(Path(out) / FAILURES_DIR)
    if not files:
        return schema.empty_failures()
    return pa.concat_tables(pq.read_table(f) for f in files)


def survey_meta(out: Path | str) -> dict[str, Any]:
    """The metadata of the first part (model and settings of the run that wrote it); of ``out``
    itself when it is one part file."""
    out = Path(out)
    files = [out] if out.is_file() else parts(out) or parts(out / FAILURES_DIR)
    return schema.meta_of(pq.read_schema(files[0])) if files else {}


def check_target(out: Path | str, resume: bool, faithfulness: bool = False) -> None:
    """Refuse early (before a model loads) an ``--out`` that cannot be written (and, with
    ``faithfulness``, the folder beside it)."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise OutputError(f"{out} exists and is not a survey folder (a Parquet dataset folder)")
    _refuse_others(out, "a survey's parts")
    _check_writable(out)
    existing = parts(out) + parts(out / FAILURES_DIR)
    if existing and not resume:
        raise OutputError(
            f"{out} already holds a survey ({len(existing)} part(s)); pass --resume to continue it, "
            f"or choose another --out"
        )
    if faithfulness:
        beside = faithfulness_path(out)
        if beside.exists() and not beside.is_dir():
            raise OutputError(f"{beside} exists and is not a folder of the survey's faithfulness table")
        if parts(beside) and not resume:
            raise OutputError(f"{beside} already holds a faithfulness table; pass --resume, or choose another --out")
        _refuse_others(beside, "a faithfulness table's parts")
        _check_writable(beside)


def _refuse_others(folder: Path, what: str) -> None:
    """A folder holding anything but Parquet parts (and hidden or ``_`` entries) is someone
    else's, perhaps the pictures' own (``survey photos --out photos``): not written into."""
    if not folder.is_dir():
        return
    other = next((p for p in folder.iterdir() if not p.name.startswith((".", "_")) and p.suffix != ".parquet"), None)
    if other is not None:
        raise OutputError(f"{folder} holds files that are not {what} ({other.name!r}...); choose a new or empty --out")


def _flat(meta: dict[str, Any]) -> dict[str, Any]:
    """``{"faithfulness": {"methods": [...]}}`` -> ``{"faithfulness.methods": [...]}`` (one level)."""
    out: dict[str, Any] = {}
    for k, v in meta.items():
        if isinstance(v, dict):
            out.update({f"{k}.{k2}": v2 for k2, v2 in v.items()})
        else:
            out[k] = v
    return out


def _said(key: str, value: Any) -> str:
    """A setting's value as the command line spells it (the faithfulness target's default, None in
    the table's metadata, is ``region``)."""
    if key == "faithfulness.target" and value is None:
        return "'region'"
    return repr(value)


def _check_writable(folder: Path) -> None:
    try:
        check_writable(folder, folder=True)
    except ValueError as e:
        raise OutputError(str(e)) from None


class SurveyOutput:
    """The output folder of one run: what is there already, and the parts this run adds.

    Args:
        out: the dataset folder (created).
        meta: the run's model and settings (written into every part; checked against the
            parts already there on ``resume``).
        resume: keep going in a folder that has parts; without it such a folder is refused.
        part_images: write a part once this many pictures are buffered...
        part_seconds: ...or once the oldest buffered picture waited this long.
        faithfulness: also write the perturbation test's rows, beside ``out``
            (:func:`faithfulness_path`).
    """

    def __init__(
        self,
        out: Path | str,
        meta: dict[str, Any],
        resume: bool = False,
        part_images: int = 256,
        part_seconds: float = 30.0,
        faithfulness: bool = False,
    ):
        self.out = Path(out)
        self.meta = meta
        self.part_images = part_images
        self.part_seconds = part_seconds
        self.faith_out = faithfulness_path(self.out) if faithfulness else None
        check_target(self.out, resume, faithfulness)
        theirs = None
        if parts(self.out) + parts(self.out / FAILURES_DIR):
            theirs = survey_meta(self.out)
        elif self.faith_out is not None and parts(self.faith_out):
            theirs = schema.meta_of(pq.read_schema(parts(self.faith_out)[0]))
        if theirs is not None:
            # nested settings (the faithfulness test's) compared and named one by one
            mine, there = _flat(meta), _flat(theirs)
            methods = "faithfulness.methods"
            listed = isinstance(mine.get(methods), list) and isinstance(there.get(methods), list)
            if listed and sorted(mine[methods]) == sorted(there[methods]):  # the same test in another order
                meta["faithfulness"]["methods"] = mine[methods] = list(there[methods])
            keys = set(mine) | {k for k in there if k.split(".")[0] in meta or k.startswith("faithfulness")}
            diff = {k: (there.get(k), mine.get(k)) for k in sorted(keys) if there.get(k) != mine.get(k)}
            if diff:
                detail = ", ".join(f"{k}: {_said(k, a)} there, {_said(k, b)} now" for k, (a, b) in diff.items())
                raise OutputError(f"{self.out} was surveyed with other settings ({detail}); use another --out")
        (self.out / FAILURES_DIR).mkdir(parents=True, exist_ok=True)
        if self.faith_out is not None:
            self.faith_out.mkdir(parents=True, exist_ok=True)
        stale = list(self.out.glob(".*.tmp")) + list((self.out / FAILURES_DIR).glob(".*.tmp"))
        if self.faith_out is not None:
            stale += list(self.faith_out.glob(".*.tmp"))
        for path in stale:
            path.unlink()  # a part that a killed run never finished
        self.run = time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:6]
        self._seq = 0
        self._rows: list[pa.Table] = []
        self._failures: list[pa.Table] = []
        self._tests: list[pa.Table] = []
        self._buffered = 0
        self._since = 0.0
        self.images_written = 0
        self.failures_written = 0
        self.rows_written = 0
        self.tests_written = 0
        # Pictures already in each table: a run killed between the two tables' parts of one flush
        # leaves a picture in one of them; it is done again, and written only where it is missing.
        self._present = _images(self.out)
        self._present_tests = _images(self.faith_out) if self.faith_out is not None else set()

    def done(self) -> set[str]:
        """Pictures already in the output (surveyed, and tested with ``faithfulness``; or
        recorded as failures)."""
        seen = set(self._present)
        if self.faith_out is not None:
            seen &= self._present_tests
        for f in parts(self.out / FAILURES_DIR):
            seen.update(pq.read_table(f, columns=["image"]).column("image").to_pylist())
        return seen

    def add(self, rows: pa.Table, failures: pa.Table, images: int, tests: pa.Table | None = None) -> None:
        """Buffer one batch's output; write a part when the buffer is due.

        Args:
            rows: :data:`schema.ROWS` rows.
            failures: :data:`schema.FAILURES` records.
            images: pictures the batch accounts for (surveyed + failed).
            tests: :data:`schema.FAITHFULNESS` rows (with ``faithfulness``).
        """
        if not self._buffered:
            self._since = time.monotonic()
        if rows.num_rows:
            self._rows.append(_without(rows, self._present))
        if failures.num_rows:
            self._failures.append(failures)
        if tests is not None and tests.num_rows and self.faith_out is not None:
            self._tests.append(_without(tests, self._present_tests))
        self._buffered += images
        if self._buffered >= self.part_images or time.monotonic() - self._since >= self.part_seconds:
            self.flush()

    def flush(self) -> None:
        """Write what is buffered as one part (rows and failures; the test's rows first), each
        file atomically."""
        if not self._buffered:
            return
        name = f"part-{self.run}-{self._seq:05d}.parquet"
        if self._tests and self.faith_out is not None:
            tests = pa.concat_tables(self._tests)
            if tests.num_rows:
                self._write(tests.cast(schema.with_meta(schema.FAITHFULNESS, self.meta)), self.faith_out / name)
                self.tests_written += tests.num_rows
        rows = pa.concat_tables(self._rows) if self._rows else None
        if rows is not None and rows.num_rows:
            self._write(rows.cast(schema.with_meta(schema.ROWS, self.meta)), self.out / name)
            self.rows_written += rows.num_rows
            self.images_written += len(rows.column("image").unique())
        if self._failures:
            fails = pa.concat_tables(self._failures)
            self._write(fails.cast(schema.with_meta(schema.FAILURES, self.meta)), self.out / FAILURES_DIR / name)
            self.failures_written += fails.num_rows
        self._seq += 1
        self._rows, self._failures, self._tests, self._buffered = [], [], [], 0

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


def _images(folder: Path) -> set[str]:
    seen: set[str] = set()
    for f in parts(folder):
        seen.update(pq.read_table(f, columns=["image"]).column("image").unique().to_pylist())
    return seen


def _without(table: pa.Table, images: set[str]) -> pa.Table:
    """``table`` less the rows of ``images``."""
    if not images or not table.num_rows:
        return table
    return table.filter(pc.invert(pc.is_in(table.column("image"), pa.array(sorted(images), pa.string()))))
