"""Reading the upload form: Starlette's multipart parser, with RFC 5987 file names and a deadline.

What a form may look like (each case answered by the route, ``api/attention.py``):

* the media type is matched without regard to case (``Multipart/Form-Data`` is
  ``multipart/form-data``, as RFC 9110 says media types are);
* a part with ``filename*=UTF-8''caf%C3%A9.png`` (RFC 5987 extended notation) is a file named
  ``café.png``. RFC 7578 forbids that notation in forms and python-multipart ignores it, which
  made such a file a text field (refused as over 64 KB, a misleading 400); but older clients
  (urllib3 1.x, hence ``requests``) send exactly that for non-ASCII names, so it is read. With
  both ``filename`` and ``filename*``, ``filename*`` wins (as RFC 6266 says for downloads); one
  that cannot be decoded (a charset other than UTF-8 or ISO-8859-1, bad UTF-8) leaves the part
  a file without a name;
* a body that ends before its closing boundary (``--BOUNDARY--``) is malformed: an upload cut
  short would otherwise lose its unfinished part silently, and be answered as if it had no file
  (python-multipart does not check that the message ended);
* what the parser could not read is said in words: a field other than a file over the field
  limit is 413 ``field_too_large`` (not a malformed body), and a part whose headers run past
  python-multipart's limit (a file name of kilobytes) says so instead of "Invalid multipart data";
* the body must have arrived by the request's deadline, and after a grace period at a minimum
  average rate (408 otherwise, :func:`paced`); a client that drops mid-upload ends the request
  quietly (499 in the log, no traceback).
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from urllib.parse import unquote_to_bytes

from starlette.datastructures import FormData
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import Request

from .errors import ApiError

_PART_TOO_LARGE = re.compile(r"(Part|Field) exceeded maximum size")


def is_multipart(content_type: str) -> bool:
    return content_type.split(";", 1)[0].strip().lower() == "multipart/form-data"


def _ext_value(value: bytes) -> str | None:
    """Decode an RFC 5987 ext-value (``UTF-8'lang'caf%C3%A9.png``); None when it cannot be."""
    try:
        charset, _lang, encoded = value.decode("ascii").split("'", 2)
        if charset.lower() not in ("utf-8", "iso-8859-1"):  # the two RFC 5987 requires
            return None
        return unquote_to_bytes(encoded).decode(charset.lower(), errors="strict")
    except (UnicodeError, ValueError):
        return None


_EXT_FILENAME = re.compile(rb';\s*filename\*\s*=\s*("?)([^;"]*)\1', re.IGNORECASE)
_PLAIN_FILENAME = re.compile(rb';\s*filename\s*=\s*("(?:[^"\\]|\\.)*"|[^;]*)', re.IGNORECASE)


def _plain_filename(disposition: bytes) -> bytes:
    """``disposition`` with an RFC 5987 ``filename*`` rewritten as a plain ``filename``."""
    m = _EXT_FILENAME.search(disposition)
    if m is None:
        return disposition
    filename = _ext_value(m.group(2)) or ""
    clean = "".join(ch for ch in filename if ch not in '"\\\r\n')
    rest = _PLAIN_FILENAME.sub(b"", _EXT_FILENAME.sub(b"", disposition))
    return rest + b'; filename="' + clean.encode("utf-8") + b'"'


class FormParser(MultiPartParser):
    """Starlette's parser, reading ``filename*`` too, and knowing whether the body reached its
    closing boundary (see the module docstring)."""

    ended = False

    def on_end(self) -> None:
        self.ended = True
        super().on_end()

    def on_headers_finished(self) -> None:
        cd = self._current_part.content_disposition
        if cd:
            self._current_part.content_disposition = _plain_filename(bytes(cd))
        super().on_headers_finished()


class BodyTooSlow(Exception):
    """The body arrived slower than the minimum rate once its grace period was over (408)."""


async def paced(
    chunks: AsyncIterator[bytes], grace_s: float, min_rate: float, now: Callable[[], float] = time.monotonic
) -> AsyncGenerator[bytes, None]:
    """``chunks``, as long as they keep up: after ``grace_s`` the bytes received must average
    ``min_rate`` per second since the grace period ended (0: no minimum).

    So the time a body may take grows with its size: a slow client cannot hold its upload slot
    for the whole request deadline with a trickle of bytes. Waiting for the next chunk is bounded
    by the moment the bytes so far fall behind.

    Raises:
        BodyTooSlow: the body fell behind.
    """
    t0 = now()
    received = 0
    it = chunks.__aiter__()
    while True:
        if min_rate > 0:
            behind_at = t0 + grace_s + received / min_rate  # from then on, ``received`` is too little
            left = behind_at - now()
            if left <= 0:
                raise BodyTooSlow(f"{received:,} bytes in {now() - t0:.1f} s")
            try:
                chunk = await asyncio.wait_for(it.__anext__(), left)
            except StopAsyncIteration as end:
                # raised in wait_for's task, kept by it, with a traceback through wait_for's frame
                # that holds the task: a reference cycle holding the last chunk, until dropped
                end.__traceback__ = None
                return
            except asyncio.TimeoutError:
                raise BodyTooSlow(f"{received:,} bytes in {now() - t0:.1f} s") from None
        else:
            try:
                chunk = await it.__anext__()
            except StopAsyncIteration:
                return
        received += len(chunk)
        yield chunk


async def read_form(
    request: Request,
    *,
    max_files: int,
    max_fields: int,
    max_part_size: int,
    timeout_s: float,
    grace_s: float = math.inf,
    min_rate: float = 0.0,
) -> FormData:
    """Parse the request's multipart body within ``timeout_s``, at ``min_rate`` bytes per second
    or better once ``grace_s`` is over (:func:`paced`).

    Raises:
        asyncio.TimeoutError: the body did not arrive in time.
        BodyTooSlow: it arrived too slowly.
        starlette.requests.ClientDisconnect: the client went away mid-body.
        starlette.formparsers.MultiPartException: a malformed body.
    """
    stream = paced(request.stream(), grace_s, min_rate)
    limits = {"max_files": max_files, "max_fields": max_fields, "max_part_size": max_part_size}
    parser = FormParser(request.headers, stream, **limits)
    form = await asyncio.wait_for(parser.parse(), max(0.001, timeout_s))
    if not parser.ended:
        await form.close()
        raise MultiPartException("the body ends before its closing boundary (was the upload cut short?)")
    return form


def multipart_error(e: MultiPartException, max_field_bytes: int) -> ApiError:
    """The answer to a form the parser refused (``e``): what was wrong, in the one error shape."""
    if _PART_TOO_LARGE.match(e.message):
        return ApiError(
            413,
            "field_too_large",
            f"a form field that is not a file is over {max_field_bytes:,} bytes (the picture must come as a file "
            "part, with a filename in its Content-Disposition: curl -F image=@photo.jpg; the other fields are short "
            "text)",
        )
    cause = e.__cause__  # python-multipart's own reason behind starlette's "Invalid multipart data."
    why = (str(cause).strip() if cause is not None else "") or e.message
    why = "".join(ch if ch.isprintable() else " " for ch in why)[:200]
    if "header size" in why.lower():
        why += " (a part's header line, its file name included, may be at most about 4 KB)"
    return ApiError(400, "bad_multipart", f"malformed multipart body: {why}")
