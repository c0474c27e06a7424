"""notebooks/acceptance.ipynb runs top to bottom on the recorded results and writes its figures."""

from __future__ import annotations

import os

import nbformat
from nbclient import NotebookClient

from .helpers import REPO


def test_acceptance_notebook_executes_and_writes_figures(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHTREE_RESULTS", str(REPO / "notebooks" / "data"))
    monkeypatch.setenv("FLASHTREE_FIGURES", str(tmp_path / "figures"))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    nb = nbformat.read(REPO / "notebooks" / "acceptance.ipynb", as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(REPO / "notebooks")}}).execute()
    written = {p.name for p in (tmp_path / "figures").rglob("*.png")}
    assert {"tau_heatmap.png", "tau_lines.png", "accept_per_depth.png", "gain_over_chain.png"} <= written
    images = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert len(images) >= 4
