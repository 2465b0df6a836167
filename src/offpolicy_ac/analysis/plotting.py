"""Learning curves from metrics.jsonl: one run, several overlaid (mean and spread), or
the IQM curves of groups of runs with their bootstrap intervals (`analysis.statistics`)."""

from __future__ import annotations

import os
import pathlib
from typing import TYPE_CHECKING
from typing import Sequence

import numpy as np

from offpolicy_ac.analysis.metrics_file import read_metrics

if TYPE_CHECKING:
  from offpolicy_ac.analysis.statistics import GroupCurve


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
  a min-max band over the runs (interpolated onto a common step grid, over the steps every
  run covers; runs that share no step are drawn one by one). `out`'s folder is created.

  Raises:
    ValueError: no run directory, `out` is not a .png file, `labels` are not one per run,
      or a run directory does not exist or is not one (a run without metrics yet is an
      empty curve).
  """
  if isinstance(run_dirs, (str, os.PathLike)) or not run_dirs:
    raise ValueError(f"plot_runs needs a sequence of run directories, got {run_dirs!r}")
  run_dirs = [pathlib.Path(d).expanduser() for d in run_dirs]
  out = pathlib.Path(out).expanduser()
  if out.suffix.lower() != ".png":
    raise ValueError(f"plot_runs writes PNG files: {out} does not end in .png")
  if labels is not None and len(labels) != len(run_dirs):
    raise ValueError(f"need one label per run: {len(labels)} labels, {len(run_dirs)} runs")
  missing = [str(d) for d in run_dirs if not d.is_dir()]
  if missing:
    raise ValueError(f"no such run directory: {', '.join(missing)}")
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
      # Where every run has a value: no flat start before a run's first point.
      start, end = max(s[0][0] for s in series), min(s[0][-1] for s in series)
      if start <= end:
        grid = np.linspace(start, end, 200)
        ys = np.stack([np.interp(grid, x, y) for x, y in series])
        (line,) = ax.plot(grid, ys.mean(0), label=f"{key} (mean of {len(series)})",
                          marker="o" if start == end else None)  # fmt: skip
        ax.fill_between(grid, ys.min(0), ys.max(0), alpha=0.2, color=line.get_color())
        continue
      series = [_series(r, key) for r in runs]  # no common step: each run on its own
    for i, (x, y) in enumerate(series):
      if x.size:
        label = labels[i] if labels else pathlib.Path(run_dirs[i]).name
        ax.plot(x, y, label=f"{label}: {key}", lw=1.2 if key == "episode_return" else 2,
                marker="o" if x.size == 1 else None)  # fmt: skip
  ax.set_xlabel("environment steps")
  ax.set_ylabel("return")
  ax.set_title(title)
  ax.grid(alpha=0.3)
  if keys:  # below the axes, where it covers no curve
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)
  fig.tight_layout()
  return _save(fig, out)


def _save(fig, out: pathlib.Path) -> pathlib.Path:
  """Writes the figure next to `out`, then renames it onto `out` (never a partial PNG)."""
  out.parent.mkdir(parents=True, exist_ok=True)
  tmp = out.with_suffix(".tmp.png")
  fig.savefig(tmp, dpi=100)
  os.replace(tmp, out)
  return out


METRIC_NAMES = {"eval_return": "evaluation return", "episode_return": "training return"}


def plot_group_curves(
    curves: Sequence["GroupCurve"], labels: Sequence[str], out_dir: str | os.PathLike
) -> list[pathlib.Path]:
  """One figure per environment, `out_dir`/<env_id>.png, with a line per group: the IQM
  over its seeds against env steps and a band for its confidence interval.

  Args:
    curves: from `statistics.group_curve`.
    labels: one per curve (`statistics.group_labels`); the legend adds the seed count.
    out_dir: created if missing.

  Returns:
    The PNG paths, in the order the environments first appear.
  """
  # A bare Figure draws with Agg without pyplot: the process's matplotlib backend (a
  # notebook's inline one, say) is left as it was.
  from matplotlib.figure import Figure

  if len(labels) != len(curves):
    raise ValueError(f"need one label per curve ({len(curves)}), got {len(labels)}")
  out_dir = pathlib.Path(out_dir).expanduser()
  out_dir.mkdir(parents=True, exist_ok=True)
  envs = list(dict.fromkeys(c.group.env_id for c in curves))
  paths = []
  for env_id in envs:
    fig = Figure(figsize=(7, 4.2))
    ax = fig.subplots()
    mine = [(c, lab) for c, lab in zip(curves, labels) if c.group.env_id == env_id]
    metrics = {c.metric for c, _ in mine}
    for c, label in mine:
      n = len(c.group.runs)
      suffix = f" ({METRIC_NAMES.get(c.metric, c.metric)})" if len(metrics) > 1 else ""
      (line,) = ax.plot(c.env_steps, c.iqm, label=f"{label}{suffix}, {n} seed{'s' * (n > 1)}",
                        marker="o" if len(c.env_steps) == 1 else None)  # fmt: skip
      ax.fill_between(c.env_steps, c.lower, c.upper, alpha=0.2, color=line.get_color())
    ax.set_xlabel("environment steps")
    ylabel = " / ".join(METRIC_NAMES.get(m, m) for m in sorted(metrics))
    ax.set_ylabel(f"{ylabel}: IQM, 95% CI")
    ax.set_title(env_id)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in env_id)
    paths.append(_save(fig, out_dir / f"{safe}.png"))
  return paths
