"""JSON inside an HTML ``<script>`` element, escaped so that no data can end or change the element.

An HTML parser reads a script element's text without knowing JSON: ``</script>`` ends it, and
``<!--`` followed by ``<script`` puts the parser in its "double-escaped" state, which swallows
the scripts after it (a file named ``<!--<script>x.png`` blanked the page). Escaping every ``<``
as ``\\u003c`` (and ``>``, ``&`` and the two line separators JavaScript once refused) leaves the
same JSON value and nothing for the HTML parser to see. Jinja's ``tojson`` does the same.
"""

from __future__ import annotations

import json
from typing import Any

_ESCAPES = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def script_json(value: Any, **dumps: Any) -> str:
    """``json.dumps(value, **dumps)`` safe to put between ``<script>`` and ``</script>``."""
    return json.dumps(value, **dumps).translate(_ESCAPES)
