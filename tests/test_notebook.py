"""The example notebook runs top to bottom (its cells assert what they show)."""

import pathlib

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOK = pathlib.Path(__file__).parents[1] / "notebooks" / "compose_losses.ipynb"


def test_compose_losses_notebook_executes():
  nb = nbformat.read(NOTEBOOK, as_version=4)
  client = nbclient.NotebookClient(
      nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOK.parent)}}
  )
  client.execute()
  outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs]
  assert not [o for o in outputs if o.output_type == "error"]
  text = "".join(o.get("text", "") for o in outputs)
  assert "episode 1 gradients unchanged by episode 2" in text
