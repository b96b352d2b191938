"""The page's ES modules as one module: what anywidget and a standalone HTML file take.

anywidget loads a widget's front end from one ES module text (no files beside it to import), and
a file opened from disk cannot import its neighbours either. Rather than keep a second copy of
the drawing code, :func:`assemble` puts the page's own modules under ``static/js/`` together at
import time: each module becomes a function scope whose exports are an object, and its
``import { a, b as c } from "./x.js"`` lines become ``const { a, b: c } = <x's object>``. Only
what the entry module reaches is included, in dependency order.
"""

from __future__ import annotations

import functools
import re

from ..paths import asset_dir

_IMPORT = re.compile(r'^import\s*\{([^}]*)\}\s*from\s*"\./([\w.-]+)\.js";?[ \t]*$', re.M)
_EXPORT = re.compile(r"^export\s+(?:async\s+)?(?:function\*?|const|let|class)\s+([\w$]+)", re.M)
_OTHER = re.compile(r"^\s*(import\b(?!\s*\()|export\s+(default|\{|\*))", re.M)


class AssembleError(RuntimeError):
    """A module uses a form of ``import`` / ``export`` that :func:`assemble` does not handle."""


def _var(name: str) -> str:
    return "__hs_" + re.sub(r"\W", "_", name)


def _module(name: str) -> tuple[str, list[str]]:
    """Module ``name``'s code as a scope assigning its exports to ``__hs_NAME``, and its imports."""
    text = (asset_dir("static") / "js" / f"{name}.js").read_text(encoding="utf-8")
    deps: list[str] = []

    def imported(m: re.Match[str]) -> str:
        names = [n.strip() for n in m.group(1).split(",") if n.strip()]
        deps.append(m.group(2))
        pairs = ", ".join(n.replace(" as ", ": ") for n in names)
        return f"const {{ {pairs} }} = {_var(m.group(2))};"

    body = _IMPORT.sub(imported, text)
    exports = _EXPORT.findall(body)
    body = re.sub(r"^export\s+", "", body, flags=re.M)
    if _OTHER.search(body):
        raise AssembleError(f"static/js/{name}.js: an import or export form the widget's assembly cannot read")
    head = f"// ---- static/js/{name}.js\nconst {_var(name)} = (() => {{\n"
    code = f"{head}{body}\nreturn {{ {', '.join(exports)} }};\n}})();\n"
    return code, deps


@functools.cache
def assemble(entry: str) -> str:
    """The module ``static/js/ENTRY.js`` and everything it imports, as one script text whose
    last statement leaves the entry's exports in ``__hs_ENTRY`` (no ``export`` of its own: the
    caller adds what its host needs)."""
    done: dict[str, str] = {}
    visiting: set[str] = set()

    def visit(name: str) -> None:
        if name in done:
            return
        if name in visiting:
            raise AssembleError(f"static/js/{name}.js: an import cycle")
        visiting.add(name)
        code, deps = _module(name)
        for d in deps:
            visit(d)
        done[name] = code
        visiting.discard(name)

    visit(entry)
    return "".join(done.values())


def entry_var(entry: str) -> str:
    """The name :func:`assemble` gives the entry module's exports."""
    return _var(entry)
