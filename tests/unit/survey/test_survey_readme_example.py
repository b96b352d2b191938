"""The survey page's examples of reading a survey run, in the environment it says to install (issue 30).

`make serve` installs Headscope's dependencies only, pyarrow among them and pandas not: the page
(docs/survey.md) says to install the `pandas` extra for its pandas examples and gives a pyarrow
one-liner that needs nothing more. Both run here on a real survey.
"""

from __future__ import annotations

import re

import pytest

from headscope.survey.run import survey
from helpers.server import ROOT, SAMPLES

README = (ROOT / "docs" / "survey.md").read_text()
tomllib = pytest.importorskip("tomllib")  # Python 3.11+


@pytest.fixture(scope="module")
def surveyed(tmp_path_factory):
    root = tmp_path_factory.mktemp("readme")
    survey(SAMPLES / "cat.png", root / "survey.parquet", model="random:test_vit", progress=False)
    return root


def test_pandas_is_an_extra_and_the_readme_says_how_to_install_it():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not any(d.startswith("pandas") for d in meta["dependencies"])  # not in what make serve installs
    assert any(d.startswith("pyarrow") for d in meta["dependencies"])
    assert any(d.startswith("pandas") for d in meta["optional-dependencies"]["pandas"])
    block = README.split("import pandas as pd", 1)[0][-700:]
    assert "pip install 'headscope[pandas]'" in block


def test_the_readme_examples_run_on_a_survey(surveyed, monkeypatch):
    monkeypatch.chdir(surveyed)
    block = r"```python\n(import pandas as pd[^\n]*\n\nrows = pd.read_parquet\(\"survey.parquet\"\).*?)```"
    code = re.search(block, README, re.S).group(1)
    scope: dict = {}
    exec(compile(code, "docs/survey.md", "exec"), scope)
    assert len(scope["rows"]) == 6 * 2 and scope["failures"].empty  # test_vit: 6 layers x 2 heads, one picture
    one_liner = re.search(r"`(pyarrow\.parquet\.read_table\([^`]+)`", README).group(1)
    import pyarrow.parquet  # noqa: F401  (what the one-liner names)

    table = eval(one_liner, {"pyarrow": __import__("pyarrow")})
    assert table.num_rows == 12 and "distance_px_mean" in table.column_names
