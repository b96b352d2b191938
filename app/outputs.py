"""Files the command line writes: never replaced by surprise, and with the user's normal permissions.

Some writers create their file with mode 0600 (safetensors >= 0.6 writes through a private
temporary file), which a user does not expect of an output: another account, a web server or a
shared group could not read it. Writing to a temporary name beside the target, setting the mode
the user's umask gives a new file, and renaming it into place keeps both promises: the file is
whole or absent, and readable like any other file the user creates.
"""

from __future__ import annotations

import os
import secrets
import stat
from collections.abc import Sequence
from pathlib import Path


def normal_mode() -> int:
    """The mode a newly created file gets under the process's umask (``0o644`` under ``022``)."""
    umask = os.umask(0)  # reading the umask means setting it; put it back at once
    os.umask(umask)
    return 0o666 & ~umask


_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def file_kind(mode: int) -> str:
    """What a path that is not a regular file is, in words (``os.stat``'s ``st_mode``)."""
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


# Suffixes of formats someone may expect an output in; another suffix (``run.v2``) is a name.
FORMATS = frozenset(
    {".safetensors", ".npy", ".npz", ".pt", ".pth", ".pkl", ".pickle", ".json", ".h5", ".hdf5", ".mat", ".csv"}
    | {".txt", ".parquet", ".html", ".htm", ".png", ".jpg", ".jpeg", ".pdf"}
)


def file_path(text: str, suffix: str, what: str, hint: str = "") -> Path:
    """The file an ``--out`` names, refused where its name says something it is not.

    A name ending in a path separator names a folder, which ``Path`` would silently drop
    (``--out x.safetensors/`` wrote the file ``x.safetensors``); a name with another format's
    suffix (``--out attn.npy``, :data:`FORMATS`) got this format under that name, and ``np.load``
    then failed with a message about pickles. Any other name is taken as it is.

    Args:
        text: the option's value as typed.
        suffix: the format's suffix (``.safetensors``); ``.htm`` goes for ``.html``.
        what: the format in words, for the message (``safetensors``).
        hint: said after the name meant (how to read the format).

    Raises:
        OutputError: the name is a folder's or another format's; the message gives the name meant.
    """
    if text.endswith((os.sep, "/")):
        name = text.rstrip(os.sep + "/") or "out"
        meant = name if name.endswith(suffix) else f"{name}/out{suffix}"
        raise OutputError(f"--out {text} ends in '/', a folder; --out names the file to write, e.g. --out {meant}")
    path = Path(text)
    if path.suffix.lower() in FORMATS - {suffix, suffix.replace(".html", ".htm")}:
        raise OutputError(
            f"--out {text}: this writes {what}, not {path.suffix}; name it {path.with_suffix(suffix)}{hint}"
        )
    return path


def refuse_existing(path: Path, force: bool, flag: str = "--force", keep: Sequence[Path] = ()) -> None:
    """Raise ``FileExistsError`` for an existing ``path`` unless ``force``; the message says how to
    replace it. Only a regular file is ever replaced: a folder (it may be the very one the
    pictures are read from), a device (``--out /dev/null`` as root made ``/dev/null`` a file), a
    FIFO or a socket is refused, ``force`` or not; so is any file of ``keep`` (the command's own
    input, such as a report's survey)."""
    if path.is_dir():
        raise FileExistsError(f"{path} is a folder; --out names the file to write (a folder is never replaced)")
    if not path.exists():
        return
    if not path.is_file():
        raise FileExistsError(
            f"{path} is {file_kind(path.stat().st_mode)}, not a regular file; --out names a file to write "
            "(only a regular file is ever replaced)"
        )
    if any(_same_file(path, k) for k in keep):
        raise FileExistsError(f"{path} is this command's own input; choose another --out")
    if not force:
        raise FileExistsError(f"{path} exists (a file); pass {flag} to replace it, or choose another --out")


def _same_file(path: Path, other: Path) -> bool:
    """``path`` is ``other``, or a file inside the folder ``other``."""
    try:
        p, o = path.resolve(), other.resolve()
    except OSError:
        return False
    return p == o or o in p.parents


class OutputError(ValueError):
    """An output that cannot be written there, said before the work that would fill it."""


def check_writable(path: Path, folder: bool = False) -> None:
    """Whether ``path`` can be written, found before the work that would fill it: a read-only
    place, a missing permission or a file where a folder should be fails here, not after minutes
    of work. A folder that exists is tried with a temporary file; missing folders (made when the
    output is written, as ``mkdir -p`` would) are not made here, their nearest existing one is asked.

    Args:
        path: the output.
        folder: ``path`` is a folder the output's files go into (a survey's), not a file.

    Raises:
        OutputError: the place cannot be written; the message says why.
    """
    home = path if folder else path.parent  # where files are created
    base = next(p for p in (home, *home.parents) if p.exists())  # the root exists
    if not base.is_dir():
        raise OutputError(f"cannot write {path}: {base} is a file, not a folder")
    if base != home:
        # Tried, not asked of os.access: root passes that check where nothing can be made (/proc,
        # a read-only disk).
        probe_dir = base / f".{path.name}.{secrets.token_hex(6)}.probe"  # no other run's, no leftover
        try:
            probe_dir.mkdir()
            probe_dir.rmdir()
        except OSError as e:
            why = e.strerror or type(e).__name__
            raise OutputError(f"cannot write {path}: cannot make folders in {base} ({why})") from None
        return
    probe = home / f".{path.name}.{secrets.token_hex(6)}.tmp"
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        os.unlink(probe)
    except OSError as e:
        raise OutputError(f"cannot write {path}: {e.strerror or type(e).__name__}") from None


def temporary_beside(path: Path) -> Path:
    """A hidden temporary name in ``path``'s folder (same file system, so the rename is atomic)."""
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def publish(tmp: Path, path: Path) -> None:
    """Give ``tmp`` the user's normal permissions and rename it to ``path`` (atomically)."""
    os.chmod(tmp, normal_mode())
    os.replace(tmp, path)
