"""MkDocs hook: the repository's root Markdown files as pages, with their links rebased.

README.md and CONTRIBUTING.md live at the repository root, where GitHub shows them, and link to
``docs/architecture.md`` or ``CONTRIBUTING.md`` from there. A page that holds only the line
``<!-- include-root: CONTRIBUTING.md -->`` gets that file's text, its links rewritten to be
relative to docs/ (``docs/x.md`` -> ``x.md``, ``CONTRIBUTING.md`` -> ``contributing.md``), so
``mkdocs build --strict`` checks them like any other link; a link to another file of the
repository (``static/samples/CREDITS.md``) becomes its plain text. Pages under docs/ that link
to the root files (``../CONTRIBUTING.md``) are rewritten the same way.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
INCLUDE = re.compile(r"^<!-- include-root: ([A-Za-z0-9_.-]+\.md) -->[ \t]*$", re.M)
# [text](target) of inline links and images; targets with a scheme or an anchor only are left alone.
LINK = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s#]+)(#[^)\s]*)?(\s+\"[^\"]*\")?\)")
# The root files that are pages of the site, by their page.
ROOT_PAGES = {"README.md": "index.md", "CONTRIBUTING.md": "contributing.md"}


def rebase_root_link(target: str) -> str | None:
    """A link written from the repository root, as seen from docs/; None for a file of the
    repository that is no page of the site (its link becomes plain text)."""
    if "://" in target or target.startswith(("mailto:", "/")):
        return target
    if target.startswith("docs/"):
        return target[len("docs/") :]
    if target in ROOT_PAGES:
        return ROOT_PAGES[target]
    return None if (ROOT / target).exists() else target


def rebase_docs_link(target: str) -> str | None:
    """A link written from docs/ to a root file that is also a page."""
    if target.startswith("../") and target[3:] in ROOT_PAGES:
        return ROOT_PAGES[target[3:]]
    return target


def _rewrite(markdown: str, fn) -> str:
    def sub(m: re.Match) -> str:
        bang, text, target, anchor, title = m.groups()
        new = fn(target)
        if new is None:
            return text
        return f"{bang}[{text}]({new}{anchor or ''}{title or ''})"

    return LINK.sub(sub, markdown)


def include_root(markdown: str) -> str:
    """Replace every include line by the root file's text, links rebased."""

    def sub(m: re.Match) -> str:
        path = ROOT / m.group(1)
        if not path.is_file():
            raise FileNotFoundError(f"docs: {m.group(0)!r} names {path}, which does not exist")
        return _rewrite(path.read_text(encoding="utf-8"), rebase_root_link)

    return INCLUDE.sub(sub, markdown)


def on_page_markdown(markdown: str, page, config, files) -> str:
    return _rewrite(include_root(markdown), rebase_docs_link)
