"""The notebooks under ``notebooks/`` are stored without outputs and run clean, top to bottom.

Each notebook is executed with nbclient on a kernel that runs this interpreter
(``sys.executable``, so the project as installed in this environment), with a
temporary working directory, the Agg matplotlib backend, and Jupyter's and
IPython's state directories inside the temporary directory. Any cell error
fails the test with the cell's traceback.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

NOTEBOOK_DIR = Path(__file__).resolve().parent.parent / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
KERNEL_NAME = "plog-test"
CELL_TIMEOUT_S = 180


@pytest.fixture(scope="module")
def jupyter_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A kernelspec for this interpreter, and private Jupyter/IPython directories."""
    base = tmp_path_factory.mktemp("jupyter")
    spec_dir = base / "data" / "kernels" / KERNEL_NAME
    spec_dir.mkdir(parents=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": f"plog tests ({sys.executable})",
        "language": "python",
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    return {
        "JUPYTER_PATH": str(base / "data"),
        "JUPYTER_RUNTIME_DIR": str(base / "runtime"),
        "IPYTHONDIR": str(base / "ipython"),
        "MPLBACKEND": "Agg",
    }


def test_there_are_notebooks() -> None:
    assert any(p.name == "inspect_segments.ipynb" for p in NOTEBOOKS)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_is_stored_without_outputs(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [], f"{path.name}: a cell is stored with outputs; clear them first"
            assert cell.execution_count is None, f"{path.name}: a cell is stored with an execution count"


@pytest.fixture(scope="module")
def run_notebook(
    jupyter_dirs: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Callable[[Path], tuple[Any, Path]]:
    """Execute a notebook once per module, in its own temporary directory; returns it with its outputs."""
    done: dict[Path, tuple[Any, Path]] = {}

    def run(path: Path) -> tuple[Any, Path]:
        if path not in done:
            workdir = tmp_path_factory.mktemp(path.stem)
            nb = nbformat.read(path, as_version=4)
            with pytest.MonkeyPatch.context() as patch:
                for name, value in jupyter_dirs.items():
                    patch.setenv(name, value)
                client = nbclient.NotebookClient(
                    nb,
                    kernel_name=KERNEL_NAME,
                    timeout=CELL_TIMEOUT_S,
                    allow_errors=False,
                    resources={"metadata": {"path": str(workdir)}},
                )
                client.execute()  # raises CellExecutionError, with the cell and its traceback, on any error
            done[path] = (nb, workdir)
        return done[path]

    return run


def outputs(nb: Any) -> list[Any]:
    return [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_clean(path: Path, run_notebook: Callable[[Path], tuple[Any, Path]]) -> None:
    nb, workdir = run_notebook(path)
    assert not [o for o in outputs(nb) if o.output_type == "error"]
    stderr = [o.text for o in outputs(nb) if o.output_type == "stream" and o.name == "stderr"]
    assert not any("Traceback" in text for text in stderr), stderr
    # Relative paths resolve in the notebook's working directory: nothing is written into the repository.
    assert not (NOTEBOOK_DIR / "plog-nb-data").exists()


def test_inspect_notebook_shows_tables_and_plots(run_notebook: Callable[[Path], tuple[Any, Path]]) -> None:
    """The inspection notebook's views render as HTML and its plots as PNG images."""
    nb, workdir = run_notebook(NOTEBOOK_DIR / "inspect_segments.ipynb")
    html = [o.data["text/html"] for o in outputs(nb) if "text/html" in o.get("data", {})]
    images = [o for o in outputs(nb) if "image/png" in o.get("data", {})]
    assert any('class="plog-inspect"' in h and "topic clicks" in h for h in html)
    assert any("partition clicks-0" in h for h in html)
    assert any("no problems" in h for h in html)
    assert any("batch checksum" in h for h in html)
    assert len(images) == 3
    assert (workdir / "plog-nb-data" / "topics" / "clicks").is_dir()


def test_inspect_notebook_shows_a_typed_topic(run_notebook: Callable[[Path], tuple[Any, Path]]) -> None:
    """The typed-topic section: a refused send and a refused evolution, the history, a version per segment."""
    nb, workdir = run_notebook(NOTEBOOK_DIR / "inspect_segments.ipynb")
    streams = "".join(o.text for o in outputs(nb) if o.output_type == "stream" and o.name == "stdout")
    assert "refused: topic 'orders' (value schema version 1): field 'amount'" in streams
    assert "refused: the value schema change is refused under BACKWARD" in streams
    html = "".join(o.data["text/html"] for o in outputs(nb) if "text/html" in o.get("data", {}))
    assert "value_schema_version" in html and "value.coupon" in html and "SPRING" in html
    assert (workdir / "plog-nb-typed" / "topics" / "orders").is_dir()
