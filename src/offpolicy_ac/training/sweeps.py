"""Learners of a run as lanes of one vmapped program: their order, settings and seeds,
their run directories, and the plots that compare them.

    lanes = lanes_of(args, root)      # validates --sweep; one Lane per (setting, seed)
    hps = stack_hyperparams(hyperparams_of(args.agent), [lane.setting for lane in lanes])

Shared by both programs (`training/compiled_program.py`, `training/envpool_program.py`),
which `training/experiment.py` sets up. The lane order is the settings of `--sweep`
(`agents.hyperparams.sweep_settings`, the first field slowest), then the seeds; lane k
trains as the single run with its setting and seed would.

Run directories: one learner logs in `<run-dir>` itself; several seeds in
`<run-dir>/seed<k>`; a sweep in `<run-dir>/<field>=<value>,.../seed<k>`, each with a
config.json of that learner alone (its setting applied to the agent config, one seed, no
sweep) that records its lane (`learners_of`, `learner`, `learners`: `load_run` finds its
checkpoints, stacked with the other lanes', in `<run-dir>/checkpoints`).
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any
from typing import Optional

import jax.numpy as jnp

from offpolicy_ac.agents import hyperparams as hyperparams_lib
from offpolicy_ac.analysis.metrics_file import read_json
from offpolicy_ac.training.config import TrainConfig
from offpolicy_ac.training.logger import write_config


@dataclasses.dataclass(frozen=True)
class Lane:
  """One learner of the run: its setting, seed and run directory."""

  setting: dict
  seed: int
  run_dir: pathlib.Path

  @property
  def label(self) -> str:
    """The setting and a space for log titles ("" without a sweep)."""
    return setting_prefix(self.setting)


def lane_names(lanes: list[tuple[dict, int]]) -> list[str]:
  """How errors name each lane, (setting, seed) in lane order: " for seed 3",
  " for learning_rate=0.001 seed 3", or "" for a single learner."""
  if len(lanes) == 1:
    return [""]
  return [f" for {setting_prefix(setting)}seed {seed}" for setting, seed in lanes]


def setting_label(setting: dict) -> str:
  """A sweep setting as `field=value,...`, its learners' directory name."""
  return ",".join(f"{k}={v:g}" for k, v in setting.items())


def setting_prefix(setting: dict) -> str:
  """`setting_label` and a space, to stand before a seed ("" without a sweep)."""
  return setting_label(setting) + " " * bool(setting)


def sweep_lanes(agent_config: Any, config: TrainConfig) -> list[tuple[dict, int]]:
  """(setting, seed) of every lane in lane order (settings slowest, then seeds); the
  sweep is validated here (`agents.hyperparams.parse_sweep`), before anything compiles."""
  values = hyperparams_lib.parse_sweep(agent_config, config.budget.sweep)
  settings = hyperparams_lib.sweep_settings(values)
  for setting in settings:  # each field's values pass alone; a combination may not
    hyperparams_lib.check_setting(agent_config, setting)
  labels = [setting_label(setting) for setting in settings]
  for label in labels:
    if labels.count(label) > 1:
      alike = [setting for setting, other in zip(settings, labels) if other == label]
      raise ValueError(f"--sweep settings {alike} would share the directory {label!r}: give "
                       "values that differ in their first 6 significant digits")  # fmt: skip
  return [(setting, seed) for setting in settings for seed in config.seeds]


def canonical_sweep(args: Any) -> Any:
  """`args` with its `--sweep` written one way, as config.json keeps it and a resumed run
  compares it: each field as the agent config names it (`lambda_` for `--lambda`), its
  values as Python reads them (`0.001` for `1e-3`). Validates the sweep."""
  if not args.train.budget.sweep:
    return args
  sweep = hyperparams_lib.canonical_sweep(args.agent, args.train.budget.sweep)
  return dataclasses.replace(args, train=args.train.replace(sweep=sweep))


def lanes_of(args: Any, root: pathlib.Path) -> list[Lane]:
  """The run's lanes in lane order, each with its run directory (see the module
  docstring)."""
  config: TrainConfig = args.train
  lanes = sweep_lanes(args.agent, config)
  out = []
  for setting, seed in lanes:
    if config.budget.sweep:
      run_dir = root / setting_label(setting) / f"seed{seed}"
    else:
      run_dir = root / f"seed{seed}" if len(lanes) > 1 else root
    out.append(Lane(setting, seed, run_dir))
  return out


def lane_args(args: Any, lane: Lane) -> Any:
  """The args of one lane alone (its seed, its setting, no sweep)."""
  agent = hyperparams_lib.check_setting(args.agent, lane.setting)
  train = args.train.replace(seed=lane.seed, num_seeds=1, sweep=())
  return dataclasses.replace(args, train=train, agent=agent, run_dir=str(lane.run_dir))


def write_lane_configs(name: str, args: Any, root: pathlib.Path, lanes: list[Lane],
                       run_id: str, resume: bool = False,
                       inputs: Optional[dict] = None) -> None:  # fmt: skip
  """Each lane's directory and config.json (the root's is written by the caller); a lane
  logging in the root itself (a single learner) gets none. Resuming, each keeps what
  started the run (`write_config`'s `started`). `inputs`: the digests of the files args
  fields name (as the root's), by which the statistics group runs, not by path. `run_id`:
  the root's, by which a learner's directory, copied away, knows its run's root from
  another run made in its place."""
  for k, lane in enumerate(lanes):
    if lane.run_dir != root:
      lane.run_dir.mkdir(parents=True, exist_ok=True)
      extra = {
          "algorithm": name,
          "learners_of": str(root.absolute()),
          "learner": k,
          "learners": len(lanes),
          "run_id": run_id,
          **({"inputs": inputs} if inputs else {}),
      }
      path = lane.run_dir / "config.json"
      started = read_json(path) if resume and path.exists() else None
      started = started if isinstance(started, dict) else None
      write_config(lane.run_dir, lane_args(args, lane), extra=extra, started=started)


def stack_hyperparams(defaults: dict, settings: list[dict]) -> dict:
  """One [N] float32 array per tunable field: each lane's setting over the defaults."""
  return {
      name: jnp.asarray([s.get(name, float(value)) for s in settings], jnp.float32)
      for name, value in defaults.items()
  }


def plot_lanes(name: str, config: TrainConfig, root: pathlib.Path, lanes: list[Lane],
               how: str) -> None:  # fmt: skip
  """Several seeds: their mean and spread (learning_curves.png, titled with `how` the
  seeds ran). A sweep: one line per setting, the IQM over its seeds with a 95% bootstrap
  interval (<env_id>.png), and the settings' final scores as a table, printed and written
  to sweep_summary.txt; a setting none of whose learners logged a return (a budget too
  short for an episode) is left out, and with none, nothing is drawn."""
  from offpolicy_ac.analysis import plotting
  from offpolicy_ac.analysis import statistics

  if not config.budget.sweep:
    plotting.plot_runs([lane.run_dir for lane in lanes], root / "learning_curves.png",
                       group=True, title=f"{name} {config.env.env_id}, "
                       f"{len(lanes)} seeds ({how})")  # fmt: skip
    return
  runs = [statistics.run_info(lane.run_dir) for lane in lanes]
  groups = statistics.group_runs(runs)
  labels_of_groups = statistics.group_labels(groups)
  settings = {setting_label(lane.setting) for lane in lanes}
  if len(groups) == 1 and len(settings) == 1:  # a sweep of one value: nothing differs
    labels_of_groups = [f"{labels_of_groups[0]} {settings.pop()}"]
  curves, labels = [], []
  for group, label in zip(groups, labels_of_groups):
    try:
      curves.append(statistics.group_curve(group))
      labels.append(label)
    except statistics.NothingLogged as e:  # too short for an episode: the others are drawn
      print(f"[{name}] {e}: left out of the sweep's figure and summary", flush=True)
  if not curves:
    return
  for path in plotting.plot_group_curves(curves, labels, root):
    print(f"[{name}] wrote {path}", flush=True)
  table = statistics.summary_table(curves, labels)
  finals = statistics.final_scores_table(curves, labels)  # runs too short for an evaluation
  if finals is not None:
    table += f"\n\n{finals}"
  (root / "sweep_summary.txt").write_text(table + "\n")
  print(table, flush=True)
