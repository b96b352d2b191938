"""The nearest model names to a misspelt one: what the loaders' "unknown name" errors add
("did you mean ...?"), from timm's lists of the supported families, with difflib."""

from __future__ import annotations

import difflib
from functools import lru_cache

MAX_SUGGESTIONS = 3


@lru_cache(maxsize=1)
def _names() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(pretrained names with their tags, architecture names) of the supported families (those of
    the catalogue: a name of another family is refused anyway, with the families). timm's own
    lists, without reading every pretrained configuration: well under a second."""
    import re

    import timm
    from timm.models import get_arch_name
    from timm.models._registry import _model_to_module  # timm's own name -> module table

    from .catalog import FAMILIES, UNSUPPORTED_PATTERNS

    def ours(name: str) -> bool:
        module = _model_to_module.get(get_arch_name(name), "")
        return module in FAMILIES and not any(re.search(p, name) for p in UNSUPPORTED_PATTERNS)

    return tuple(filter(ours, timm.list_pretrained())), tuple(filter(ours, timm.list_models()))


def nearest(name: str, n: int = MAX_SUGGESTIONS) -> list[str]:
    """The names of supported pretrained models (or architectures, for a name without a tag)
    closest to ``name`` (difflib's ratio, at least 0.6): for "did you mean ...?"."""
    bare = name.removeprefix("timm:").strip().lower()
    supported, archs = _names()
    pool = supported if "." in bare else archs
    return difflib.get_close_matches(bare, pool, n=n, cutoff=0.6)


def did_you_mean(name: str, prefix: str = "") -> str:
    """`` Did you mean timm:a, timm:b?`` (with ``prefix`` before each timm name), or ``""``. The
    embedded default comes first when the name is near it (``dinov2-s14`` is not a timm name)."""
    from .embedded import MODEL_ID

    bare = name.removeprefix("timm:").strip().lower()
    home = [MODEL_ID] if difflib.get_close_matches(bare, [MODEL_ID], n=1, cutoff=0.6) else []
    near = home + [prefix + x for x in nearest(name)]
    return f" Did you mean {', '.join(near)}?" if near else ""
