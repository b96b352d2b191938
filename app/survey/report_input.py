"""What ``headscope report`` reads, checked before a chart is drawn: a survey it wrote, or a clear
:class:`ReportError` (the command exits 2) in time bounded by the file's size.

A Parquet file is anyone's file. The report sizes its charts by the largest layer and head it
finds (``head = 32767`` in one row asked for a 32768 x 32768 similarity matrix per layer and ran
for minutes) and indexes by them; the metadata is JSON of any shape. So before anything is drawn:
the file must read as Parquet; the columns the report uses must have the survey schema's types
(:data:`~.schema.ROWS`); every layer's heads must be ``0 .. h-1`` with no gaps, at most
:data:`MAX_HEADS` of them, and at most :data:`MAX_LAYERS` layers; a row's per-head lists
(``cls_cosine``, ``similarity``) must have one value per head of its layer; the metadata must be
an object whose known keys have the types the survey writes (and where it names ``layers`` or
``heads``, the rows must agree). All checks are vectorised (Arrow compute, numpy).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from . import schema
from .output import read_table, survey_meta

# Columns a survey always has and the report cannot do without, when it asks for them: the rows'
# keys and the per-head statistics it charts.
REQUIRED = ("image", "layer", "head", "entropy", "entropy_cls", "distance_px", "prefix_mass", "artifact_mass")
MAX_LAYERS = 1024  # far beyond any ViT (ViT-22B has 48)
MAX_HEADS = 1024  # per layer (ViT-22B has 48)
# The metadata's keys the survey writes, and the JSON types each may have.
META_TYPES: dict[str, tuple[type, ...]] = {
    "model": (str,),
    "arch": (str,),
    "resize": (str,),
    "max_aspect": (int, float),
    "precision": (str,),
    "mass": (int, float),
    "similarity": (bool,),
    "ranks": (bool,),
    "faithfulness": (dict,),
    "layers": (int,),
    "heads": (int,),
}


class ReportError(ValueError):
    """The survey cannot be reported on (no rows, or a file the survey did not write); the message
    says what is wrong."""


def checked_survey(survey: Path, columns: list[str]) -> tuple[pa.Table, dict[str, Any]]:
    """The rows of ``survey`` (only ``columns`` that it has) and its metadata, checked.

    Raises:
        ReportError: not a survey the report can read (see the module docstring).
    """
    try:
        t = read_table(survey)
        meta = survey_meta(survey)  # a folder's first part, or the one part file given
    except (pa.ArrowException, OSError, json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise ReportError(f"{survey} is not a survey Headscope can read ({type(e).__name__}: {str(e)[:200]})") from None
    t = t.select([c for c in columns if c in t.column_names])
    if t.num_rows == 0:
        raise ReportError(f"{survey} holds no survey rows")
    check_meta(survey, meta)
    check_columns(survey, t, [c for c in columns if c in REQUIRED])
    check_layers_and_heads(survey, t, meta)
    return t, meta


def check_meta(survey: Path, meta: Any) -> None:
    """The metadata is a JSON object whose known keys have the survey's types."""
    if not isinstance(meta, dict):
        raise ReportError(f"{survey}: the survey metadata is a {type(meta).__name__}, not an object")
    for key, types in META_TYPES.items():
        value = meta.get(key)
        if value is None:
            continue
        if isinstance(value, bool) and bool not in types:  # JSON true is no number
            types = ()
        if not isinstance(value, types):
            want = " or ".join(t.__name__ for t in META_TYPES[key])
            raise ReportError(f"{survey}: the survey metadata's {key!r} is {str(value)[:40]!r}, not a {want}")


def check_columns(
    survey: Path, t: pa.Table, required: list[str] | tuple[str, ...] = ("image", "layer", "head")
) -> None:
    """Every column the report uses has the type the survey writes (integers of any width for
    the integer columns); ``required`` are there (``image``, ``layer`` and ``head`` always)."""
    for name in ("image", "layer", "head"):
        if name not in t.column_names:
            raise ReportError(f"{survey}: no {name!r} column; not a survey table")
    missing = [name for name in required if name not in t.column_names]
    if missing:
        names = ", ".join(repr(name) for name in missing)
        raise ReportError(
            f"{survey}: no {names} column{'s' if len(missing) > 1 else ''}; the report charts the survey's "
            "statistics (written by headscope survey)"
        )
    for name in t.column_names:
        want = schema.ROWS.field(name).type
        got = t.schema.field(name).type
        if got == want or (pa.types.is_integer(want) and pa.types.is_integer(got)):
            continue
        if pa.types.is_floating(want) and (pa.types.is_floating(got) or pa.types.is_integer(got)):
            continue
        if pa.types.is_list(want) and pa.types.is_list(got) and pa.types.is_floating(got.value_type):
            continue
        raise ReportError(f"{survey}: column {name!r} is {got}, the survey writes {want}")
    for name in ("image", "layer", "head"):
        if t.column(name).null_count:
            raise ReportError(f"{survey}: column {name!r} has empty values")


def check_layers_and_heads(survey: Path, t: pa.Table, meta: dict[str, Any]) -> None:
    """Layers ``0 .. L-1``, each with heads ``0 .. h-1`` (no gaps), within the bounds; per-head
    lists of one value per head of the row's layer."""
    layer = np.asarray(t.column("layer").to_numpy(), dtype=np.int64)
    head = np.asarray(t.column("head").to_numpy(), dtype=np.int64)
    if layer.min() < 0 or head.min() < 0:
        raise ReportError(f"{survey}: negative layer or head numbers")
    if layer.max() >= MAX_LAYERS or head.max() >= MAX_HEADS:
        raise ReportError(
            f"{survey}: layer {layer.max()} or head {head.max()} is beyond what any model has "
            f"(at most {MAX_LAYERS} layers of {MAX_HEADS} heads)"
        )
    L = int(layer.max()) + 1
    pairs = np.unique(layer * MAX_HEADS + head)
    per_layer = np.bincount(pairs // MAX_HEADS, minlength=L)  # distinct heads of each layer
    top = np.full(L, -1)
    np.maximum.at(top, pairs // MAX_HEADS, pairs % MAX_HEADS)
    gaps = np.flatnonzero(per_layer != top + 1)
    if gaps.size:
        lyr = int(gaps[0])
        raise ReportError(
            f"{survey}: layer {lyr} has rows for {per_layer[lyr]} heads but head numbers up to {top[lyr]}; "
            "a survey has heads 0 .. h-1 in every layer"
        )
    for key, have in (("layers", L), ("heads", int(per_layer.max()))):
        if isinstance(meta.get(key), int) and meta[key] != have:
            raise ReportError(f"{survey}: the metadata says {meta[key]} {key}, the rows have {have}")
    for name in ("cls_cosine", "similarity"):
        if name not in t.column_names:
            continue
        lengths = pc.list_value_length(t.column(name)).to_numpy(zero_copy_only=False)
        present = ~np.isnan(lengths.astype(float))
        wrong = present & (lengths.astype(float) != per_layer[layer])
        if wrong.any():
            i = int(np.flatnonzero(wrong)[0])
            raise ReportError(
                f"{survey}: a row of layer {layer[i]} lists {int(lengths[i])} {name} values; its layer has "
                f"{per_layer[layer[i]]} heads"
            )
