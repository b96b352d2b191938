"""Headscope: what every attention head of a Vision Transformer looks at.

In Python (the wheel installs this package as ``headscope``)::

    import headscope

    scope = headscope.load()                  # the embedded default model
    att = scope.attention("cat.png")          # the CLS row of every layer and head
    att.maps                                  # torch.Tensor [layers, heads, queries, tokens]

:func:`load`, :class:`Scope` and :class:`Attention` live in :mod:`headscope.python`; they are
imported on first use, so ``import headscope`` (and ``headscope serve``) stays cheap.

The data path, one sub-package per stage:

* :mod:`app.web` - HTTP: the app factory, middleware, routers, schemas and the one error shape;
* :mod:`app.serving` - the request path: decode, admission, cache, the batching worker, encoders;
* :mod:`app.engine` - the model computation: token layout, capture hooks, selection, analysis, stats;
* :mod:`app.zoo` - model ids and sources, loaders, weight files, position tables, the embedded model;
* :mod:`app.python` - the same numbers in plain Python: ``load()``, ``Scope``, figures.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .python import Attention, Scope, load

__all__ = ["Attention", "Scope", "__version__", "load"]

# The names of the Python API, imported from app/python/ when first asked for (torch, timm).
_LAZY = {"load", "Scope", "Attention"}


def _version() -> str:
    """The installed distribution's version; in a source tree without one, pyproject.toml's."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("headscope")
    except PackageNotFoundError:
        pass
    import re
    from pathlib import Path

    pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
    try:
        m = re.search(r'^version\s*=\s*"([^"]+)"', pyproject.read_text(encoding="utf-8"), re.M)
    except OSError:
        m = None
    return m.group(1) if m else "0+unknown"


__version__ = _version()


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from . import python

        return getattr(python, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | _LAZY)
