"""Learning curves from metrics.jsonl: one run, or several overlaid (mean and spread)."""

from __future__ import annotations

import os
import pathlib
from typing import Sequence

import numpy as np

from offpolicy_ac.training.metrics_io import read_metrics


def _series(records: list[dict], key: str) -> tuple[np.ndarray, np.ndarray]:
  pts = [(r["env_steps"], r[key]) for r in records if r.get(key) is not None]
  if not pts:
    return np.zeros((0,)), np.zeros((0,))
  x, y = zip(*pts)
  return np.asarray(x, float), np.asarray(y, float)


def plot_runs(
    run_dirs: Sequence[str | os.PathLike],
    out: str | os.PathLike,
    *,
    title: str = "",
    labels: Sequence[str] | None = None,
    group: bool = False,
) -> pathlib.Path:
  """Plots episode_return (and eval_return) against env steps.

  With `group=True`, runs are seeds of one configuration: the mean is drawn with
  a min-max band over the runs (interpolated onto a common step grid).
  """
  # A bare Figure draws with Agg without pyplot: the process's matplotlib backend (a
  # notebook's inline one, say) is left as it was.
  from matplotlib.figure import Figure

  fig = Figure(figsize=(7, 4.2))
  ax = fig.subplots()
  runs = [read_metrics(d) for d in run_dirs]
  keys = [k for k in ("episode_return", "eval_return") if any(_series(r, k)[0].size for r in runs)]
  for key in keys:
    series = [_series(r, key) for r in runs]
    if group:
      series = [s for s in series if s[0].size]
      if not series:
        continue
      end = min(s[0][-1] for s in series)
      grid = np.linspace(0, end, 200)
      ys = np.stack([np.interp(grid, x, y) for x, y in series])
      (line,) = ax.plot(grid, ys.mean(0), label=f"{key} (mean of {len(series)})")
      ax.fill_between(grid, ys.min(0), ys.max(0), alpha=0.2, color=line.get_color())
    else:
      for i, (x, y) in enumerate(series):
        label = labels[i] if labels else pathlib.Path(run_dirs[i]).name
        ax.plot(x, y, label=f"{label}: {key}", lw=1.2 if key == "episode_return" else 2)
  ax.set_xlabel("environment steps")
  ax.set_ylabel("return")
  ax.set_title(title)
  ax.grid(alpha=0.3)
  if keys:
    ax.legend(fontsize=8)
  fig.tight_layout()
  out = pathlib.Path(out)
  tmp = out.with_suffix(".tmp.png")
  fig.savefig(tmp, dpi=100)
  os.replace(tmp, out)
  return out
