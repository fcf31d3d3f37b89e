"""Every notebook under notebooks/ runs top to bottom, headless, on a CPU-only machine."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))


def test_the_notebooks_are_there() -> None:
    names = {path.stem for path in NOTEBOOKS}
    assert "quickstart" in names
    assert {"01_affine_decomposition", "02_scan_trees", "03_mlir_lowering", "04_gpu_benchmark",
            "05_selective_scan"} <= names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_committed_notebook_has_no_outputs(path: Path) -> None:
    notebook = nbformat.read(path, as_version=4)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [], f"{path.name}: a cell keeps its outputs"
            assert cell.execution_count is None, f"{path.name}: a cell keeps its count"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_every_cell_has_its_own_id(path: Path) -> None:
    """nbformat 4.5 cells carry ids (read as the file has them: nbformat adds missing ones
    with a warning that is to become an error)."""
    raw = json.loads(path.read_text(encoding="utf-8"))
    ids = [cell.get("id") for cell in raw["cells"]]
    assert None not in ids, f"{path.name}: cell {ids.index(None)} has no id"
    assert len(set(ids)) == len(ids), f"{path.name}: ids repeat"


@pytest.mark.timeout(900)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_top_to_bottom(path: Path, tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    notebook = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    errors = [output for cell in notebook.cells if cell.cell_type == "code"
              for output in cell.outputs if output.output_type == "error"]
    assert not errors, f"{path.name}: {errors[0].ename}: {errors[0].evalue}"
    # every code cell ran and produced something or ran silently; the last one has an output
    code_cells = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert all(cell.execution_count is not None for cell in code_cells)
    assert code_cells[-1].outputs, f"{path.name}: the last cell shows nothing"
