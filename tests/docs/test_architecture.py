"""docs/architecture.md stays a map of the whole tree: every module under app/ has a row in its
module table, every file of static/js is named in the page's table, and every row names a file
that exists (a rename or a removal updates the doc, or this fails). CONTRIBUTING's tree of app/
names only modules that exist, and every package."""

from __future__ import annotations

import re

from helpers.server import ROOT

DOC = ROOT / "docs" / "architecture.md"
APP = ROOT / "app"
JS = ROOT / "static" / "js"
NAME = re.compile(r"`([^`\s]+\.py)`")
SCRIPT = re.compile(r"`([^`\s/]+\.js)`")


def _section(text: str, heading: str) -> str:
    """The text under ``heading`` (a ``##`` or ``###`` line) up to the next heading of that level or above."""
    level = heading.split(" ", 1)[0]
    start = text.index(heading + "\n") + len(heading) + 1
    ends = [m.start() for m in re.finditer(rf"^#{{1,{len(level)}}} ", text[start:], re.M)]
    return text[start : start + ends[0]] if ends else text[start:]


def _rows(section: str) -> list[list[str]]:
    """The cells of each table row of ``section`` (the header and its rule left out)."""
    rows = []
    for line in section.splitlines():
        if line.startswith("|") and not line.startswith("|---"):
            # "\|" is a pipe inside a cell, not a cell border.
            rows.append([c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))])
    return rows[1:]


def documented_modules(text: str) -> set[str]:
    """The modules the "Modules" table's first column names, relative to app/. A bare name after a
    path means the same folder (```web/api/models.py`, `health.py``: ``web/api/health.py``)."""
    names: set[str] = set()
    for cells in _rows(_section(text, "## Modules")):
        folder = ""
        for name in NAME.findall(cells[0]):
            name = name.removeprefix("app/")
            if "/" in name:
                folder = name.rpartition("/")[0]
            else:
                name = f"{folder}/{name}" if folder else name
            names.add(name)
    return names


def documented_scripts(text: str) -> set[str]:
    """The files of static/js the page's module table names, in either column."""
    rows = _rows(_section(text, "## The page (`static/js/`)"))
    return {name for cells in rows for cell in cells for name in SCRIPT.findall(cell)}


def app_modules() -> set[str]:
    """Every module of app/, relative to it; a package's ``__init__.py`` only at the top (the
    others are a folder's heading row, ``**web/**``, and hold nothing)."""
    return {p.relative_to(APP).as_posix() for p in APP.rglob("*.py") if p.name != "__init__.py" or p.parent == APP}


def test_every_module_under_app_has_a_row():
    missing = sorted(app_modules() - documented_modules(DOC.read_text()))
    assert not missing, f"modules without a row in docs/architecture.md's Modules table: {missing}"


def test_every_row_names_a_module_that_exists():
    gone = sorted(documented_modules(DOC.read_text()) - app_modules())
    assert not gone, f"rows of docs/architecture.md naming modules that do not exist: {gone}"


def test_every_script_of_the_page_is_named():
    text = DOC.read_text()
    scripts = {p.name for p in JS.glob("*.js")}
    missing = sorted(scripts - documented_scripts(text))
    assert not missing, f"static/js files not named in docs/architecture.md's page table: {missing}"
    gone = sorted(documented_scripts(text) - scripts)
    assert not gone, f"docs/architecture.md's page table names files static/js does not have: {gone}"


def test_the_packages_are_headings_of_the_table():
    text = _section(DOC.read_text(), "## Modules")
    packages = sorted(p.parent.relative_to(APP).as_posix() for p in APP.glob("*/__init__.py"))
    missing = [p for p in packages if f"**{p}/**" not in text]
    assert not missing, f"packages without a heading row in docs/architecture.md: {missing}"


def contributing_tree() -> dict[str, set[str]]:
    """CONTRIBUTING.md's tree of app/: each package (``web``, ``serving``, ...) and the ``*.py``
    names its lines hold (``cli.py``, ``config.py`` at the top are under ``""``)."""
    text = (ROOT / "CONTRIBUTING.md").read_text()
    block = text[text.index("The repository, top level:") :]
    block = block[block.index("```\n") + 4 :]
    block = block[: block.index("```")]
    tree: dict[str, set[str]] = {}
    package = None
    for line in block.splitlines():
        top = re.match(r"^(\S+)", line)
        if top:  # a top-level folder: app/ opens the tree, anything else ends it
            package = "" if top.group(1) == "app/" else None
            continue
        sub = re.match(r"^  (\w+)/", line)
        if package is not None and sub:
            package = sub.group(1)
        elif package is not None and re.match(r"^  \w+\.py", line):
            package = ""
        if package is not None:
            tree.setdefault(package, set()).update(re.findall(r"\b(\w+\.py)\b", line))
    return tree


def test_contributings_tree_names_what_exists():
    tree = contributing_tree()
    packages = {p.parent.name for p in APP.glob("*/__init__.py")}
    assert packages <= set(tree), f"packages missing from CONTRIBUTING.md's tree: {sorted(packages - set(tree))}"
    gone = sorted(
        f"{pkg}/{name}" if pkg else name
        for pkg, names in tree.items()
        for name in names
        if not list((APP / pkg).rglob(name)) and name != "__init__.py"
    )
    assert not gone, f"CONTRIBUTING.md's tree names modules that do not exist: {gone}"


def test_a_bare_name_belongs_to_the_folder_before_it():
    text = "## Modules\n\n| module | what |\n|---|---|\n| `web/api/models.py`, `health.py` | x |\n| `cli.py` | y |\n"
    assert documented_modules(text) == {"web/api/models.py", "web/api/health.py", "cli.py"}
