"""What a survey reads: the images under a folder, or the paths a text file lists.

Every image gets its name in the output, ``image``: its path relative to SOURCE with ``/``
separators (sub-folders kept), so two runs over the same folder on different machines name
the same picture the same way and ``--resume`` can recognise it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ..paths import is_url
from .schema import utf8_text

IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".webp", ".gif", ".bmp", ".tif", ".tiff"})


class SourceError(ValueError):
    """SOURCE is neither a folder, an image nor a readable list of paths."""


@dataclass(frozen=True)
class Item:
    """One picture to survey.

    Attributes:
        image: its name in the output (relative to SOURCE, ``/``-separated).
        path: where to read it (absolute, or as written in a list when that is absolute).
    """

    image: str
    path: str


def is_image_name(name: str) -> bool:
    return Path(name).suffix.lower() in IMAGE_SUFFIXES


def walk_folder(root: Path) -> list[Item]:
    """Image files under ``root``, recursively, sorted by their relative path.

    Hidden files and folders (names starting with ``.``) are skipped, symbolic links to folders
    are not followed (no cycles), links to files are. Every other entry with an image's name is
    listed, also when it cannot be read (a FIFO, a socket, a broken symbolic link, a loop of
    links): reading it fails without blocking, and the survey records why in its failures
    table, as for any unreadable picture.
    """
    root = root.resolve()
    out: list[Item] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        rel_dir = Path(dirpath).relative_to(root)
        for f in filenames:  # os.walk puts everything that is not a folder (or a link to one) here
            if f.startswith(".") or not is_image_name(f):
                continue
            out.append(Item(utf8_text((rel_dir / f).as_posix()), str(Path(dirpath) / f)))
    out.sort(key=lambda it: it.image)
    return out


def read_list(list_file: Path) -> list[Item]:
    """The paths a text file lists, one a line, in the file's order.

    Blank lines and lines starting with ``#`` are skipped; relative paths are relative to the
    list's folder; a path listed twice is surveyed once. Listed files that do not exist are
    kept: the survey records them as failures.
    """
    try:
        text = list_file.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise SourceError(f"{list_file} is neither a folder, an image nor a UTF-8 text file of image paths") from None
    base = list_file.resolve().parent
    seen: set[str] = set()
    out: list[Item] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        p = Path(line)
        full = p if p.is_absolute() else base / p
        try:
            name = (
                full.resolve().relative_to(base).as_posix()
                if p.is_absolute()
                else PurePosixPath(p.as_posix()).as_posix()
            )
        except ValueError:  # an absolute path outside the list's folder keeps its full name
            name = p.as_posix()
        if name in seen:
            continue
        seen.add(name)
        out.append(Item(utf8_text(name), str(full)))
    return out


def list_images(source: Path | str) -> list[Item]:
    """The pictures of SOURCE: a folder (recursive), a text file of paths, or one image.

    Args:
        source: the folder, list file or image.

    An image SOURCE that cannot be read (a FIFO named ``x.png``...) is listed: the survey
    records it as a failure. A list SOURCE must be a regular file (a FIFO would block).

    Raises:
        FileNotFoundError: SOURCE does not exist.
        SourceError: SOURCE is a file that is neither an image nor a text list.
    """
    if is_url(str(source)):  # Path() would fold its "//" and call it a missing file
        raise SourceError(f"{source}: a URL; survey reads files, folders and lists of paths: download it first")
    src = Path(source)
    if src.is_dir():
        return walk_folder(src)
    if not src.exists():
        raise FileNotFoundError(f"no such folder or file: {src}")
    if is_image_name(src.name):
        return [Item(utf8_text(src.name), str(src.resolve()))]
    if not src.is_file():
        raise SourceError(f"{src} is neither a folder, an image nor a list of image paths (not a regular file)")
    return read_list(src)
