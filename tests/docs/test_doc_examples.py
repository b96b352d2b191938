"""The README's and the documentation's examples work as written, against a real server.

The examples are the fenced blocks marked ``<!-- test -->`` (scripts/doc_examples.py has the
rules): each file's examples run in order, in a fresh folder holding the sample photos, with
the server's address in place of http://127.0.0.1:8000; an ``<!-- answer -->`` block after one
must match what it prints. A file that needs other server settings names them
(``<!-- examples-env: ... -->``) and gets a server of its own; so does a file whose examples load
models on demand from a local stand-in for the Hugging Face hub (``<!-- examples-hub: ... -->``).
"""

from __future__ import annotations

import sys

import pytest

from helpers.server import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import doc_examples  # noqa: E402

FILES = [f for f in doc_examples.sources() if doc_examples.tested(f)]


def test_the_readme_and_the_rest_page_have_tested_examples():
    names = {f.relative_to(ROOT).as_posix() for f in FILES}
    assert {"README.md", "docs/api.md", "docs/getting-started.md", "docs/cli.md", "docs/survey.md"} <= names
    assert sum(len(doc_examples.tested(f)) for f in FILES) >= 25


@pytest.mark.parametrize("path", doc_examples.sources(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_example_that_names_the_server_is_tested(path):
    assert doc_examples.marking_problems(path) == []


@pytest.mark.examples
@pytest.mark.parametrize("path", FILES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_examples_work_as_written(path, base_url, server_factory, tmp_path):
    env = doc_examples.server_env(path)
    names = doc_examples.hub_models(path)
    with doc_examples.stand_in_hub(names, tmp_path) as hub_env:
        url = server_factory({**env, **hub_env}).url if env or names else base_url
        outcomes = doc_examples.run_file(path, url, tmp_path)
    assert len(outcomes) == len(doc_examples.tested(path))
    problems = [p for o in outcomes for p in o.problems]
    hint = "\n(after a deliberate change, `python scripts/doc_examples.py --write` rewrites the answers shown)"
    assert not problems, "\n".join(problems) + hint


def test_a_wrong_answer_is_caught():
    """The comparison is not vacuous: a changed value, a missing field, a changed list length."""
    shown = doc_examples.trim({"layers": [11], "attention": [[0.25] * 8], "timing_ms": {"queue": 1.0}})
    same = doc_examples.trim({"layers": [11], "attention": [[0.2501] * 8], "timing_ms": {"queue": 7.0}})
    assert doc_examples.compare(shown, same) == []
    assert doc_examples.compare(shown, doc_examples.trim({**same, "layers": [10]}))
    assert doc_examples.compare(shown, doc_examples.trim({"layers": [11], "attention": [[0.25] * 8]}))
    assert doc_examples.compare(shown, doc_examples.trim({**same, "attention": [[0.25] * 9]}))
    assert doc_examples.compare(shown, doc_examples.trim({**same, "attention": [[0.3] * 8]}))
    assert doc_examples.same_text_line("(12, 6, 385, 385) [16, 24]", "(12, 6, 385, 385) [16, 24]")
    assert not doc_examples.same_text_line("[16, 24]", "[16, 25]")
