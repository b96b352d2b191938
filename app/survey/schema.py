"""The survey's tables: one row per (image, layer, head), and one per picture that failed.

Statistics columns have the same names, definitions and float32 values as
``GET /api/v1/attention/{id}/stats`` gives for the same image (see :mod:`app.engine.stats`):

==================  =========================================================================
``entropy``         mean over query rows of the row entropy / log N (1 = uniform)
``entropy_cls``     entropy of the CLS row / log N (null for models without a CLS token)
``distance_px``     mean attention distance in input pixels (ViT paper, fig. 7)
``prefix_mass``     mean over query rows of the attention on prefix tokens (CLS, registers)
``artifact_mass``   mean over query rows of the attention on high-norm artifact tokens
``mass_patches``    patches holding ``mass`` of the CLS row (DINO masks; null without CLS)
``cls_cosine``      the head's CLS-row cosine similarity to each head of its layer (list)
``similarity``      1 - JS / log 2 to each head of its layer (list; null unless asked for)
==================  =========================================================================

Per layer (repeated on its heads' rows): ``rank_numerical``, ``rank_effective`` (of the
concatenated head outputs). Per image (repeated on its rows): ``image_height``,
``image_width`` (the picture), ``input_height``, ``input_width`` (what the model saw),
``grid_rows``, ``grid_cols``, ``tokens``, ``prefix_tokens``, ``artifact_tokens`` (how many
high-norm tokens the last layer has) and ``artifact_threshold``; ``precision`` (``fp32``, ``bf16``
or ``fp16``: what the forward computed in).

Windowed models (Swin) have the values the stats endpoint gives them
(:mod:`app.engine.window_stats`): each layer has its stage's heads (rows per picture: the sum of
the layers' head counts), ``entropy`` is over each query's window (/ log of its W*W keys),
``distance_px`` is between cells of the stage's grid, ``stage`` names the row's stage and
``grid_rows``, ``grid_cols``, ``tokens`` are that stage's grid; ``entropy_cls``,
``prefix_mass``, ``artifact_mass``, ``mass_patches`` and ``cls_cosine`` are null (no CLS, no
prefix tokens; artifact tokens exist only on the last stage's grid). ``stage`` is null for a
plain ViT.

With ``--faithfulness`` a second table, :data:`FAITHFULNESS`, holds one row per picture and
relevance method: the perturbation test's AUCs and curves (``GET …/faithfulness``'s values).
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

ROWS = pa.schema(
    [
        pa.field("image", pa.string(), nullable=False),
        pa.field("layer", pa.int16(), nullable=False),
        pa.field("head", pa.int16(), nullable=False),
        pa.field("entropy", pa.float32(), nullable=False),
        pa.field("entropy_cls", pa.float32()),
        pa.field("distance_px", pa.float32(), nullable=False),
        pa.field("prefix_mass", pa.float32()),
        pa.field("artifact_mass", pa.float32()),
        pa.field("mass_patches", pa.int32()),
        pa.field("cls_cosine", pa.list_(pa.float32())),
        pa.field("similarity", pa.list_(pa.float32())),
        pa.field("rank_numerical", pa.int32()),
        pa.field("rank_effective", pa.float64()),
        pa.field("image_height", pa.int32(), nullable=False),
        pa.field("image_width", pa.int32(), nullable=False),
        pa.field("input_height", pa.int32(), nullable=False),
        pa.field("input_width", pa.int32(), nullable=False),
        pa.field("grid_rows", pa.int16(), nullable=False),
        pa.field("grid_cols", pa.int16(), nullable=False),
        pa.field("tokens", pa.int32(), nullable=False),
        pa.field("prefix_tokens", pa.int16(), nullable=False),
        pa.field("artifact_tokens", pa.int32(), nullable=False),
        pa.field("artifact_threshold", pa.float32(), nullable=False),
        pa.field("stage", pa.int16()),
        pa.field("precision", pa.string()),
    ]
)

# ``--faithfulness``: one row per (image, method) in a table of its own (OUT.faithfulness.parquet):
# the perturbation test of app/engine/faithfulness.py, what GET …/faithfulness answers.
FAITHFULNESS = pa.schema(
    [
        pa.field("image", pa.string(), nullable=False),
        pa.field("method", pa.string(), nullable=False),  # chefer, grad_attention, attention, rollout, random
        pa.field("target", pa.string(), nullable=False),  # normalised: output, box:X0,Y0,X1,Y1, top, class:N...
        pa.field("class_index", pa.int32()),  # top / class:N: the class whose logit y is
        pa.field("y", pa.float64(), nullable=False),  # the target's unperturbed value
        pa.field("auc_positive", pa.float64()),  # lower is better (null when score0 = 0)
        pa.field("auc_negative", pa.float64()),  # higher is better
        pa.field("fractions", pa.list_(pa.float64()), nullable=False),
        # the score with the most (positive) or least (negative) relevant part removed, over score0
        # (live: the class's probability, or the output's y; paper: top-1 hits, 0 or 1)
        pa.field("positive", pa.list_(pa.float64()), nullable=False),
        pa.field("negative", pa.list_(pa.float64()), nullable=False),
        pa.field("removed", pa.list_(pa.int32()), nullable=False),  # live: patches; paper: pixels removed
        pa.field("num_patches", pa.int32(), nullable=False),
        pa.field("seed", pa.int32()),  # method=random: the map's seed
        pa.field("box", pa.list_(pa.int32())),  # target region: the picture's box [X0, Y0, X1, Y1]
        # live (patches, mean-colour fill, score ratios) or paper (Chefer et al. 2021: pixels, black, top-1 hits,
        # AUC in percent); null in tables written before the option: live
        pa.field("protocol", pa.string()),
        pa.field("score0", pa.float64()),  # live: every curve's denominator; paper: the clean picture's hit
        pa.field("precision", pa.string()),  # fp32, bf16, fp16; null in tables written before the column
    ]
)

FAILURES = pa.schema(
    [
        pa.field("image", pa.string(), nullable=False),
        pa.field("error", pa.string(), nullable=False),  # a code: not_an_image, corrupt_image, read_error...
        pa.field("message", pa.string(), nullable=False),
    ]
)

# Parquet key-value metadata of every part: which model and settings produced the rows.
META_KEY = b"headscope.survey"


def with_meta(schema: pa.Schema, meta: dict[str, Any]) -> pa.Schema:
    return schema.with_metadata({META_KEY: json.dumps(meta, sort_keys=True).encode()})


def meta_of(schema: pa.Schema) -> dict[str, Any]:
    """The survey metadata of ``schema``.

    Raises:
        json.JSONDecodeError: not JSON, or JSON nested deeper than Python's recursion allows
            (``[[[...]]]`` of a hostile file).
    """
    raw = (schema.metadata or {}).get(META_KEY)
    try:
        return json.loads(raw) if raw else {}
    except RecursionError:
        raise json.JSONDecodeError("the metadata is nested too deeply", "", 0) from None


def utf8_text(text: str) -> str:
    """``text`` as a Parquet string can hold it (UTF-8): unchanged when it is valid text.

    A file name whose bytes are not UTF-8 (a Latin-1 ``café.jpg`` from an old archive) reaches
    Python as lone surrogates (``os.fsdecode``: ``'caf\\udce9.jpg'``), which UTF-8 cannot encode;
    each such byte is written as ``\\xNN`` (``'caf\\xe9.jpg'``): the name's bytes,
    ``os.fsencode(name).decode("utf-8", "backslashreplace")``. Lossless for names without
    backslashes of their own: a valid name that holds the four characters ``\\xe9`` reads the
    same. Any other lone surrogate (none comes from a file name) is written as ``\\uNNNN``.
    """
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        pass
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # a surrogate outside U+DC80..U+DCFF
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def empty_rows() -> pa.Table:
    return ROWS.empty_table()


def empty_faithfulness() -> pa.Table:
    return FAITHFULNESS.empty_table()


def empty_failures() -> pa.Table:
    return FAILURES.empty_table()


def failures_table(records: list[tuple[str, str, str]]) -> pa.Table:
    """``(image, error, message)`` records as a :data:`FAILURES` table; any text is written
    (:func:`utf8_text`: a name or message with bytes that are not UTF-8 too)."""
    cols: list[list[str]] = [[utf8_text(str(r[i])) for r in records] for i in range(3)]
    return pa.table([pa.array(c, pa.string()) for c in cols], schema=FAILURES)
