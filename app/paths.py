"""Where the app finds its web assets and keeps its models, wherever it is installed.

Web assets (``static/``, ``templates/``) live in the repository's top-level folders. A wheel
ships them inside the package (``headscope/static``, ``headscope/templates``, mapped by
``pyproject.toml``; the wheel's ``headscope`` is the repository's ``app/``); a checkout or an
editable install reads the top-level folders. Neither depends on the current
directory.

Models (downloads and converted weights), first match wins:

1. ``HEADSCOPE_MODELS_DIR`` (``Settings.models_dir``);
2. ``models/`` of the checkout, when the app runs from one (source tree or editable install);
3. the user's cache directory (``platformdirs``: ``~/.cache/headscope/models`` on Linux).

Never inside site-packages: an upgrade would delete them, and a system install is read-only.
"""

from __future__ import annotations

import re
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
CHECKOUT_DIR = PACKAGE_DIR.parent
APP_NAME = "headscope"


def is_checkout() -> bool:
    """True when the package is imported from a source tree (``app/``, plain or editable, also as
    ``headscope``), not from a wheel."""
    return (CHECKOUT_DIR / "pyproject.toml").is_file() and (CHECKOUT_DIR / "app" / "__init__.py").is_file()


def asset_dir(name: str) -> Path:
    """The folder of web assets ``name`` (``static`` or ``templates``).

    The installed package's copy, else the checkout's; when neither exists, the package's path
    (the commands that need no page, ``fetch`` and ``extract``, still run; ``serve`` refuses to
    start with :func:`check_asset_dirs`'s message).
    """
    for candidate in (PACKAGE_DIR / name, CHECKOUT_DIR / name):
        if candidate.is_dir():
            return candidate
    return PACKAGE_DIR / name


def check_asset_dirs(**dirs: Path) -> None:
    """Raise FileNotFoundError, saying what to do, for the first of ``dirs`` that is missing.

    Args:
        **dirs: each folder by its name (``static``, ``templates``), whose setting is
            ``HEADSCOPE_<NAME>_DIR``.
    """
    for name, d in dirs.items():
        if d.is_dir():
            continue
        variable = f"HEADSCOPE_{name.upper()}_DIR"
        if d == asset_dir(name):  # the default: the package (or checkout) lacks it
            raise FileNotFoundError(
                f"the web assets folder {d} is missing (neither the installed package nor a checkout "
                f"has {name}/); reinstall headscope, or set {variable} to a folder that has them"
            )
        raise FileNotFoundError(f"{variable}: {d} is not a folder (it holds the page's {name} files)")


def default_models_dir() -> Path:
    """``models/`` of the checkout, else the user's cache directory (see the module docstring)."""
    if is_checkout():
        return CHECKOUT_DIR / "models"
    from platformdirs import user_cache_path

    return user_cache_path(APP_NAME, appauthor=False) / "models"


def built_docs_dir() -> Path | None:
    """The documentation site ``make docs`` built into the checkout's ``site/``, if it is there."""
    site = CHECKOUT_DIR / "site"
    return site if is_checkout() and (site / "index.html").is_file() else None


# A scheme of two letters or more and "//": not a Windows drive ("C:").
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]+://")


def is_url(text: str) -> bool:
    """Whether a path given as text is a URL (``https://...``), which nothing here downloads:
    read as a path, its ``//`` would fold and it would be called a missing file."""
    return _URL.match(text) is not None
