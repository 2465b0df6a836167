"""Executes the example notebooks and saves them with their outputs.

    python notebooks/execute.py                    # every notebook in notebooks/
    python notebooks/execute.py train_from_python  # only these (names, with or without .ipynb)

Each notebook runs top to bottom in a fresh `python3` kernel, in this folder, and is written
back in place with its outputs (figures included) when, and only when, no cell failed. The
documentation site shows the saved outputs without running anything, and
`tests/test_notebook.py` checks that every committed notebook carries them.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

import nbclient
import nbformat

HERE = pathlib.Path(__file__).resolve().parent
TIMEOUT_S = 600


def notebook_paths(names: list[str] | None = None) -> list[pathlib.Path]:
  """The notebooks called `names` (default: all of them), in name order."""
  if not names:
    return sorted(HERE.glob("*.ipynb"))
  paths = [HERE / (name if name.endswith(".ipynb") else f"{name}.ipynb") for name in names]
  missing = [str(p) for p in paths if not p.exists()]
  if missing:
    raise ValueError(f"no such notebook: {missing}")
  return paths


def execute(path: pathlib.Path, timeout: int = TIMEOUT_S) -> nbformat.NotebookNode:
  """Runs the notebook at `path` in a fresh kernel; returns it with its outputs.

  Raises `nbclient.exceptions.CellExecutionError` at the first failing cell.
  """
  nb = nbformat.read(path, as_version=4)
  client = nbclient.NotebookClient(
      nb,
      timeout=timeout,
      kernel_name="python3",
      record_timing=False,  # no timestamps: re-running changes only what the cells print
      resources={"metadata": {"path": str(path.parent)}},
  )
  client.execute()
  return nb


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("names", nargs="*", help="notebooks to run (default: all)")
  parser.add_argument("--timeout", type=int, default=TIMEOUT_S, help="seconds per cell")
  args = parser.parse_args(argv)
  for path in notebook_paths(args.names):
    start = time.monotonic()
    nb = execute(path, args.timeout)
    nbformat.write(nb, path)
    print(f"{path.name}: executed in {time.monotonic() - start:.0f} s and saved", flush=True)


if __name__ == "__main__":
  main(sys.argv[1:])
