"""The documentation site builds offline with no warnings, and its generated parts come from
their sources: the benchmark's tables from the bench's JSON, the root files with their links
rebased."""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.server import ROOT

DOCS = ROOT / "docs"


def hook(name: str):
    spec = importlib.util.spec_from_file_location(f"docs_hook_{name}", DOCS / "hooks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    out = tmp_path_factory.mktemp("site")
    # Offline: where this user may make a network namespace (root on Linux), the build runs in one
    # with no network at all.
    offline = shutil.which("unshare") and subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode == 0
    p = subprocess.run(
        [
            *(["unshare", "-n"] if offline else []),
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--site-dir",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert p.returncode == 0, f"mkdocs build --strict failed:\n{p.stdout}\n{p.stderr}"
    assert "WARNING" not in p.stderr, p.stderr
    return out


def test_every_page_of_the_nav_is_built_and_loads_nothing_from_another_host(site):
    pages = sorted(site.rglob("*.html"))
    assert len(pages) >= 18
    for page in pages:
        html = page.read_text(encoding="utf-8")
        # scripts, styles and fonts: all from the site itself (the build has font: false)
        outside = re.findall(r"<(?:script|link)[^>]+(?:src|href)=\"(https?:)?//[^\"]+\"", html)
        assert not outside, (page, outside)
        assert "fonts.googleapis" not in html and "fonts.gstatic" not in html, page
    for name in (
        "getting-started",
        "page",
        "api",
        "cli",
        "survey",
        "models",
        "swin",
        "analytics",
        "inside-a-head",
        "ablation",
        "settings",
        "images",
        "performance",
        "bench",
        "limits",
        "docker",
        "architecture",
        "contributing",
    ):
        assert (site / name / "index.html").is_file(), name


def test_the_root_files_are_pages_with_their_links_rebased(site):
    home = (site / "index.html").read_text(encoding="utf-8")
    assert "make serve" in home and 'src="screenshot.png"' in home
    assert 'href="getting-started/"' in home and 'href="contributing/"' in home
    contributing = (site / "contributing" / "index.html").read_text(encoding="utf-8")
    assert "Where things go" in contributing and 'href="../architecture/"' in contributing
    rf = hook("root_files")
    assert rf.include_root("<!-- include-root: CONTRIBUTING.md -->\n").startswith("# Contributing")
    assert rf._rewrite("[a](docs/api.md#errors) [b](CONTRIBUTING.md) [c](pyproject.toml)", rf.rebase_root_link) == (
        "[a](api.md#errors) [b](contributing.md) c"
    )


def test_the_benchmark_tables_are_generated_from_the_json(site):
    runs = sorted((DOCS / "bench").glob("*.json"))
    assert runs, "no benchmark run under docs/bench/"
    bench = hook("bench")
    page = (DOCS / "performance.md").read_text(encoding="utf-8")
    named = bench.DIRECTIVE.findall(page)
    assert named and all((DOCS / n).is_file() for n in named)
    results = json.loads((DOCS / named[0]).read_text(encoding="utf-8"))
    md = bench.render(results, "bench/run.json")
    fwd = results["inproc"]["1"]["fwd_fp32"]["ips"]["median"]
    assert f"| {fwd:.2f} |" in md  # the figure in the table is the JSON's
    assert results["meta"]["date"] in md and "python -m bench.run" in md
    changed = copy.deepcopy(results)
    changed["inproc"]["1"]["fwd_fp32"]["ips"]["median"] = 1234.5
    assert "| 1234.50 |" in bench.render(changed, "bench/run.json")
    html = (site / "performance" / "index.html").read_text(encoding="utf-8")
    assert f"{fwd:.2f}" in html and "<!-- bench-tables:" not in html


def test_the_sidebar_title_is_left_out_on_a_wide_screen(site):
    # the header names the site; the sidebar's own "Headscope" crowded "Home" below it (#41)
    html = (site / "index.html").read_text(encoding="utf-8")
    assert 'href="stylesheets/extra.css"' in html
    css = (site / "stylesheets" / "extra.css").read_text(encoding="utf-8")
    assert ".md-nav--primary > .md-nav__title { display: none; }" in css and "min-width: 76.25em" in css
