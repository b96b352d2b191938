"""examples/quickstart.ipynb runs end to end on a real ipykernel (nbclient); its cells assert
what they show, so a cell that fails fails the test with its traceback."""

from __future__ import annotations

import nbformat
import pytest
from nbclient import NotebookClient

from helpers.server import ROOT

NOTEBOOK = ROOT / "examples" / "quickstart.ipynb"
pytestmark = pytest.mark.timeout(900)


@pytest.mark.examples  # a kernel and every cell: `make test-long`
def test_the_quickstart_notebook_runs(tmp_path):
    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert not any(c.get("outputs") for c in nb.cells if c.cell_type == "code"), "commit it without outputs"
    # The kernel runs in a scratch folder (the figures land there) and inherits this environment,
    # so `import headscope` there is the code under test.
    client = NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "\n".join(str(o.get("data", {}).get("text/plain", "")) for o in outputs)
    assert "<headscope.Scope 'dinov2-s14-focus'" in text and "torch.Size([12, 6, 1, 385])" in text
    assert {p.name for p in tmp_path.iterdir()} >= {"head.svg", "head.pdf", "head.png", "heads.pdf"}


def test_the_python_page_shows_the_notebooks_code():
    """docs/python.md's Quickstart is the notebook's code, cell by cell, in order."""
    import re

    page = (ROOT / "docs" / "python.md").read_text(encoding="utf-8")
    quick = page.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    shown = [b.strip() for b in re.findall(r"```python\n(.*?)```", quick, re.S)]
    nb = nbformat.read(NOTEBOOK, as_version=4)
    cells = [c.source.strip() for c in nb.cells if c.cell_type == "code"]
    assert shown == cells
