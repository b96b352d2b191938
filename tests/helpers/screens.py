"""Browser tests run at several screen sizes: the first every day, the others with the long tests.

`make test` runs each such test at the first size it names (the layout a test is about: a
desktop window, or the smallest phone); the other sizes (200 % zoom, more phones, a wider
desktop) carry the marker `screens`, which `make test-long` and CI run.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import pytest


def sizes(values: Iterable, ids: Sequence[str] | None = None) -> list:
    """``pytest.param``s of ``values`` (a size id, or a tuple of arguments) for a parametrize or a
    fixture's ``params``: the first unmarked, every other one marked ``screens``.

    Args:
        values: the sizes, in the order the test names them.
        ids: their test ids (default: each value itself, which must then be a string).
    """
    values = list(values)
    ids = list(ids) if ids is not None else [str(v) for v in values]
    out = []
    for n, (value, id_) in enumerate(zip(values, ids, strict=True)):
        args = value if isinstance(value, tuple) else (value,)
        out.append(pytest.param(*args, id=id_, marks=() if n == 0 else (pytest.mark.screens,)))
    return out
