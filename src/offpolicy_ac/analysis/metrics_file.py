"""The metrics file of a run directory: `metrics.jsonl`, one JSON object per log line.

Each line holds at least `env_steps`, `wall_time_s` and `episode_return` (the mean return
of the episodes finished since the previous line, or null), plus losses and, when the
policy was evaluated, `eval_return`. Values are made JSON-safe by `jsonable`: dataclasses
become objects, NumPy scalars Python numbers, non-finite floats null.

This module is the one place that knows the format: training's logger writes it with
`encode_line`, the statistics and plots read it with `read_metrics` (a line: `decode_line`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib
from typing import Any

import numpy as np

__all__ = [
    "METRICS_FILE",
    "config_jsonable",
    "jsonable",
    "encode_line",
    "decode_line",
    "read_metrics",
]

METRICS_FILE = "metrics.jsonl"
"""The metrics file's name in a run directory."""


def jsonable(x: Any) -> Any:
  """`x` as plain JSON values (dataclasses and dicts to objects, tuples to lists, NumPy
  scalars and 0-d arrays to numbers, NaN and infinities to None, anything else to its `str`)."""
  return _plain(x, lambda v: None)


def config_jsonable(x: Any) -> Any:
  """A config as config.json holds it: `jsonable`, but infinities as the strings "inf" and
  "-inf" (`agents.registry.config_from_dict` reads them back), since an infinite setting means
  something (`max_grad_norm=inf`: no clipping) and a run must load and resume with it."""
  return _plain(x, lambda v: None if math.isnan(v) else str(v))


def _plain(x: Any, non_finite: Any) -> Any:
  """`jsonable`, with `non_finite(v)` for each NaN or infinite float v."""
  if dataclasses.is_dataclass(x) and not isinstance(x, type):
    return {f.name: _plain(getattr(x, f.name), non_finite) for f in dataclasses.fields(x)}
  if isinstance(x, dict):
    return {str(k): _plain(v, non_finite) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [_plain(v, non_finite) for v in x]
  if isinstance(x, (np.floating, np.integer, np.bool_)) or (
      hasattr(x, "__array__") and hasattr(x, "dtype") and np.shape(x) == ()
  ):  # NumPy scalars, 0-d NumPy and JAX arrays
    x = np.asarray(x).item()
  if isinstance(x, float) and not math.isfinite(x):
    return non_finite(x)
  if isinstance(x, (str, int, float, bool)) or x is None:
    return x
  return str(x)


def encode_line(record: dict) -> str:
  """One line of metrics.jsonl (newline included) for an already `jsonable` record."""
  return json.dumps(record) + "\n"


def decode_line(line: str) -> dict:
  """The record of one line of metrics.jsonl.

  Raises:
    json.JSONDecodeError: the line is not valid JSON (a line cut by a kill, or damage).
    ValueError: it is JSON but not a metrics line (an object with a finite number
      `env_steps`).
  """
  record = json.loads(line)
  steps = record.get("env_steps") if isinstance(record, dict) else None
  if isinstance(steps, bool) or not isinstance(steps, (int, float)) or not math.isfinite(steps):
    raise ValueError("not a metrics line (a JSON object with env_steps, a finite number)")
  return record


def read_metrics(run_dir: str | os.PathLike) -> list[dict]:
  """The records of `run_dir`/metrics.jsonl in order ([] if the run has logged none yet);
  `run_dir` may also be the metrics.jsonl file itself.

  A last line cut short by a killed process is skipped, and so are blank lines.

  Raises:
    FileNotFoundError: `run_dir` does not exist.
    ValueError: `run_dir` is the root of a run of several seeds or of a sweep (the message
      names its learners' directories), or not a run directory; a line that is not a
      metrics line (a JSON object with a finite `env_steps`), or one that does not parse
      before the last: the file is damaged.
  """
  path = pathlib.Path(run_dir).expanduser()
  if not path.exists():
    raise FileNotFoundError(f"{path} does not exist")
  path = path if path.is_file() else path / METRICS_FILE
  if not path.exists():
    learners = sorted(
        str(p.parent) for p in (*path.parent.glob(f"seed*/{METRICS_FILE}"),
                                *path.parent.glob(f"*/seed*/{METRICS_FILE}"))
    )  # fmt: skip
    if learners:
      raise ValueError(
          f"{path.parent} holds several learners' runs: read one of them ({', '.join(learners)})"
      )
    if (path.parent / "config.json").exists():
      return []  # a run that has not opened its metrics file yet
    below = sorted(str(p.parent) for p in (*path.parent.glob(f"*/{METRICS_FILE}"),
                                           *path.parent.glob(f"*/*/{METRICS_FILE}")))  # fmt: skip
    runs = f": the runs below it are {', '.join(below[:10])}" if below else ""
    raise ValueError(f"{path.parent} is not a run directory (no config.json or "
                     f"{METRICS_FILE}){runs}{', ...' if len(below) > 10 else ''}")  # fmt: skip
  text = path.read_bytes().decode("utf-8", "replace").splitlines()  # junk: a damaged line
  lines = []
  for number, line in enumerate(text, 1):
    if not line.strip():  # a blank line (an editor's, a `cat` of two files) holds nothing
      continue
    try:
      lines.append(decode_line(line))
    except json.JSONDecodeError:
      if number == len(text):  # a line cut by a kill
        continue
      raise ValueError(f"{path} is damaged: line {number} is not valid JSON") from None
    except ValueError as e:
      raise ValueError(f"{path} line {number} is {e}") from None
  return lines


def read_json(path: str | os.PathLike) -> Any:
  """A run directory's JSON file (config.json, summary.json), refusing one that does not
  parse with a ValueError that names it."""
  try:
    return json.loads(pathlib.Path(path).read_text())
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise ValueError(f"{path} is damaged (not valid JSON: {e})") from e
