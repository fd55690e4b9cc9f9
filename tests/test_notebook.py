"""notebooks/quickstart.ipynb runs headless from top to bottom."""
import os

import nbformat
import pytest
from nbclient import NotebookClient

from conftest import REPO

pytestmark = pytest.mark.e2e


def test_quickstart_notebook_runs(tmp_path):
    nb = nbformat.read(os.path.join(REPO, "notebooks", "quickstart.ipynb"), as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": REPO}}).execute()
    text = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                     for o in c.get("outputs", []))
    assert "layer 0: cosine of the two 'bank's = 1.000" in text
    assert "learned layer weights:" in text and "plotted 3 layer weights" in text
    assert not any(o.get("output_type") == "error" for c in nb.cells if c.cell_type == "code"
                   for o in c.get("outputs", []))
