"""Wall clock per 1M env steps of each agent on a MuJoCo task, next to raw envpool stepping.

    python experiments/bench_mujoco.py                          # HalfCheetah-v4
    python experiments/bench_mujoco.py --tasks Hopper-v4 Walker2d-v4 --agents impala acer

For each task, in one process:

* raw: envpool's own `step` of as many environments as the agent's preset uses, with
  pre-drawn uniform random actions and nothing else; the median of `repeats` timed runs.
* agent: the agent's script with the preset the task selects (as `--env-id` alone does),
  one seed, trained for `env_steps` (SQL: `sql_env_steps`, fewer: it is compute-bound)
  with no evaluation and no checkpoints. Its speed comes from its own metrics: env
  steps over wall-clock across its log intervals but the first (which holds the
  compilation) and the last (which holds the run's one-off end work).

Prints seconds per 1M env steps of both and the agent's fraction of raw speed. SQIL
trains the SQL agent on relabelled batches: its cost per update is SQL's.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import tempfile
import time

import numpy as np

from offpolicy_ac import envs
from offpolicy_ac import presets
from offpolicy_ac.cli import parse_plain
from offpolicy_ac.cli import script_main
from offpolicy_ac.training import read_metrics
from offpolicy_ac.training import refusals

LOG_LINES = 5
"""Log lines per agent run (the first and the last interval are left out of the speed)."""


@dataclasses.dataclass(frozen=True)
class Args:
  tasks: tuple[str, ...] = ("HalfCheetah-v4",)
  """envpool MuJoCo task ids."""
  agents: tuple[str, ...] = ("impala", "acer", "sql")
  """Experiment scripts to time (each with the preset the task selects)."""
  env_steps: int = 100_000
  """Env steps each on-policy-rate agent (IMPALA, ACER) trains for."""
  sql_env_steps: int = 10_000
  """Env steps SQL trains for (its presets learn from the 1,000th on, half an update per env
  step: the first log interval, left out, holds the start)."""
  raw_seconds: float = 2.0
  """Duration of one timed run of raw stepping."""
  repeats: int = 5
  """Timed runs of raw stepping (the median is reported)."""
  seed: int = 0
  """Seed of the environments and the agents."""


def preset_args(module, task: str, env_steps: int, seed: int, run_dir: str):
  """The preset `--env-id task` selects, for `env_steps` steps of one seed, timed only."""
  name = module.ENV_PRESETS.select(task)
  if name is None:
    raise ValueError(f"{module.__name__} has no preset for {task} (this benchmark times the "
                     "presets of MuJoCo tasks, such as HalfCheetah-v4's)")  # fmt: skip
  args = module.PRESETS[name]
  train = args.train.replace(
      env_id=task,
      seed=seed,
      total_env_steps=env_steps,
      log_every=max(1, env_steps // LOG_LINES),
      eval_every=0,
      checkpoint_every=0,
  )
  return name, dataclasses.replace(args, train=train, run_dir=run_dir)


def raw_steps_per_second(task: str, num_envs: int, args: Args) -> float:
  """Median env steps/s of envpool's `step` with random actions (no other work)."""
  env = envs.make(task, num_envs, args.seed)
  spec, pool = env.spec, env.pool
  low = np.asarray(spec.action_low, np.float64).reshape(spec.action_shape)
  high = np.asarray(spec.action_high, np.float64).reshape(spec.action_shape)
  rng = np.random.default_rng(args.seed)
  actions = rng.uniform(low, high, size=(256, num_envs, *spec.action_shape))
  pool.reset()
  rates = []
  for _ in range(args.repeats):
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < args.raw_seconds:
      for a in actions:
        pool.step(a)
      steps += len(actions) * num_envs
    rates.append(steps / (time.perf_counter() - start))
  env.close()
  return statistics.median(rates)


def agent_steps_per_second(run_dir: str) -> float:
  """Env steps/s of a finished run from its metrics, its first log interval (compilation)
  and its last (the run's one-off end work) left out."""
  lines = [l for l in read_metrics(run_dir) if "wall_time_s" in l]
  if len(lines) < 3:
    raise RuntimeError(f"{run_dir} logged {len(lines)} lines; need 3 to time a run")
  steps = lines[-2]["env_steps"] - lines[0]["env_steps"]
  return steps / (lines[-2]["wall_time_s"] - lines[0]["wall_time_s"])


HEADER = (f"{'task':<16}{'agent':<8}{'preset':<13}{'envs':>5}{'raw s/1M':>10}"
          f"{'agent s/1M':>12}{'agent/raw':>11}")  # fmt: skip


def format_row(row: dict) -> str:
  return (f"{row['task']:<16}{row['agent']:<8}{row['preset']:<13}{row['num_envs']:>5}"
          f"{row['raw_s_per_1m']:>10,.0f}{row['agent_s_per_1m']:>12,.0f}"
          f"{row['agent_steps_per_s'] / row['raw_steps_per_s']:>11.3f}")  # fmt: skip


def check(args: Args) -> None:
  """Refuses (ValueError) bad arguments, and a task an agent has no preset for, or whose
  preset cannot train for the budget, before anything is timed."""
  if not args.tasks or not args.agents:
    raise ValueError("--tasks and --agents need at least one value each")
  for name in args.agents:
    if name not in ("impala", "acer", "sql"):
      raise ValueError(f"agents must be among impala, acer, sql; got {name!r}")
  for name in ("env_steps", "sql_env_steps"):
    if getattr(args, name) < 5 * LOG_LINES:
      raise ValueError(f"{name} must be at least {5 * LOG_LINES}")
  if args.repeats < 1:
    raise ValueError(f"--repeats must be >= 1, got {args.repeats}")
  if not (math.isfinite(args.raw_seconds) and args.raw_seconds > 0):
    raise ValueError(f"--raw-seconds must be > 0, got {args.raw_seconds}")
  for task in args.tasks:
    if envs.is_atari(task):
      raise ValueError(f"{task} is an Atari task; this benchmark times MuJoCo tasks")
    for name in args.agents:
      steps = args.sql_env_steps if name == "sql" else args.env_steps
      _, run_args = preset_args(getattr(presets, name), task, steps, args.seed, "")
      train = getattr(run_args, "resolved_train", run_args.train)
      try:
        train.validate()
      except ValueError as e:
        raise ValueError(f"{name} on {task}, {steps} env steps: {e}") from None
      if train.planned_iterations < 3:  # a metrics line per iteration at most
        raise ValueError(
            f"{name} on {task}: {steps:,} env steps are {train.planned_iterations} "
            f"iteration(s) of its preset ({train.steps_per_iteration:,} env steps each), "
            "short of the 3 metrics lines a rate needs: raise the budget"
        )


def main(args: Args) -> list[dict]:
  """Times every (task, agent); prints each row as it comes and the table at the end."""
  with refusals():  # bad arguments: one line and exit code 2 (script_main), before any work
    check(args)
  modules = {name: getattr(presets, name) for name in args.agents}
  rows = []
  for task in args.tasks:
    raw_cache: dict[int, float] = {}
    for name, module in modules.items():
      steps = args.sql_env_steps if name == "sql" else args.env_steps
      with tempfile.TemporaryDirectory() as run_dir:
        preset, run_args = preset_args(module, task, steps, args.seed, run_dir)
        num_envs = run_args.train.env.num_envs
        if num_envs not in raw_cache:
          raw_cache[num_envs] = raw_steps_per_second(task, num_envs, args)
        module.run(run_args)
        rate = agent_steps_per_second(run_dir)
      raw = raw_cache[num_envs]
      rows.append(dict(task=task, agent=name, preset=preset, num_envs=num_envs,
                       raw_steps_per_s=raw, agent_steps_per_s=rate, raw_s_per_1m=1e6 / raw,
                       agent_s_per_1m=1e6 / rate))  # fmt: skip
      print(HEADER + "\n" + format_row(rows[-1]), flush=True)
  print("\n" + HEADER)
  for row in rows:
    print(format_row(row))
  return rows


if __name__ == "__main__":
  script_main(lambda: parse_plain(Args, __doc__), main)
