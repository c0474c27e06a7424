"""notebooks/acceptance.ipynb runs top to bottom with papermill-style parameters and writes its figures next to the
sweep it reads."""

from __future__ import annotations

import os
import shutil

import nbformat
from nbclient import NotebookClient

from .helpers import REPO


def inject(nb, **values):
    """What papermill does: a cell after the one tagged `parameters` that sets the given values."""
    (at,) = [i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", [])]
    cell = nbformat.v4.new_code_cell("\n".join(f"{k} = {v!r}" for k, v in values.items()))
    cell.metadata["tags"] = ["injected-parameters"]
    nb.cells.insert(at + 1, cell)


def test_acceptance_notebook_takes_parameters_and_writes_figures_next_to_its_sweep(tmp_path, monkeypatch):
    sweep = tmp_path / "multirun" / "some-sweep"
    sweep.mkdir(parents=True)
    shutil.copy(REPO / "notebooks" / "data" / "summary.parquet", sweep / "summary.parquet")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    nb = nbformat.read(REPO / "notebooks" / "acceptance.ipynb", as_version=4)
    inject(nb, results=str(sweep))
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(REPO / "notebooks")}}).execute()
    written = {p.name for p in (sweep / "figures").rglob("*")}
    for name in ("tau_heatmap", "tau_lines", "accept_per_depth", "gain_over_chain"):
        assert {f"{name}.png", f"{name}.pdf"} <= written
    assert not (REPO / "notebooks" / "figures").exists()
    images = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert len(images) >= 4
