"""Learning curves across seeds: IQM with 95% stratified-bootstrap intervals, per config.

    python experiments/plot.py runs/                       # every run below runs/
    python experiments/plot.py runs/impala-* runs/acer-* --out-dir plots

Runs whose configurations differ only in the seed (and in fields that do not change
what is learned: `statistics.IGNORED_FIELDS`) are pooled into one group. Writes one
figure per environment, <out-dir>/<env_id>.png, with one line per group, and prints a
table of the groups' final IQM and interval. See docs/statistics.md.
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Optional
import warnings

import tyro

from offpolicy_ac.analysis import plotting
from offpolicy_ac.analysis import statistics
from offpolicy_ac.cli import check_output_file
from offpolicy_ac.cli import check_paths_given
from offpolicy_ac.cli import parse_plain
from offpolicy_ac.cli import script_main
from offpolicy_ac.training.rundir import enclosing_run


@dataclasses.dataclass(frozen=True)
class Args:
  paths: tyro.conf.Positional[tuple[str, ...]]
  """Run directories, or directories to search for them (e.g. runs/)."""
  out_dir: str = "plots"
  """Where the figures go (<out-dir>/<env_id>.png)."""
  metric: Optional[str] = None
  """metrics.jsonl key to plot (default: eval_return when every run of a group logged
  one, else episode_return)."""
  reps: int = 2000
  """Bootstrap replications."""
  max_points: int = 200
  """Steps per curve when runs must be interpolated onto a common grid."""
  seed: int = 0
  """Seeds the bootstrap."""


def main(args: Args) -> list[statistics.GroupCurve]:
  if not 40 <= args.reps <= 100_000 or args.max_points < 2 or not 0 <= args.seed < 2**32:
    raise ValueError(f"need --reps in [40, 100,000] (95% intervals), --max-points >= 2 and "
                     f"--seed in [0, 2**32), got {args.reps}, {args.max_points} and "
                     f"{args.seed}")  # fmt: skip
  if not args.paths:
    raise ValueError("give the run directories, or directories to search for them (runs/)")
  for path in args.paths:
    check_paths_given({"a run directory given": path})
  check_paths_given({"--out-dir": args.out_dir})
  check_output_file("--out-dir", pathlib.Path(args.out_dir) / "<env_id>.png")
  run = enclosing_run(pathlib.Path(args.out_dir).expanduser() / "<env_id>.png")
  if run is not None and pathlib.Path(args.out_dir).expanduser().resolve() != run:
    raise ValueError(f"--out-dir {args.out_dir} is in a folder of the run in {run} (a --resume "
                     "rebuilds some of them): give a directory outside it")  # fmt: skip
  found, runs = statistics.find_runs(args.paths), []
  for run_dir in found:
    try:
      runs.append(statistics.run_info(run_dir))
    except ValueError as e:  # a damaged config.json: the other runs are drawn
      if len(found) == 1:
        raise
      warnings.warn(f"{e}: left out of the figures", RuntimeWarning, stacklevel=2)
  if not runs:
    raise ValueError(f"no run in {list(args.paths)} could be read (see the warnings)")
  if args.metric is not None:  # a misspelt key is not "nothing logged yet"
    logged = {key for r in runs for line in statistics.read_metrics(r.run_dir) for key in line}
    if logged and args.metric not in logged:
      raise ValueError(f"--metric {args.metric}: no run has logged it (yet); they log "
                       f"{', '.join(sorted(logged))}")  # fmt: skip
  groups = statistics.group_runs(runs)
  curves, labels = [], []
  for group, label in zip(groups, statistics.group_labels(groups)):
    try:
      curves.append(statistics.group_curve(group, metric=args.metric, reps=args.reps,
                                           max_points=args.max_points, seed=args.seed))  # fmt: skip
      labels.append(label)
    except statistics.NothingLogged as e:  # a run just started: the other groups are drawn
      if len(groups) == 1:
        raise
      warnings.warn(f"{e}: left out of the figures", RuntimeWarning, stacklevel=2)
  if not curves:
    raise ValueError(f"no group of runs in {list(args.paths)} logged a value to plot yet")
  for path in plotting.plot_group_curves(curves, labels, args.out_dir):
    print(f"wrote {path}")
  print(statistics.summary_table(curves, labels))
  # runs too short for an evaluation
  finals = statistics.final_scores_table(curves, labels, reps=args.reps, seed=args.seed)
  if finals is not None:
    print(f"\n{finals}")
  return curves


if __name__ == "__main__":
  # A bad run directory, file or setting: one line and exit code 2.
  script_main(lambda: parse_plain(Args, __doc__), main, refuse=(ValueError, OSError))
