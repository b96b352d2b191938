"""Static files whose ``Range`` header is read as RFC 9110 says: a range the server cannot read
(another unit, bad syntax, a last byte before the first) is ignored and the whole file sent
with 200, where Starlette answers 400 in plain text."""

from __future__ import annotations

import os
import re

from starlette.responses import Response
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

# bytes=0-99, bytes=500-, bytes=-20, and lists of them (RFC 9110 14.1.1); positions of at most
# 18 digits (int() refuses over 4,300, and no file here has 10^18 bytes)
_POS = r"\d{0,18}"
_RANGE = re.compile(rf"bytes=(?P<set>\s*(?:{_POS}-{_POS})(?:\s*,\s*{_POS}-{_POS})*\s*)", re.IGNORECASE)


def readable_range(value: str) -> bool:
    """Whether a ``Range`` value is a byte range set Starlette can serve or rightly refuse
    (416 for a first byte past the end)."""
    m = _RANGE.fullmatch(value.strip())
    if m is None:
        return False
    for part in m["set"].split(","):
        first, _, last = part.strip().partition("-")
        if not first and not last:
            return False
        if first and last and int(last) < int(first):
            return False
    return True


def drop_unreadable_range(scope: Scope) -> None:
    """Take a ``Range`` the server cannot read (and its ``If-Range``) out of the request, before a
    ``FileResponse`` reads it: the file is then sent whole."""
    headers = scope.get("headers") or []
    given = [v for k, v in headers if k == b"range"]
    if given and not (len(given) == 1 and readable_range(given[0].decode("latin-1"))):
        scope["headers"] = [(k, v) for k, v in headers if k not in (b"range", b"if-range")]


class Static(StaticFiles):
    """``StaticFiles`` that ignores a ``Range`` it cannot read (see the module docstring)."""

    def file_response(
        self, full_path: str | os.PathLike[str], stat_result: os.stat_result, scope: Scope, status_code: int = 200
    ) -> Response:
        drop_unreadable_range(scope)
        return super().file_response(full_path, stat_result, scope, status_code)
