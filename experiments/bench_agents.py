"""Benchmark: each agent on CartPole, 5 seeds, env steps and wall-clock to the target.

Cases (each run is a separate process launched by this script; wall-clock is
measured from process launch to stop, imports and compilation included):

* ``v0``: the DI-engine peer protocol -- CartPole-v0 (200-step limit), stop when
  the mean of 5 greedy evaluation episodes reaches 195, evaluating every 500
  env steps.
* ``v1``: CartPole-v1, stop when a greedy evaluation (5 episodes, every 5000
  steps) reaches 475 (SQIL: 450, with a budget of 200k steps); also
  finds the first env step where the trailing mean training return (3 log
  lines) reaches 475 (in results.json, not in the table: each run's
  "train_return_475_at", each case's "median_train_return_475_at").

SQIL learns from 10 demonstration episodes recorded from an SQL expert trained here
first (its steps and wall-clock are in results.json's "experts", not in the table).
Prints the table of medians over the seeds, a seed that never reached the target
counting as infinitely slow ("n/a" where the median seed did not reach it); writes
it (results.md), results.json (every run) and the learning curves
(learning_curves.png) into --out-dir.

    python experiments/bench_agents.py --seeds 0 1 2 3 4 --out-dir bench/agents
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
import subprocess
import sys
import time
from typing import Literal

import numpy as np

from offpolicy_ac import presets
from offpolicy_ac.cli import check_output_file
from offpolicy_ac.cli import parse_plain
from offpolicy_ac.cli import script_main
from offpolicy_ac.training import refusals

EXPERIMENTS = pathlib.Path(__file__).resolve().parent

# DI-engine 0.5.3 as the reference (env steps, seconds to 195 on CartPole-v0; medians of 5
# seeds, measured on a 2-core CPU; see results/cartpole/agents.md).
PEER_V0 = {
    "impala": (22_800, 12.0),
    "acer": (39_400, 14.8),
    "sql": (1_800, 8.4),
    "sqil": (600, 7.6),
}


@dataclasses.dataclass(frozen=True)
class Args:
  algorithms: tuple[Literal["impala", "acer", "sql", "sqil"], ...] = (
      "impala",
      "acer",
      "sql",
      "sqil",
  )
  """Agents to benchmark."""
  cases: tuple[Literal["v0", "v1"], ...] = ("v0", "v1")
  """Which protocols to run."""
  seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
  """Seeds per case."""
  out_dir: str = "bench/agents"
  """Where runs, the JSON, the markdown table and the PNG go."""
  expert_steps: int = 100_000
  """Training steps of the SQL experts whose greedy episodes SQIL imitates."""
  max_steps_v0: int = 100_000
  """Budget of a v0 run (a run that does not reach 195 counts as not reached)."""
  max_steps_v1: int = 500_000
  """Budget of a v1 run (SQIL's v1 runs: 200,000 steps, their own)."""


def _case_flags(case: str, args: Args, algo: str = "") -> list[str]:
  # SQL's and SQIL's defaults anneal the step size over the budget; a run to a target keeps
  # it constant, so that the budget does not change the run.
  constant = ["--learning-rate-cooldown", "0"] if algo in ("sql", "sqil") else []
  if case == "v1" and algo == "sqil":  # SQIL: stop at 450, with a budget of 200k steps
    return constant + [
        "--env-id",
        "CartPole-v1",
        "--eval-episodes",
        "5",
        "--eval-every",
        "5000",
        "--target-return",
        "450",
        "--total-env-steps",
        "200000",
        "--log-every",
        "5000",
    ]
  if case == "v0":
    # SQL and SQIL start from their scripts' cartpole-v0 presets (high replay ratio,
    # alpha 0.12, step size 3e-3); the protocol flags below are the same for all.
    preset = ["--preset", "cartpole-v0"] if algo in ("sql", "sqil") else []
    return preset + [
        "--env-id",
        "CartPole-v0",
        "--eval-episodes",
        "5",
        "--eval-every",
        "500",
        "--target-return",
        "195",
        "--total-env-steps",
        str(args.max_steps_v0),
    ]
  return constant + [
      "--env-id",
      "CartPole-v1",
      "--eval-episodes",
      "5",
      "--eval-every",
      "5000",
      "--target-return",
      "475",
      "--total-env-steps",
      str(args.max_steps_v1),
      "--log-every",
      "5000",
  ]


def _expert_flags(case: str, args: Args) -> list[str]:
  env_id = "CartPole-v0" if case == "v0" else "CartPole-v1"
  return ["--env-id", env_id, "--total-env-steps", str(args.expert_steps)]


def _demos_flags(algo: str, case: str, out: pathlib.Path) -> list[str]:
  return ["--demos", str(out / f"demos-{case}.npz")] if algo == "sqil" else []


def _run(script: str, flags: list[str], run_dir: pathlib.Path) -> dict:
  cmd = [sys.executable, str(EXPERIMENTS / f"{script}.py"), *flags, "--run-dir", str(run_dir)]
  start = time.perf_counter()
  proc = subprocess.run(cmd, capture_output=True, text=True)
  wall = time.perf_counter() - start
  if proc.returncode != 0:
    raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
  summary = json.loads((run_dir / "summary.json").read_text())
  lines = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
  returns = [
      (l["env_steps"], l["episode_return"]) for l in lines if l["episode_return"] is not None
  ]
  trailing = None
  for i in range(len(returns)):
    window = [r for _, r in returns[max(0, i - 2) : i + 1]]
    if len(window) == 3 and np.mean(window) >= 475:
      trailing = returns[i][0]
      break
  return {
      "env_steps": summary["env_steps"],
      "wall_s": wall,
      "reached": summary["target_reached_at"] is not None,
      "num_updates": summary["num_updates"],
      "updates_per_s": summary["num_updates"] / max(summary["wall_time_s"], 1e-9),
      "train_return_475_at": trailing,
      "run_dir": str(run_dir),
  }


def _median(xs):
  """The median over seeds, None (the target not reached) counting as infinite: None when
  the median seed did not reach it (the median of the seeds that did would flatter)."""
  if not xs:
    return None
  median = float(np.median([math.inf if x is None else x for x in xs]))
  return median if math.isfinite(median) else None


def check(args: Args) -> pathlib.Path:
  """Refuses (ValueError) bad arguments and an --out-dir that holds their runs or cannot
  hold them, before any run; returns the --out-dir."""
  for flag, values in (("--algorithms", args.algorithms), ("--cases", args.cases),
                       ("--seeds", args.seeds)):  # fmt: skip
    if not values or len(set(values)) < len(values):
      raise ValueError(f"{flag} needs at least one value, each once; got {list(values)}")
  if min(args.seeds) < 0:
    raise ValueError(f"--seeds must be >= 0, got {list(args.seeds)}")
  for flag, value in (("--expert-steps", args.expert_steps),
                      ("--max-steps-v0", args.max_steps_v0),
                      ("--max-steps-v1", args.max_steps_v1)):  # fmt: skip
    if value < 1:
      raise ValueError(f"{flag} must be >= 1, got {value}")
  runs = [("sql", _expert_flags(case, args)) for case in args.cases if "sqil" in args.algorithms]
  runs += [(a, _case_flags(c, args, a) + _demos_flags(a, c, pathlib.Path(".")))
           for a in args.algorithms for c in args.cases]  # fmt: skip
  for algo, flags in runs:  # e.g. a budget below one iteration, refused before any run
    presets.check_command(algo, flags)
  out = check_output_file("--out-dir", pathlib.Path(args.out_dir) / "results.json").parent
  planned = [f"{a}-{c}-seed{s}" for a in args.algorithms for c in args.cases for s in args.seeds]
  if "sqil" in args.algorithms:
    planned += [f"expert-sql-{c}" for c in args.cases]
  taken = [name for name in planned if (out / name).exists()]
  if taken:
    raise ValueError(
        f"--out-dir {out} already holds {', '.join(taken)}: choose another --out-dir or "
        "remove them"
    )
  return out


def main(args: Args) -> dict:
  with refusals():  # bad arguments: one line and exit code 2 (script_main), before any run
    out = check(args)
  out.mkdir(parents=True, exist_ok=True)
  results: dict = {}
  experts: dict = {}
  if "sqil" in args.algorithms:
    for case in args.cases:
      expert_dir = out / f"expert-sql-{case}"
      experts[case] = _run("sql", _expert_flags(case, args), expert_dir)
      subprocess.run(
          [
              sys.executable,
              str(EXPERIMENTS / "record_demos.py"),
              "--run-dir",
              str(expert_dir),
              "--episodes",
              "10",
              "--out",
              str(out / f"demos-{case}.npz"),
          ],
          check=True,
      )
  for algo in args.algorithms:
    for case in args.cases:
      runs = []
      for seed in args.seeds:
        flags = _case_flags(case, args, algo) + _demos_flags(algo, case, out)
        flags += ["--seed", str(seed)]
        run = _run(algo, flags, out / f"{algo}-{case}-seed{seed}")
        runs.append(run)
        print(
            f"{algo:6s} {case} seed {seed}: {run['env_steps']:>7d} steps "
            f"{run['wall_s']:6.1f} s reached={run['reached']}",
            flush=True,
        )
      results[f"{algo}-{case}"] = {
          "runs": runs,
          "reached": sum(r["reached"] for r in runs),
          "median_env_steps": _median([r["env_steps"] if r["reached"] else None for r in runs]),
          "median_wall_s": _median([r["wall_s"] if r["reached"] else None for r in runs]),
          "median_updates_per_s": _median([r["updates_per_s"] for r in runs]),
          "median_train_return_475_at": _median([r["train_return_475_at"] for r in runs]),
      }
  (out / "results.json").write_text(json.dumps({"results": results, "experts": experts}, indent=1))
  table = _table(results, len(args.seeds))
  (out / "results.md").write_text(table)
  print(table)
  _plot(results, out / "learning_curves.png")
  return results


def _table(results: dict, num_seeds: int) -> str:
  rows = [
      "| agent | case | reached | median env steps | median wall s | peer steps | "
      "peer wall s | updates/s |",
      "|---|---|---|---|---|---|---|---|",
  ]
  for name, r in results.items():
    algo, case = name.split("-")
    peer = PEER_V0.get(algo) if case == "v0" else None
    fmt = lambda x, f: "n/a" if x is None else f.format(x)
    rows.append(
        f"| {algo} | {case} | {r['reached']}/{num_seeds} | "
        f"{fmt(r['median_env_steps'], '{:,.0f}')} | {fmt(r['median_wall_s'], '{:.1f}')} | "
        f"{fmt(peer and peer[0], '{:,}')} | {fmt(peer and peer[1], '{:.1f}')} | "
        f"{fmt(r['median_updates_per_s'], '{:.0f}')} |"
    )
  return "\n".join(rows) + "\n"


def _plot(results: dict, path: pathlib.Path) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  cases = sorted({name.split("-")[1] for name in results})
  fig, axes = plt.subplots(1, len(cases), figsize=(6 * len(cases), 4), squeeze=False)
  for ax, case in zip(axes[0], cases):
    for name, r in results.items():
      algo, c = name.split("-")
      if c != case:
        continue
      curves = []
      for run in r["runs"]:
        lines = [
            json.loads(l)
            for l in (pathlib.Path(run["run_dir"]) / "metrics.jsonl").read_text().splitlines()
        ]
        pts = [(l["env_steps"], l["eval_return"]) for l in lines if "eval_return" in l]
        if pts:
          curves.append(np.asarray(pts, float))
      if not curves:
        continue
      end = max(c[-1, 0] for c in curves)
      grid = np.linspace(0, end, 100)
      # a run that stopped at the target holds its last evaluation
      ys = np.stack([np.interp(grid, c[:, 0], c[:, 1]) for c in curves])
      (line,) = ax.plot(grid, np.median(ys, 0), label=f"{algo} (median of {len(curves)})")
      ax.fill_between(grid, ys.min(0), ys.max(0), alpha=0.15, color=line.get_color())
    ax.axhline(195 if case == "v0" else 475, color="k", ls="--", lw=0.8)
    ax.set_title(f"CartPole-{case}: greedy evaluation return")
    ax.set_xlabel("environment steps")
    ax.set_ylabel("mean return of 5 greedy episodes")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


if __name__ == "__main__":
  script_main(lambda: parse_plain(Args, __doc__), main)
