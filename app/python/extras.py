"""The notebook extra: optional dependencies, imported when first needed, with the way to get them."""

from __future__ import annotations

import importlib
from typing import Any

NOTEBOOK_EXTRA = "pip install 'headscope[notebook]'"


def need(module: str, what: str) -> Any:
    """``module`` imported, or an ImportError that names the extra holding it.

    Args:
        module: the module to import (``matplotlib.figure``, ``pandas``, ``anywidget``).
        what: what needs it, for the message (``Attention.save()``).
    """
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ImportError(
            f"{what} needs {module.split('.')[0]}, part of the notebook extra: {NOTEBOOK_EXTRA}"
        ) from None
