"""Headscope in Python and in notebooks: the REST API's numbers without a server.

::

    import headscope

    scope = headscope.load()                          # the embedded default model
    att = scope.attention("cat.png", query="cls")     # the API's answer, as torch tensors
    att.maps.shape                                    # [layers, heads, queries, tokens]
    att.stats()                                       # every head's statistics, a DataFrame

`load` gives a `Scope` (one model on its device); `Scope.attention` gives an
`Attention` per picture. Everything is computed by the server's own pieces (the one
picture path, the one forward, the answers' functions), so every number equals the REST API's
for the same picture; bad arguments raise ``ValueError`` / ``TypeError`` with the API's message.
"""

from __future__ import annotations

from .inputs import png_bytes
from .result import Attention
from .scope import Scope, load

__all__ = ["Attention", "Scope", "load", "png_bytes"]
