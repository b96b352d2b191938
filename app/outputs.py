"""Files the command line writes: never replaced by surprise, and with the user's normal permissions.

Some writers create their file with mode 0600 (safetensors >= 0.6 writes through a private
temporary file), which a user does not expect of an output: another account, a web server or a
shared group could not read it. Writing to a temporary name beside the target, setting the mode
the user's umask gives a new file, and renaming it into place keeps both promises: the file is
whole or absent, and readable like any other file the user creates.
"""

from __future__ import annotations

import os
from pathlib import Path


def normal_mode() -> int:
    """The mode a newly created file gets under the process's umask (``0o644`` under ``022``)."""
    umask = os.umask(0)  # reading the umask means setting it; put it back at once
    os.umask(umask)
    return 0o666 & ~umask


def refuse_existing(path: Path, force: bool, flag: str = "--force") -> None:
    """Raise ``FileExistsError`` for an existing ``path`` unless ``force``; the message says how to replace it."""
    if path.exists() and not force:
        what = "folder" if path.is_dir() else "file"
        raise FileExistsError(f"{path} exists (a {what}); pass {flag} to replace it, or choose another --out")


def temporary_beside(path: Path) -> Path:
    """A hidden temporary name in ``path``'s folder (same file system, so the rename is atomic)."""
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def publish(tmp: Path, path: Path) -> None:
    """Give ``tmp`` the user's normal permissions and rename it to ``path`` (atomically)."""
    os.chmod(tmp, normal_mode())
    os.replace(tmp, path)
