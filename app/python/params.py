"""Python arguments -> the API's parameters, validated by the API's own models.

The Python API takes what reads naturally in Python (``layers=-1``, ``layers=[0, 5]``,
``query=(3, 5)``, ``ablate=[(0, 1)]``) as well as the API's text grammar (``layers="0-3"``,
``query="patch:3,5"``), writes it in that grammar, and validates it with the models the routes
take (:mod:`app.serving.params`: `AttentionParams`, `ExplainParams`, `PruningQuery`, ...). A bad
value raises ``ValueError`` or ``TypeError`` with the text the API answers in its 422
(:func:`~app.serving.params.validation_message`).
"""

from __future__ import annotations

import typing
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from ..serving.params import validation_message


class ParameterError(ValueError):
    """A parameter the API would answer with 422 ``invalid_parameter``; the message is the API's."""

    code = "invalid_parameter"


def _takes_bool(annotation: Any) -> bool:
    return annotation is bool or bool in typing.get_args(annotation)


def build(schema: type, /, **fields: Any) -> Any:
    """``schema(**fields)``, a `ParameterError` with the API's text where it fails.

    ``True`` and ``False`` go only to the switches: pydantic reads them as 1 and 0 elsewhere
    (``mass=True`` was a mass of 1), where the REST API refuses ``mass=true``.
    """
    for name, value in fields.items():
        field = getattr(schema, "model_fields", {}).get(name)
        if isinstance(value, bool) and field is not None and not _takes_bool(field.annotation):
            raise ParameterError(f"{name}: a number or text, not {value}")
    try:
        return schema(**fields)
    except ValidationError as e:
        raise ParameterError(validation_message(e)) from None


def _is_int(v: Any) -> bool:
    import numbers

    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def indices(value: Any, name: str) -> str:
    """``layers`` / ``heads`` in the API's grammar: None -> ``all``; an int; a sequence of ints
    (a ``range`` too); or the text itself (``"0-3,-1"``)."""
    if value is None:
        return "all"
    if isinstance(value, str):
        return value
    value = _listed(value)
    if _is_int(value):
        return str(int(value))
    if isinstance(value, (Sequence, range)) and all(_is_int(v) for v in value):
        if len(value) == 0:  # "" in the grammar would be every one: twelve times what was meant
            raise ParameterError(f"{name}: an empty selection selects nothing; give None for all")
        return ",".join(str(int(v)) for v in value)
    raise TypeError(
        f"{name}: None (all), an int, a sequence of ints (a 1-D integer array or tensor too) or the API's text "
        f"like '0-3,-1'; got {value!r}"
    )


def _int_array(value: Any) -> bool:
    """A numpy array or torch tensor of integers (not floats, complex numbers or bools)."""
    import numpy as np
    import torch

    if isinstance(value, np.ndarray):
        return value.dtype.kind in "iu"
    if isinstance(value, torch.Tensor):
        d = value.dtype
        return not (d.is_floating_point or d.is_complex or d == torch.bool)
    return False


def _listed(value: Any) -> Any:
    """A numpy array or torch tensor of integers as a Python int (0-D) or list (1-D); anything
    else as it is."""
    return value.tolist() if _int_array(value) and value.ndim <= 1 else value


def _cell(v: Any) -> bool:
    """A grid cell (or a ``(layer, head)`` pair): a tuple of two ints."""
    return isinstance(v, tuple) and len(v) == 2 and all(_is_int(x) for x in v)


def _pair(v: Any) -> bool:
    """Two ints as a tuple or a list: an item of a list of cells or pairs (``[[3, 5], [4, 6]]``,
    an ``N x 2`` array's rows). A lone list of two ints is two token indices, never a cell."""
    return isinstance(v, (tuple, list)) and len(v) == 2 and all(_is_int(x) for x in v)


def _rows(value: Any) -> Any:
    """An ``N x 2`` integer array or tensor (``np.argwhere``'s shape) as a list of ``[a, b]`` lists."""
    return value.tolist() if _int_array(value) and value.ndim == 2 and value.shape[1] == 2 else value


def query(value: Any) -> str | None:
    """``query`` in the API's grammar: ``"cls"``, ``"all"``, a token index (int), a grid cell
    ``(row, col)``, a list of token indices or of cells (tuples, two-item lists, an ``N x 2``
    array), or the text itself (``"patch:3,5"``); None: the model's default (the CLS row, or the
    first patch where there is no CLS token)."""
    if value is None or isinstance(value, str):
        return value
    value = _rows(_listed(value))
    if _is_int(value):
        return str(int(value))
    if _cell(value):
        return f"patch:{int(value[0])},{int(value[1])}"
    if isinstance(value, (list, range)) and value and all(_is_int(v) for v in value):
        return ",".join(str(int(v)) for v in value)
    if isinstance(value, (list, tuple)) and value and all(_pair(v) for v in value):
        return "patch:" + ";".join(f"{int(r)},{int(c)}" for r, c in value)
    raise TypeError(
        "query: 'cls', 'all', a token index, a cell as a tuple (row, col), a list of token indices or of cells "
        f"(tuples, [row, col] lists or an N x 2 array), or the API's text like 'patch:3,5'; got {value!r}"
    )


def ablate(value: Any) -> str:
    """``ablate`` in the API's grammar: None or empty -> ``""``; ``(layer, head)`` pairs; or the
    text itself (``"0:1,11:5"``)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    value = _rows(value)
    if _cell(value):
        value = [value]
    if isinstance(value, (list, tuple, set, frozenset)) and all(_pair(v) for v in value):
        return ",".join(f"{int(a)}:{int(b)}" for a, b in sorted(tuple(v) for v in value))
    raise TypeError(
        f"ablate: (layer, head) pairs (tuples, [layer, head] lists or an N x 2 array), or the API's text like "
        f"'0:1,11:5'; got {value!r}"
    )


def seed(value: Any) -> int:
    """The ``random`` map's seed, checked as the API checks ``seed=`` (an int, 0 to 2**31 - 1)."""
    from ..serving.params import RelevanceParams

    if not _is_int(value):
        raise TypeError(f"seed: an int from 0 to {2**31 - 1}; got {value!r}")
    return int(build(RelevanceParams, seed=int(value)).seed)
