"""The Python API's tests import ``headscope``: it must be this checkout's ``app/`` folder.

An editable install (``pip install -e .``) maps ``headscope`` to the checkout's ``app/``; a
worktree beside it reaches its own code with ``PYTHONPATH`` pointing at a folder holding a
``headscope`` link to its ``app/``. Anything else would test another tree's code: each test here
fails with what to do (the rest of the suite runs on).
"""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True, scope="session")
def _headscope_is_this_checkout():
    import headscope

    here = Path(headscope.__file__).resolve().parent
    if here != ROOT / "app":
        pytest.fail(
            f"`import headscope` gives {here}, not this checkout's {ROOT / 'app'}: run `pip install -e .` "
            "here, or put a folder holding a `headscope` link to app/ first on PYTHONPATH",
            pytrace=False,
        )
