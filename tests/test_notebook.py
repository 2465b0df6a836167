"""The example notebooks run top to bottom (their cells assert what they show), and the
committed notebooks carry their outputs (the documentation shows them without running)."""

import copy
import importlib.util
import pathlib

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = pathlib.Path(__file__).parents[1] / "notebooks"

# Lines each notebook prints once its assertions passed.
KEY_LINES = {
    "compose_losses": ["episode 1 gradients unchanged by episode 2"],
    "train_from_python": [
        "update is pure: the same inputs give the same new state",
        "target reached at: ",
        "greedy policy: mean return",
    ],
    "truncation_vs_termination": [
        "bootstrap at truncation: |mean target error| <=",
        "time limit as termination: matches the exact bias within",
        "fitted values: RMS error",
    ],
}
# Notebooks whose saved outputs must include figures.
WITH_FIGURES = ("train_from_python", "truncation_vs_termination")


def _code_cells(nb):
  return [cell for cell in nb.cells if cell.cell_type == "code"]


def _text(nb) -> str:
  return "".join(o.get("text", "") for cell in _code_cells(nb) for o in cell.outputs)


def _errors(nb) -> list:
  return [o for cell in _code_cells(nb) for o in cell.outputs if o.output_type == "error"]


def _execute_script():
  """notebooks/execute.py as a module: the tests run notebooks the way it does."""
  spec = importlib.util.spec_from_file_location("notebooks_execute", NOTEBOOKS / "execute.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _read(name):
  return nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)


def test_every_notebook_is_listed():
  assert sorted(p.stem for p in NOTEBOOKS.glob("*.ipynb")) == sorted(KEY_LINES)


def saved_output_problems(nb) -> list[str]:
  """Why a notebook does not carry the outputs of one top-to-bottom run ([] if it does)."""
  cells = _code_cells(nb)
  counts = [cell.execution_count for cell in cells]
  problems = []
  if counts != list(range(1, len(cells) + 1)):
    problems.append(f"execution counts {counts}, expected 1..{len(cells)} in order")
  if _errors(nb):
    problems.append("a cell's saved output is an error")
  return problems


@pytest.mark.parametrize("name", sorted(KEY_LINES))
def test_committed_notebook_has_its_outputs(name):
  nb = _read(name)
  assert not saved_output_problems(nb), (
      f"{name}.ipynb: {saved_output_problems(nb)}; run `python notebooks/execute.py {name}` "
      "and commit the result"
  )
  text = _text(nb)
  for line in KEY_LINES[name]:
    assert line in text, f"{name}.ipynb's saved outputs lack {line!r}"
  figures = [o for c in _code_cells(nb) for o in c.outputs if "image/png" in o.get("data", {})]
  assert bool(figures) == (name in WITH_FIGURES)


def test_saved_output_check_catches_a_notebook_without_outputs():
  nb = _read("compose_losses")
  assert not saved_output_problems(nb)
  stripped = copy.deepcopy(nb)
  for cell in _code_cells(stripped):
    cell.execution_count, cell.outputs = None, []
  assert saved_output_problems(stripped)
  reordered = copy.deepcopy(nb)
  cells = _code_cells(reordered)
  cells[0].execution_count, cells[1].execution_count = 2, 1
  assert saved_output_problems(reordered)


@pytest.mark.parametrize("name", sorted(KEY_LINES))
def test_notebook_executes(name):  # about 10-30 s each on one core
  nb = _execute_script().execute(NOTEBOOKS / f"{name}.ipynb", timeout=300)
  assert not _errors(nb) and not saved_output_problems(nb)
  text = _text(nb)
  for line in KEY_LINES[name]:
    assert line in text
