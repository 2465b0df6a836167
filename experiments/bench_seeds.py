"""Benchmark: `--num-seeds N` with one vmapped learner vs the seeds one after the other.

Each variant is one process of an experiment script (`--num-seeds N --vmap-seeds` and
`--no-vmap-seeds`), timed from launch to exit (imports, compilation and environment
creation included), interleaved over `repeats` rounds; prints medians and the ratio.
Both variants train the same seeds on the same data (tests/training/test_seeds.py checks
that each vmapped seed is its single run), so only the time differs, up to float rounding:
a vmapped update may round differently, and over a long run that can change which episodes
happen (the final returns printed can differ in a seed).

    python experiments/bench_seeds.py --script impala --num-seeds 4 --total-env-steps 50000
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Literal

from offpolicy_ac import presets
from offpolicy_ac.cli import check_output_file
from offpolicy_ac.cli import check_suffix
from offpolicy_ac.cli import parse_plain
from offpolicy_ac.cli import script_main
from offpolicy_ac.training import refusals

EXPERIMENTS = pathlib.Path(__file__).resolve().parent


@dataclasses.dataclass(frozen=True)
class Args:
  script: Literal["impala", "acer", "sql"] = "impala"
  """Experiment script."""
  env_id: str = "CartPole-v1"
  """Task of every run."""
  num_seeds: int = 4
  """Seeds of each run (at least 2)."""
  total_env_steps: int = 50_000
  """Env steps of each seed."""
  repeats: int = 3
  """Rounds of the two variants, interleaved (medians are reported)."""
  out: str = ""
  """Also write the report to this file."""


def _flags(args: Args, vmap: bool) -> list[str]:
  """A run's command line, without --run-dir."""
  return [
      "--env-id",
      args.env_id,
      "--num-seeds",
      str(args.num_seeds),
      "--total-env-steps",
      str(args.total_env_steps),
      "--checkpoint-every",
      "0",
      "--eval-every",  # time the training alone, as before evaluation was on by default
      "0",
      "--log-every",
      str(args.total_env_steps // 4),
      "--vmap-seeds" if vmap else "--no-vmap-seeds",
  ]


def _run(args: Args, vmap: bool, run_dir: pathlib.Path) -> float:
  cmd = [sys.executable, str(EXPERIMENTS / f"{args.script}.py"), *_flags(args, vmap),
         "--run-dir", str(run_dir)]  # fmt: skip
  start = time.perf_counter()
  proc = subprocess.run(cmd, capture_output=True, text=True)
  if proc.returncode != 0:
    raise RuntimeError(f"{' '.join(cmd[1:])} failed:\n{proc.stderr[-4000:]}")
  return time.perf_counter() - start


def main(args: Args) -> dict:
  with refusals():  # bad arguments: one line and exit code 2 (script_main), before any run
    if args.num_seeds < 2 or args.repeats < 1 or args.total_env_steps < 4:
      raise ValueError("--num-seeds must be >= 2, --repeats >= 1, --total-env-steps >= 4")
    for vmap in (True, False):  # e.g. a budget below one iteration
      presets.check_command(args.script, _flags(args, vmap))
    out = None
    if args.out:
      out = check_output_file("--out", args.out)
      check_suffix("--out", out, ".txt", "text")
  times = {"vmapped": [], "sequential": []}
  returns = {}
  with tempfile.TemporaryDirectory() as tmp:
    for r in range(args.repeats):
      for name in times:
        run_dir = pathlib.Path(tmp) / f"{name}{r}"
        times[name].append(_run(args, name == "vmapped", run_dir))
        finals = []
        for k in range(args.num_seeds):
          lines = (run_dir / f"seed{k}" / "metrics.jsonl").read_text().splitlines()
          finals.append(json.loads(lines[-1])["episode_return"])
        returns[name] = finals
  med = {k: statistics.median(v) for k, v in times.items()}
  show = lambda xs: ", ".join("none" if x is None else f"{x:.1f}" for x in xs)
  report = (
      f"{args.script} {args.env_id}: {args.num_seeds} seeds x {args.total_env_steps} "
      f"env steps, medians of {args.repeats} (launch to exit)\n"
      f"  vmapped learner : {med['vmapped']:7.1f} s  ({show(times['vmapped'])})\n"
      f"  one after other : {med['sequential']:7.1f} s  ({show(times['sequential'])})\n"
      f"  speed-up        : {med['sequential'] / med['vmapped']:.2f}x\n"
      f"  final returns (vmapped)   : {show(returns['vmapped'])}\n"
      f"  final returns (sequential): {show(returns['sequential'])}\n"
  )
  print(report)
  if out is not None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(report)
  return {"times": times, "median": med}


if __name__ == "__main__":
  script_main(lambda: parse_plain(Args, __doc__), main)
