"""Where the app finds its web assets and keeps its models, wherever it is installed.

Web assets (``static/``, ``templates/``) live in the repository's top-level folders. A wheel
ships them inside the package (``app/static``, ``app/templates``, mapped by ``pyproject.toml``);
a checkout or an editable install reads the top-level folders. Neither depends on the current
directory.

Models (downloads and converted weights), first match wins:

1. ``HEADSCOPE_MODELS_DIR`` (``Settings.models_dir``);
2. ``models/`` of the checkout, when the app runs from one (source tree or editable install);
3. the user's cache directory (``platformdirs``: ``~/.cache/headscope/models`` on Linux).

Never inside site-packages: an upgrade would delete them, and a system install is read-only.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
CHECKOUT_DIR = PACKAGE_DIR.parent
APP_NAME = "headscope"


def is_checkout() -> bool:
    """True when ``app`` is imported from a source tree (plain or editable), not from a wheel."""
    return (CHECKOUT_DIR / "pyproject.toml").is_file() and (CHECKOUT_DIR / "app" / "__init__.py").is_file()


def asset_dir(name: str) -> Path:
    """The folder of web assets ``name`` (``static`` or ``templates``).

    Raises:
        FileNotFoundError: neither the installed package nor a checkout has it.
    """
    for candidate in (PACKAGE_DIR / name, CHECKOUT_DIR / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(
        f"the web assets folder {name!r} is missing: neither {PACKAGE_DIR / name} (installed wheel) "
        f"nor {CHECKOUT_DIR / name} (checkout) exists; reinstall headscope"
    )


def default_models_dir() -> Path:
    """``models/`` of the checkout, else the user's cache directory (see the module docstring)."""
    if is_checkout():
        return CHECKOUT_DIR / "models"
    from platformdirs import user_cache_path

    return user_cache_path(APP_NAME, appauthor=False) / "models"
