"""The import graph of app/: no module pair (or longer circle) imports each other, and the layers
point one way (web -> serving -> engine; zoo builds the engine's models; engine knows none of them;
the Python API and the survey use serving, never the HTTP layer; below web nothing imports FastAPI).

Every import counts, wherever it stands: at the top, inside a function, or under TYPE_CHECKING.
"""

from __future__ import annotations

import ast
from pathlib import Path

from helpers.server import ROOT

APP = ROOT / "app"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in APP.rglob("*.py")}


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The app modules ``name`` imports (a package's submodule when ``from pkg import sub``)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] == "app"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "app":
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                out.add(sub if sub in known else target)
    return {m for m in out if m in known and m != name}


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {name: _imports(name, path, set(mods)) for name, path in mods.items()}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_graph_is_read():
    graph = _graph()
    assert (
        "app.engine.block_capture" in graph["app.engine.analysis"]
        or "app.engine.capture_base" in graph["app.engine.analysis"]
    )
    assert "app.serving.preprocess" in graph["app.cli"]  # an import inside a function counts


def test_no_module_pair_imports_each_other():
    graph = _graph()
    pairs = sorted({tuple(sorted((a, b))) for a in graph for b in graph[a] if a in graph[b]})
    assert not pairs, f"modules that import each other: {pairs}"
    assert not _circles(graph), f"import circles: {_circles(graph)}"


def test_the_layers_point_one_way():
    graph = _graph()
    allowed = {
        "app.engine": ("app.engine",),
        # app.outputs writes the files a command makes (the converted model too) and says what a path
        # is (serving's picture files); it imports nothing of app.
        "app.zoo": ("app.zoo", "app.engine", "app.outputs"),
        "app.serving": ("app.serving", "app.engine", "app.zoo", "app.config", "app.outputs"),
    }
    wrong = []
    for name, deps in graph.items():
        for layer, ok in allowed.items():
            if name == layer or name.startswith(layer + "."):
                wrong += [(name, d) for d in deps if not any(d == o or d.startswith(o + ".") for o in ok)]
    assert not wrong, f"imports against the layers: {wrong}"


def test_the_python_api_and_the_survey_never_import_the_http_layer():
    """python/ and survey/ validate with serving's parameter models (app.serving.params), not a router's."""
    graph = _graph()
    wrong = [
        (name, d)
        for name, deps in graph.items()
        if name.startswith(("app.python", "app.survey"))
        for d in deps
        if d == "app.web" or d.startswith("app.web.")
    ]
    assert not wrong, f"imports of the HTTP layer: {wrong}"


def _third_party(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out.add(node.module.split(".")[0])
    return out


def test_only_web_imports_fastapi():
    """Request parameters are plain pydantic below web; the ``Query()`` that places them is the route's."""
    wrong = [
        name
        for name, path in _modules().items()
        if name.startswith(("app.serving", "app.engine", "app.zoo", "app.python", "app.survey"))
        and "fastapi" in _third_party(path)
    ]
    assert not wrong, f"modules below web that import fastapi: {wrong}"
