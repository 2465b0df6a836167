"""Learning curves across seeds: group runs by configuration, IQM with bootstrap intervals.

    runs = [run_info(d) for d in find_runs(["runs/"])]
    for group in group_runs(runs):
      curve = group_curve(group)     # IQM over seeds per env step, with a 95% interval

Statistics follow Agarwal et al. 2021, "Deep Reinforcement Learning at the Edge of the
Statistical Precipice" (NeurIPS; arXiv:2108.13264), with their library `rliable`:

* **Grouping.** Runs are pooled when their configurations (config.json's `config` and
  `algorithm`) are equal except for the fields in `IGNORED_FIELDS`: the seed, where the
  run is written, how often it logs and checkpoints, how its program is compiled, how its
  `--import-modules` were spelled, and whether it resumed. None of them changes the
  algorithm (the checkpoint cadence cuts the run into segments that re-seed the
  environments, which changes the random streams as the seed does, not what is learned;
  the compilation changes float rounding). The
  algorithm and the environment are part of every group's key, so runs of two algorithms
  or two environments are never pooled. The git revision and package versions are not
  part of the key. An input file (SQIL's demonstrations) is compared by its contents'
  digest, not by its path.
* **Alignment.** Runs log at slightly different env steps. When the runs of a group
  logged at the same steps up to a jitter, their logged values are kept (`align_runs`);
  otherwise each run is linearly interpolated onto a common grid of evenly spaced steps
  over the range every run covers (the latest first step to the earliest last step),
  never extrapolated. A NaN is never counted as a value: steps that logged one are left
  out, or, where a run is interpolated, interpolated across (with a warning). A run that
  ends before 90% of the longest run's steps (one stopped early, or still running) cuts the
  group's curve there, with a warning that names it. Runs of one seed (a vmapped seed
  and the same seed run alone) are named in a warning: they are pooled as different seeds.
* **IQM.** The interquartile mean across runs at each step: the mean of the middle 50%
  (`scipy.stats.trim_mean(x, 0.25)`, `rliable.metrics.aggregate_iqm`). Less sensitive to
  an outlier seed than the mean, far less noisy than the median.
* **Intervals.** 95% percentile intervals from the stratified bootstrap
  (`rliable.library.get_interval_estimates`): runs are resampled with replacement within
  each task (here one task, the group's environment), the IQM recomputed, and the 2.5th
  and 97.5th percentiles of those IQMs reported.

`find_runs`, `run_info` and the functions that take runs or groups (`group_curve`,
`group_labels`, `final_scores_table`) read the run directories; the rest are pure.
"""

from __future__ import annotations

import math
import os
import pathlib
from typing import Any
from typing import NamedTuple
from typing import Optional
from typing import Sequence
import warnings

import numpy as np

from offpolicy_ac.analysis.metrics_file import METRICS_FILE
from offpolicy_ac.analysis.metrics_file import read_json
from offpolicy_ac.analysis.metrics_file import read_metrics

__all__ = [
    "IGNORED_FIELDS",
    "CurveEstimate",
    "NothingLogged",
    "GroupCurve",
    "RunGroup",
    "RunInfo",
    "align_runs",
    "final_scores_table",
    "find_runs",
    "group_curve",
    "group_labels",
    "group_runs",
    "iqm",
    "iqm_with_intervals",
    "run_info",
    "summary_table",
]

IGNORED_FIELDS = (
    "run_dir",
    "resume",
    "import_modules",
    "train.budget.seed",
    "train.budget.num_seeds",
    "train.budget.vmap_seeds",
    "train.budget.log_every",
    "train.budget.compile_for",
    "train.checkpoint.checkpoint_every",
    "train.checkpoint.keep_checkpoints",
    "train.eval.target_return",
    "train.parallel.process_id",
    "train.parallel.coordinator_address",
    "train.tracking.track",
    "train.tracking.wandb_project",
    "train.tracking.wandb_entity",
    "train.tracking.wandb_mode",
    "loop.seed",
    "loop.num_seeds",
    "loop.vmap_seeds",
    "loop.log_every",
    "loop.checkpoint_every",
    "loop.keep_checkpoints",
    "loop.target_return",
    "loop.process_id",
    "loop.coordinator_address",
)
"""Dotted fields of config.json's `config` that do not change what is learned: runs that
differ only in these are seeds of one configuration (`loop.*`: the flat config of run
directories written by offpolicy_ac 0.1)."""


class NothingLogged(ValueError):
  """No run of a group logged a value of the metric yet (`group_curve`)."""


class RunInfo(NamedTuple):
  """One run directory as the grouping sees it."""

  run_dir: pathlib.Path
  algorithm: str
  env_id: str
  seed: Optional[int]
  settings: tuple[tuple[str, Any], ...]
  """(dotted field, value) pairs of the config without IGNORED_FIELDS, sorted."""


class RunGroup(NamedTuple):
  """Runs (seeds) of one configuration."""

  algorithm: str
  env_id: str
  settings: tuple[tuple[str, Any], ...]
  runs: tuple[RunInfo, ...]


class CurveEstimate(NamedTuple):
  """An aggregate per x and its confidence interval, each [num_points]."""

  point: np.ndarray
  lower: np.ndarray
  upper: np.ndarray


class GroupCurve(NamedTuple):
  """A group's IQM learning curve: `env_steps`, `iqm`, `lower`, `upper` [num_points]."""

  group: RunGroup
  metric: str
  """'eval_return' when every run of the group logged evaluations, else 'episode_return'."""
  env_steps: np.ndarray
  iqm: np.ndarray
  lower: np.ndarray
  upper: np.ndarray


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
  if isinstance(d, dict):
    out = {}
    for k, v in d.items():
      out.update(_flatten(v, f"{prefix}{k}."))
    return out
  return {prefix[:-1]: tuple(d) if isinstance(d, list) else d}


def _hashable(v: Any) -> Any:
  return tuple(_hashable(x) for x in v) if isinstance(v, (list, tuple)) else v


def run_info(run_dir: str | os.PathLike) -> RunInfo:
  """Reads `run_dir`/config.json into a RunInfo.

  Raises:
    ValueError: config.json is missing or names no algorithm or environment.
  """
  run_dir = pathlib.Path(run_dir)
  path = run_dir / "config.json"
  if not path.exists():
    raise ValueError(f"{run_dir} holds no config.json: not a run directory")
  record = read_json(path)
  config = record.get("config") if isinstance(record, dict) else None
  if not isinstance(config, dict):
    raise ValueError(f"{path} is not a run's config.json (no `config` object)")
  flat = {k: _hashable(v) for k, v in _flatten(config).items()}
  inputs = record.get("inputs")
  for field, digest in (inputs.items() if isinstance(inputs, dict) else ()):
    if field in flat:  # a file (SQIL's --demos) counts by its contents, not its path
      flat[field] = f"sha256:{str(digest)[:12]}"
  env_id = flat.get("train.env.env_id", flat.get("loop.env_id"))
  algorithm = record.get("algorithm")
  if env_id is None or algorithm is None:
    raise ValueError(f"{path} names no environment (train.env.env_id) or no algorithm")
  seed = flat.get("train.budget.seed", flat.get("loop.seed"))
  settings = tuple(sorted((k, v) for k, v in flat.items() if k not in IGNORED_FIELDS))
  return RunInfo(run_dir, str(algorithm), str(env_id), seed, settings)


def find_runs(paths: str | os.PathLike | Sequence[str | os.PathLike]) -> list[pathlib.Path]:
  """Run directories at or below `paths` (one path, or several): those holding config.json
  and metrics.jsonl (a vmapped multi-seed run's root holds no metrics, its seed<k>/ do; a
  run just started, an empty one). Symbolic links to directories are followed, each
  directory read once; directories that cannot be read are skipped. A multi-host job's
  processes other than 0 (root/process<i>) log the same learner again, and are left out.

  Raises:
    ValueError: a path does not exist, or no run directory is found.
  """
  if isinstance(paths, (str, os.PathLike)):
    paths = [paths]
  found = set()
  for p in (pathlib.Path(p).expanduser() for p in paths):
    if not p.exists():
      raise ValueError(f"{p} does not exist")
    for d in _directories_below(p) if p.is_dir() else []:
      if _holds_metrics(d) and not _other_process(d):
        found.add(d.resolve())
  if not found:
    raise ValueError(f"no run directory (config.json and metrics.jsonl) in {list(paths)}")
  return sorted(found)


def _holds_metrics(d: pathlib.Path) -> bool:
  """Whether `d` holds config.json and metrics.jsonl, empty in a run just started (False
  where it cannot be read)."""
  try:
    return (d / "config.json").exists() and (d / METRICS_FILE).exists()
  except OSError:
    return False


def _other_process(run_dir: pathlib.Path) -> bool:
  """Whether `run_dir` is the log of a multi-host job's process other than 0."""
  try:
    parallel = read_json(run_dir / "config.json")["config"]["train"]["parallel"]
    return int(parallel.get("process_id", 0)) != 0
  except (OSError, ValueError, KeyError, TypeError):
    return False


def _directories_below(root: pathlib.Path) -> list[pathlib.Path]:
  """`root` and the directories below it, links followed, each real directory once."""
  seen, order, stack = set(), [], [root]
  while stack:
    d = stack.pop()
    real = d.resolve()
    if real in seen:
      continue
    seen.add(real)
    order.append(d)
    try:
      children = list(d.iterdir())
    except OSError:  # unreadable: skipped, as rglob skips it
      continue
    stack.extend(c for c in children if _is_directory(c))
  return order


def _is_directory(path: pathlib.Path) -> bool:
  try:
    return path.is_dir()
  except OSError:  # a link into a directory that cannot be read
    return False


def group_runs(runs: Sequence[RunInfo]) -> list[RunGroup]:
  """Pools runs whose (algorithm, environment, settings) are equal, the groups in
  first-seen order, each group's runs by seed (see the module docstring for what is
  ignored)."""
  groups: dict[tuple, list[RunInfo]] = {}
  for run in runs:
    groups.setdefault((run.algorithm, run.env_id, run.settings), []).append(run)
  return [RunGroup(a, e, s, _by_seed(rs)) for (a, e, s), rs in groups.items()]


def _by_seed(runs: Sequence[RunInfo]) -> tuple[RunInfo, ...]:
  """`runs` by seed, then run directory: the bootstrap resamples runs by their position, so
  a group's intervals do not depend on how its directories are named or listed."""

  def key(run):
    number = isinstance(run.seed, int) and not isinstance(run.seed, bool)
    return (not number, run.seed if number else 0, str(run.seed), str(run.run_dir))

  return tuple(sorted(runs, key=key))


def group_labels(groups: Sequence[RunGroup]) -> list[str]:
  """A label per group naming what tells it apart in its figure ("impala
  learning_rate=0.001"): the algorithm, then the fields that differ between the groups of
  that algorithm and environment, by their last component (the full dotted name where
  two would read alike)."""
  labels = []
  for g in groups:
    peers = [dict(p.settings) for p in groups if (p.env_id, p.algorithm) == (g.env_id, g.algorithm)]
    keys = sorted(set().union(*peers))
    # A field a run's config.json lacks (written by another version) is not its null.
    absent = "(not recorded)"
    differing = [k for k in keys if len({repr(d.get(k, absent)) for d in peers}) > 1]
    short = [k.rsplit(".", 1)[-1] for k in differing]
    names = [s if short.count(s) == 1 else k for k, s in zip(differing, short)]
    mine = dict(g.settings)
    values = [_setting(mine.get(k, absent), g, k) for k in differing]
    labels.append(" ".join([g.algorithm] + [f"{n}={v}" for n, v in zip(names, values)]))
  return labels


def _setting(value: Any, group: Optional[RunGroup] = None, field: str = "") -> str:
  """A setting's value in a label: a float as a sweep names its learners' directories
  (`1` for 1.0, `0.001`), unless that would round it; an input file, grouped by its
  contents' digest, by its runs' file names too (`demos.npz (sha256:2974207f6f6b)`)."""
  if isinstance(value, float) and float(f"{value:g}") == value:
    return f"{value:g}"
  if isinstance(value, str) and value.startswith("sha256:") and group is not None:
    names = set()
    for run in group.runs:
      try:
        path = _flatten(read_json(run.run_dir / "config.json")["config"]).get(field)
      except (OSError, ValueError, KeyError, TypeError):
        continue
      if isinstance(path, str):
        names.add(pathlib.Path(path).name)
    return f"{', '.join(sorted(names))} ({value})" if names else value
  return str(value)


def align_runs(
    series: Sequence[tuple[np.ndarray, np.ndarray]], max_points: int = 200
) -> tuple[np.ndarray, np.ndarray]:
  """Puts runs' (env_steps, values) on common steps: returns (steps [P], values [R, P]).

  Runs that logged at the same steps up to a jitter (actor threads end an iteration a few
  steps apart from run to run: at each index, the runs' steps lie within a quarter of their
  median interval; a last line may differ more and is left out) keep their points up to
  where the shortest run ends; each step is the median of the runs' steps there, and a
  step where a run's value is NaN is left out. Otherwise each run is interpolated linearly over its
  finite values at evenly spaced steps between the latest first step and the earliest last
  step (the range every run covers), as many as the densest run logged there, at most
  `max_points` (one, where the runs share only one step).

  Raises:
    ValueError: no runs, a run without points or without a finite value, a run whose
      steps and values differ in length or whose steps do not increase, runs whose step
      ranges do not overlap, or no step where every run has a finite value.
  """
  if not series:
    raise ValueError("align_runs needs at least one run")
  if max_points < 2:
    raise ValueError(f"max_points must be >= 2, got {max_points}")
  xs = [np.asarray(x, np.float64).ravel() for x, _ in series]
  ys = [np.asarray(y, np.float64).ravel() for _, y in series]
  for k, (x, y) in enumerate(zip(xs, ys)):
    if x.size != y.size:
      raise ValueError(f"run {k} has {x.size} steps and {y.size} values")
    if not np.any(np.isfinite(y)):
      raise ValueError(f"run {k} has no finite value to align")
    if np.any(np.diff(x) <= 0):
      i = int(np.argmax(np.diff(x) <= 0))
      raise ValueError(f"run {k}'s steps do not increase ({x[i]:,.0f} then {x[i + 1]:,.0f})")
  shared = _shared_steps(xs)
  if shared is not None:
    n = shared.size
    values = np.stack([y[:n] for y in ys])
    kept = np.all(np.isfinite(values), axis=0)
    if not np.any(kept):
      raise ValueError("no step where every run has a finite value")
    return shared[kept], values[:, kept]
  finite = [(x[np.isfinite(y)], y[np.isfinite(y)]) for x, y in zip(xs, ys)]
  lo, hi = max(x[0] for x, _ in finite), min(x[-1] for x, _ in finite)
  if lo > hi:
    raise ValueError(f"the runs' step ranges do not overlap (latest start {lo}, earliest end {hi})")
  inside = max(int(np.sum((x >= lo) & (x <= hi))) for x, _ in finite)
  grid = np.linspace(lo, hi, 1 if lo == hi else int(np.clip(inside, 2, max_points)))
  return grid, np.stack([np.interp(grid, x, y) for x, y in finite])


def _shared_steps(xs: list[np.ndarray]) -> Optional[np.ndarray]:
  """The runs' common steps, when they logged at the same steps up to a jitter (see
  `align_runs`): the median of the runs' steps at each index, up to where the shortest
  run ends. None when they did not.

  The jitter allowed is a quarter of the runs' median interval between two lines (of the
  steps themselves, when every run logged one line). The last common index may differ
  more: a run's last line (the partial interval at the end of its budget, or of a run
  still going) is left out then, when the runs' median intervals are alike."""
  n = min(x.size for x in xs)
  head = np.stack([x[:n] for x in xs])  # [R, n]
  gaps = np.concatenate([np.diff(x) for x in xs])
  tolerance = 0.25 * (np.median(gaps) if gaps.size else np.max(np.abs(head)))
  close = head.max(0) - head.min(0) <= tolerance
  kept = n if close.all() else int(np.argmin(close))  # the leading indices that are close
  # A last line is left out only for runs that log at one interval (not a run that logged
  # at its first step and its last against one that logged every step between); a run's
  # last gap may be a partial interval, so it counts only where it is the run's only one.
  intervals = [np.median(np.diff(x)[: max(1, x.size - 2)]) for x in xs if x.size > 1]
  alike = not intervals or max(intervals) - min(intervals) <= tolerance
  if kept == n or (kept == n - 1 > 0 and alike):
    return np.median(head[:, :kept], axis=0)
  return None


def iqm(scores: np.ndarray) -> np.ndarray:
  """Interquartile mean over runs (axis 0) of [runs, ...] scores: `scipy.stats.trim_mean`
  with 25% cut at each end, as `rliable.metrics.aggregate_iqm` at each point."""
  scores = np.asarray(scores, np.float64)
  if scores.ndim < 1 or scores.shape[0] < 1:
    raise ValueError(f"iqm needs scores of at least one run ([runs, ...]), got {scores.shape}")
  if not np.all(np.isfinite(scores)):
    raise ValueError("scores must be finite")
  return _trimmed_iqm(scores)


def _trimmed_iqm(scores: np.ndarray) -> np.ndarray:
  """`iqm` of scores already checked (the bootstrap's resamples of checked scores)."""
  import scipy.stats

  return scipy.stats.trim_mean(scores.reshape(scores.shape[0], -1), 0.25, axis=0).reshape(
      scores.shape[1:]
  )


def iqm_with_intervals(
    scores: np.ndarray, *, reps: int = 2000, confidence: float = 0.95, seed: int = 0
) -> CurveEstimate:
  """The IQM over runs at each point, with stratified-bootstrap percentile intervals.

  Args:
    scores: [runs, points] (one task: the bootstrap resamples runs).
    reps: bootstrap replications, at least 2 / (1 - confidence) (40 at 0.95), so that each
      tail of the interval holds a replication.
    confidence: the interval's coverage, in (0, 1).
    seed: seeds the bootstrap (same inputs and seed, same intervals). Runs are resampled
      independently at each point (pointwise intervals, as rliable's curves).

  Returns:
    CurveEstimate with arrays [points]; lower <= IQM <= upper.
  """
  from rliable import library

  scores = np.asarray(scores, np.float64)
  if scores.ndim != 2 or scores.shape[0] < 1 or scores.shape[1] < 1:
    raise ValueError(f"scores must be [runs, points] with both >= 1, got {scores.shape}")
  if not np.all(np.isfinite(scores)):
    raise ValueError("scores must be finite")
  if not 0.0 < confidence < 1.0:
    raise ValueError(f"confidence must be in (0, 1), got {confidence}")
  fewest = math.ceil(2 / (1 - confidence) - 1e-9)
  if reps < fewest:
    raise ValueError(
        f"reps={reps} is too few for a {confidence:g} interval: each tail needs at least one "
        f"bootstrap replication, so reps >= {fewest}"
    )
  per_task = scores[:, None, :]  # rliable's [runs, tasks, ...]
  # rliable's StratifiedBootstrap draws its indices from NumPy's global generator (its
  # `random_state` argument does not reach them): seed that, and restore it afterwards.
  saved = np.random.get_state()
  np.random.seed(seed)
  try:
    point, interval = library.get_interval_estimates(
        {"scores": per_task},
        lambda s: _trimmed_iqm(s.reshape(s.shape[0] * s.shape[1], -1)),
        reps=reps,
        confidence_interval_size=confidence,
    )
  finally:
    np.random.set_state(saved)
  lower, upper = interval["scores"]
  point = point["scores"]
  # Percentiles of a finite set of bootstrap IQMs can sit a rounding error off the
  # point estimate when all runs agree; the interval always contains it.
  return CurveEstimate(point, np.minimum(lower, point), np.maximum(upper, point))


def _series(records: list[dict], key: str,
            run_dir: Any = "a run") -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
  """A run's (env steps, values, bad) of `key` from its metrics lines. A null is NaN: NaN is
  written as null, and in `episode_return` a null means that no episode ended in the
  interval (kept as NaN, so that runs logged at the same steps stay aligned line by line:
  `align_runs` leaves the step out). `bad`: the steps of NaN or infinite values other than
  those intervals. Refuses a value that is not a number and steps that do not increase,
  naming `run_dir`."""
  pts, bad = [], []
  for record in records:
    value = record.get(key, _ABSENT)
    if value is _ABSENT:
      continue
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
      raise ValueError(f"{run_dir}: {key} at env step {record['env_steps']:,} is {value!r}, "
                       "not a number")  # fmt: skip
    if (value is None and key != "episode_return") or (
        value is not None and not math.isfinite(value)
    ):  # fmt: skip
      bad.append(record["env_steps"])
    pts.append((record["env_steps"], math.nan if value is None else value))
  x, y = (np.asarray(v, np.float64) for v in zip(*pts)) if pts else (np.zeros(0), np.zeros(0))
  if np.any(np.diff(x) <= 0):
    i = int(np.argmax(np.diff(x) <= 0))
    raise ValueError(f"{run_dir}: its {METRICS_FILE} logs env step {x[i]:,.0f}, then "
                     f"{x[i + 1]:,.0f}: the steps must increase (two files joined?)")  # fmt: skip
  return x, y, np.asarray(bad, np.float64)


_ABSENT = object()


def group_curve(
    group: RunGroup,
    *,
    metric: Optional[str] = None,
    reps: int = 2000,
    max_points: int = 200,
    seed: int = 0,
) -> GroupCurve:
  """The group's IQM curve over its runs, with 95% stratified-bootstrap intervals.

  Args:
    group: runs of one configuration.
    metric: a metrics.jsonl key; default 'eval_return' when every run logged one, else
      'episode_return'.
    reps, seed: the bootstrap's replications and seed.
    max_points: at most this many steps when runs must be interpolated (`align_runs`).

  A run that logged no value of the metric yet (one just started) is left out, with a
  warning naming it.

  Raises:
    NothingLogged: no run of the group logged a value of the metric (a ValueError).
    ValueError: a run's metrics that cannot be read, or runs that share no steps.
  """
  group = group._replace(runs=_by_seed(group.runs))
  records = [read_metrics(r.run_dir) for r in group.runs]
  name = f"{group.algorithm} {group.env_id}"
  if metric is None:
    evaluated = [np.isfinite(_series(rs, "eval_return", r.run_dir)[1]).any()
                 for r, rs in zip(group.runs, records)]  # fmt: skip
    started = [e or np.isfinite(_series(rs, "episode_return", r.run_dir)[1]).any()
               for r, e, rs in zip(group.runs, evaluated, records)]  # fmt: skip
    without = [str(r.run_dir) for r, e, s in zip(group.runs, evaluated, started) if s and not e]
    metric = "episode_return" if without or not any(evaluated) else "eval_return"
    if without and len(without) < sum(started):
      warnings.warn(f"{name}: compared on episode_return, since {', '.join(without)} logged "
                    "no eval_return (or only NaN)", RuntimeWarning, stacklevel=2)  # fmt: skip
  series = [_series(rs, metric, r.run_dir) for r, rs in zip(group.runs, records)]
  bad = [b for _, _, b in series]
  series = [(x, y) for x, y, _ in series]
  empty = [str(r.run_dir) for r, (_, y) in zip(group.runs, series) if not np.isfinite(y).any()]
  if len(empty) == len(series):
    raise NothingLogged(f"{name}: no run logged {metric} ({', '.join(empty)})")
  if empty:  # e.g. a run just started: left out rather than stopping every group's plot
    warnings.warn(f"{name}: left out {', '.join(empty)}, which logged no {metric} yet",
                  RuntimeWarning, stacklevel=2)  # fmt: skip
    kept = [k for k, (_, y) in enumerate(series) if np.isfinite(y).any()]
    group = group._replace(runs=tuple(group.runs[k] for k in kept))
    records, series, bad = ([items[k] for k in kept] for items in (records, series, bad))
  for run, nan in zip(group.runs, bad):
    if nan.size:  # the logger writes NaN as null; another writer may write Infinity
      warnings.warn(f"{name}: {run.run_dir} logged {metric} NaN or infinite at env steps "
                    f"{', '.join(f'{s:,.0f}' for s in nan[:5])}: the curve leaves those steps "
                    "out (or, where the runs logged at different steps, interpolates the run "
                    "across them)", RuntimeWarning, stacklevel=2)  # fmt: skip
  ends = [float(x[-1]) for x, _ in series]
  short = [str(r.run_dir) for r, end in zip(group.runs, ends) if end < 0.9 * max(ends)]
  if short:  # e.g. a run stopped early, or still running: it cuts every curve short
    warnings.warn(f"{name}: the curve stops at {min(ends):,.0f} env steps, where "
                  f"{', '.join(short)} end; the group's other runs go on to "
                  f"{max(ends):,.0f}", RuntimeWarning, stacklevel=2)  # fmt: skip
  seeds = [r.seed for r in group.runs]
  twice = [str(r.run_dir) for r in group.runs if seeds.count(r.seed) > 1]
  if twice:
    warnings.warn(f"{name}: runs of the same seed are pooled as different seeds: "
                  f"{', '.join(twice)}", RuntimeWarning, stacklevel=2)  # fmt: skip
  try:
    steps, values = align_runs(series, max_points)
  except ValueError as e:
    ranges = [f"{r.run_dir} [{x[0]:,.0f}, {x[-1]:,.0f}]" for r, (x, _) in zip(group.runs, series)]
    raise ValueError(f"{name}: {e}; the runs' env steps: {', '.join(ranges)}") from e
  est = iqm_with_intervals(values, reps=reps, seed=seed)
  return GroupCurve(group, metric, steps, est.point, est.lower, est.upper)


def _number(value: float) -> str:
  """Returns with two decimals; values below 10 in magnitude (importance weights, losses)
  with four, so that 0.9999 does not read 1.00; below 0.001, three significant digits."""
  if abs(value) >= 10:
    return f"{value:.2f}"
  return f"{value:.4f}" if value == 0 or abs(value) >= 1e-3 else f"{value:.3g}"


def summary_table(curves: Sequence[GroupCurve], labels: Sequence[str]) -> str:
  """A text table, one row per group: its label, environment, metric, number of runs
  (seeds), the last common env step and the IQM there with its interval."""
  if len(labels) != len(curves):
    raise ValueError(f"need one label per curve ({len(curves)}), got {len(labels)}")
  for c in curves:
    if not isinstance(c, GroupCurve):
      raise TypeError(f"summary_table takes GroupCurves (group_curves' results), got {c!r:.80}")
  header = ("group", "env", "metric", "seeds", "env steps", "final IQM [95% CI]")
  rows = [header]
  for c, label in zip(curves, labels):
    rows.append(
        (
            label,
            c.group.env_id,
            c.metric,
            str(len(c.group.runs)),
            f"{c.env_steps[-1]:.0f}",
            f"{_number(c.iqm[-1])} [{_number(c.lower[-1])}, {_number(c.upper[-1])}]",
        )
    )
  return _text_table(rows)


def _text_table(rows: Sequence[Sequence[str]]) -> str:
  """Rows of cells (the first the header) as aligned columns, a rule under the header."""
  widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
  lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
  lines.insert(1, "  ".join("-" * w for w in widths))
  return "\n".join(lines)


def final_scores_table(
    curves: Sequence[GroupCurve], labels: Sequence[str], *, reps: int = 2000, seed: int = 0
) -> Optional[str]:
  """For groups compared on training returns (their runs too short for a greedy evaluation
  in metrics.jsonl): a titled text table of their final greedy returns (each run's
  summary.json `last_eval_return`, the score of its final parameters), one row per group,
  the IQM over its runs with a 95% bootstrap interval. A group one of whose runs has no
  such score (one still training, one that evaluated nothing, one stopped before its end,
  `interrupted` in its summary, or being resumed, `resumed_since`: the summary is of a
  segment before) has a row that says so. None when no curve is of training returns
  (`episode_return`), or no group has a score."""
  if len(labels) != len(curves):
    raise ValueError(f"need one label per curve ({len(curves)}), got {len(labels)}")
  if not any(c.metric == "episode_return" for c in curves):
    return None
  rows = [("group", "env", "runs", "final greedy return IQM [95% CI]")]
  scored = False
  for curve, label in zip(curves, labels):
    scores = [_final_score(run.run_dir) for run in curve.group.runs]
    if None in scores:
      interval = "- (a run not finished, or without a final evaluation)"
    else:
      est = iqm_with_intervals(np.asarray(scores)[:, None], reps=reps, seed=seed)
      interval = f"{_number(est.point[0])} [{_number(est.lower[0])}, {_number(est.upper[0])}]"
      scored = True
    rows.append((label, curve.group.env_id, str(len(scores)), interval))
  if not scored:
    return None
  return f"The final parameters' greedy returns (summary.json):\n{_text_table(rows)}"


def _final_score(run_dir: pathlib.Path) -> Optional[float]:
  """A finished run's final greedy return (summary.json's `last_eval_return`), or None."""
  try:
    summary = read_json(run_dir / "summary.json")
    score = summary.get("last_eval_return")
    unfinished = summary.get("interrupted") or "resumed_since" in summary
  except (OSError, ValueError, AttributeError):
    return None
  if unfinished or not isinstance(score, (int, float)) or not math.isfinite(score):
    return None
  return float(score)
