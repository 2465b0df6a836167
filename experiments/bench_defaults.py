"""Benchmark: what a user's first runs end with. Each script's default and each preset that
trains in minutes on a CPU, 5 seeds, scored after training on the final and on the best
parameters a run leaves behind.

Each case runs its script with its own defaults (plus `--num-seeds`: the seeds are lanes of
one vmapped learner, each logging what `--seed k` logs), as a separate process. Then every
seed's final parameters (`final_params.msgpack`) and best-evaluated parameters
(`best_params.msgpack`) play `--episodes` greedy episodes (`load_run` and
`training.evaluate`, as `experiments/evaluate.py` does), each on its own freshly reset
environment, seeded apart from the training and in-training evaluation environments.

Bars (a seed passes when its mean greedy return is at or above the bar):
  * CartPole-v0 195 and CartPole-v1 475: gym's and gymnasium's `reward_threshold`
    (SQIL on CartPole-v1: 450, as the README's table);
  * Pendulum-v1 -250: DI-engine's `stop_value` (dizoo/classic_control/pendulum/config);
  * SpaceInvaders-MinAtar 131: PPO at 10M env steps (gymnax-blines).

SQIL imitates 10 greedy episodes of seed 0 of the SQL case on the same task, recorded
with `record_demos.py --best`. Cases run into an `--out-dir` that holds others' results
are added to its results.json and results.md table (scored on the same `--episodes`).

    python experiments/bench_defaults.py --out-dir bench/defaults
    python experiments/bench_defaults.py --cases impala acer --num-seeds 2   # a subset
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import subprocess
import sys
import time
from typing import Optional

import numpy as np

from offpolicy_ac import presets
from offpolicy_ac.analysis.metrics_file import read_json
from offpolicy_ac.cli import check_output_file
from offpolicy_ac.cli import parse_plain
from offpolicy_ac.cli import script_main
from offpolicy_ac.training import refusals

EXPERIMENTS = pathlib.Path(__file__).resolve().parent


@dataclasses.dataclass(frozen=True)
class Case:
  script: str
  flags: tuple[str, ...]
  bar: float
  demos_from: Optional[str] = None
  """SQIL: the case whose seed 0 records the demonstrations."""


CASES = {
    "impala": Case("impala", (), 475.0),
    "acer": Case("acer", (), 475.0),
    "sql": Case("sql", (), 475.0),
    "sqil": Case("sqil", (), 450.0, demos_from="sql"),
    "sql-cartpole-v0": Case("sql", ("--preset", "cartpole-v0"), 195.0),
    "sqil-cartpole-v0": Case("sqil", ("--preset", "cartpole-v0"), 195.0, "sql-cartpole-v0"),
    "impala-gymnax-cartpole": Case("impala", ("--preset", "gymnax-cartpole"), 475.0),
    "impala-pendulum": Case("impala", ("--preset", "pendulum"), -250.0),
    "acer-pendulum": Case("acer", ("--preset", "pendulum"), -250.0),
    "sql-pendulum": Case("sql", ("--preset", "pendulum"), -250.0),
    "sqil-pendulum": Case("sqil", ("--preset", "pendulum"), -250.0, "sql-pendulum"),
    "impala-minatar-spaceinvaders": Case(
        "impala", ("--env-id", "gymnax:SpaceInvaders-MinAtar"), 131.0
    ),
}


@dataclasses.dataclass(frozen=True)
class Args:
  cases: tuple[str, ...] = tuple(CASES)
  """Cases to run, in order (a SQIL case needs its demonstrator case run before it)."""
  num_seeds: int = 5
  """Seeds per case (0 to num_seeds - 1)."""
  episodes: int = 20
  """Greedy episodes per seed and parameter set."""
  out_dir: str = "bench/defaults"
  """Where the runs, results.json and results.md go."""
  total_env_steps: Optional[int] = None
  """Every case's budget instead of its own (a quick check of the benchmark itself)."""


def _budget_flags(args: Args) -> list[str]:
  """The flags of `--total-env-steps`, the budget override (none: each case's own)."""
  return [] if args.total_env_steps is None else ["--total-env-steps", str(args.total_env_steps)]


def _flags(case: Case, args: Args, demos: Optional[str]) -> list[str]:
  """The case's command line, without --run-dir."""
  flags = [*case.flags, *_budget_flags(args), "--num-seeds", str(args.num_seeds)]
  return flags + ["--demos", demos] if demos else flags


def _train(case: Case, run_dir: pathlib.Path, args: Args, demos: Optional[str]) -> float:
  flags = _flags(case, args, demos) + ["--run-dir", str(run_dir)]
  cmd = [sys.executable, str(EXPERIMENTS / f"{case.script}.py"), *flags]
  print("+", " ".join(cmd[1:]), flush=True)
  start = time.perf_counter()
  proc = subprocess.run(cmd, capture_output=True, text=True)
  if proc.returncode != 0:
    raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
  return time.perf_counter() - start


def _lane_dirs(run_dir: pathlib.Path, num_seeds: int) -> list[pathlib.Path]:
  return [run_dir] if num_seeds == 1 else [run_dir / f"seed{k}" for k in range(num_seeds)]


def _score(lane_dir: pathlib.Path, best: bool, episodes: int) -> dict:
  from offpolicy_ac.training import evaluate
  from offpolicy_ac.training import load_run

  run = load_run(lane_dir, best=best)
  with run.make_env(episodes, 10_000) as env:
    returns = evaluate(env, run.greedy, run.acting, episodes)
  return {"mean": float(np.mean(returns)), "env_steps": run.env_steps}


def _record_demos(run_dir: pathlib.Path, out: pathlib.Path) -> None:
  cmd = [sys.executable, str(EXPERIMENTS / "record_demos.py"), "--run-dir", str(run_dir),
         "--best", "--episodes", "10", "--out", str(out)]  # fmt: skip
  subprocess.run(cmd, check=True)


def run_case(name: str, args: Args, out: pathlib.Path) -> dict:
  case = CASES[name]
  demos = None
  if case.demos_from:
    demos = out / f"demos-{case.demos_from}.npz"
    if not demos.exists():
      _record_demos(_lane_dirs(out / case.demos_from, args.num_seeds)[0], demos)
  wall = _train(case, out / name, args, demos and str(demos))
  seeds = []
  for lane in _lane_dirs(out / name, args.num_seeds):
    summary = json.loads((lane / "summary.json").read_text())
    seeds.append(
        {
            "final": _score(lane, False, args.episodes),
            "best": _score(lane, True, args.episodes),
            "summary_last_eval": summary["last_eval_return"],
            "summary_best_eval": summary["best_eval_return"],
        }
    )
  finals = [s["final"]["mean"] for s in seeds]
  bests = [s["best"]["mean"] for s in seeds]
  result = {
      "case": name,
      "episodes": args.episodes,
      "command": " ".join([f"{case.script}.py", *case.flags, *_budget_flags(args)]),
      "bar": case.bar,
      "wall_s": wall,
      "env_steps": int(np.median([s["final"]["env_steps"] for s in seeds])),
      "seeds": seeds,
      "final_passed": sum(f >= case.bar for f in finals),
      "best_passed": sum(b >= case.bar for b in bests),
  }
  print(_row(result), flush=True)
  return result


def _row(r: dict) -> str:
  finals = [s["final"]["mean"] for s in r["seeds"]]
  bests = [s["best"]["mean"] for s in r["seeds"]]
  n = len(finals)

  def stats(xs):
    return f"{np.median(xs):.1f} [{min(xs):.1f}, {max(xs):.1f}]"

  return (
      f"| `{r['command']}` | {r['bar']:g} | {r['env_steps']:,} | {stats(finals)} | "
      f"{r['final_passed']}/{n} | {stats(bests)} | {r['best_passed']}/{n} | {r['wall_s']:.0f} |"
  )


def table(results: list[dict], episodes: int) -> str:
  head = (
      f"Greedy return after training: mean of {episodes} episodes per seed; median [min, max]"
      " over seeds; passed: seeds at or above the bar.\n\n"
      "| command | bar | env steps (median) | final | passed | best | passed | wall s |\n"
      "|---|---|---|---|---|---|---|---|\n"
  )
  return head + "\n".join(_row(r) for r in results) + "\n"


def check(args: Args) -> pathlib.Path:
  """Refuses (ValueError) bad arguments and an --out-dir that holds a case's runs or cannot
  hold them, before any case runs; returns the --out-dir."""
  unknown = sorted(set(args.cases) - set(CASES))
  if unknown:
    raise ValueError(f"unknown --cases {unknown}; known: {list(CASES)}")
  repeated = sorted({name for name in args.cases if args.cases.count(name) > 1})
  if repeated or not args.cases:
    raise ValueError(f"--cases names {repeated} twice" if repeated else "--cases needs a case")
  for flag, value in (("--num-seeds", args.num_seeds), ("--episodes", args.episodes),
                      ("--total-env-steps", args.total_env_steps)):  # fmt: skip
    if value is not None and value < 1:
      raise ValueError(f"{flag} must be >= 1, got {value}")
  for name in args.cases:  # e.g. a budget below one iteration, refused before any case runs
    case = CASES[name]
    presets.check_command(case.script, _flags(case, args, case.demos_from and "demos.npz"))
  out = check_output_file("--out-dir", pathlib.Path(args.out_dir) / "results.json").parent
  for i, name in enumerate(args.cases):
    source = CASES[name].demos_from
    if source and source not in args.cases[:i] and not (out / source).exists():
      raise ValueError(
          f"{name} learns from {source}'s demonstrations: run {source} before it"
          f" (in --cases, or earlier into {out})"
      )
  taken = [name for name in args.cases if (out / name).exists()]
  if taken:
    raise ValueError(
        f"--out-dir {out} already holds {', '.join(taken)}: choose another --out-dir or "
        "remove them"
    )
  other = {r.get("episodes", args.episodes) for r in earlier_results(out)} - {args.episodes}
  if other:
    raise ValueError(
        f"--out-dir {out} holds results scored on --episodes {sorted(other)[0]}; its table "
        f"takes one: give that --episodes, or another --out-dir"
    )
  return out


def earlier_results(out: pathlib.Path) -> list[dict]:
  """The results an earlier invocation wrote into `out` (results.json; [] if none), which
  this one adds its cases to."""
  path = out / "results.json"
  if not path.exists():
    return []
  results = read_json(path)
  if not isinstance(results, list) or not all(isinstance(r, dict) and "case" in r
                                              for r in results):  # fmt: skip
    raise ValueError(f"{path} is not a list of bench_defaults results")
  return results


def main(args: Args) -> list[dict]:
  with refusals():  # bad arguments: one line and exit code 2 (script_main), before any run
    out = check(args)
    earlier = [r for r in earlier_results(out) if r["case"] not in args.cases]
  out.mkdir(parents=True, exist_ok=True)
  results = list(earlier)  # an earlier invocation's cases (sql, before its sqil) are kept
  for name in args.cases:
    results.append(run_case(name, args, out))
    (out / "results.json").write_text(json.dumps(results, indent=1))
  text = table(results, args.episodes)
  (out / "results.md").write_text(text)
  print(text)
  return results


if __name__ == "__main__":
  script_main(lambda: parse_plain(Args, __doc__), main)
