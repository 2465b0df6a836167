"""Launch to target: seconds from launching a script to its first greedy evaluation at or
above the target, with a cold and with a warm compilation cache.

    python experiments/bench_launch.py                  # IMPALA on gymnax CartPole-v1
    python experiments/bench_launch.py --agent sql --seeds 0 1 2

Each run is its own process, `experiments/<agent>.py --env-id <env-id> --seed <s>` with the
preset the env id selects, launched by this script; a run's time is from launching it to
reading (unbuffered stdout) the log line whose evaluation return reaches the target, so
the interpreter's start, the imports, compilation and the evaluations are all in it.

* **cold**: an empty compilation cache (a fresh directory per seed): everything compiles.
* **warm**: the same directory again, for a second run of the same seed: the programs load
  from JAX's persistent compilation cache (`training.experiment.enable_compilation_cache`).

Prints each run and the medians; writes `<out-dir>/launch-<date>-<time>.json` (a run
directory's names carry the same stamp, so that runs into one --out-dir keep theirs).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib
import re
import statistics
import subprocess
import sys
import threading
import time
from typing import Annotated
from typing import Optional

import tyro

from offpolicy_ac import presets
from offpolicy_ac.cli import check_output_file
from offpolicy_ac.cli import parse_plain
from offpolicy_ac.cli import script_main
from offpolicy_ac.training import refusals

EXPERIMENTS = pathlib.Path(__file__).resolve().parent
AGENTS = ("impala", "acer", "sql")
_LINE = re.compile(r"steps\s+(\d+)\s.*\|\s+eval\s+(-?[\d.]+|nan)")


@dataclasses.dataclass(frozen=True)
class Args:
  agent: str = "impala"
  """The script to launch: impala, acer or sql."""
  env_id: str = "gymnax:CartPole-v1"
  """--env-id of every run (its preset applies)."""
  target: float = 475.0
  """The evaluation return to reach."""
  seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
  """One cold and one warm run per seed."""
  flags: Annotated[tuple[str, ...], tyro.conf.UseAppendAction] = ()
  """More flags for every run, one per --flags: --flags=--total-env-steps=100000
  --flags=--compile-for=speed."""
  out_dir: str = "bench/launch"
  """Run directories, compilation caches and launch-<date>-<time>.json go here."""
  timeout_s: float = 600.0
  """Longest a run may take."""


def _flags(args: Args, seed: int) -> list[str]:
  """A run's command line, without --run-dir."""
  return ["--env-id", args.env_id, "--seed", str(seed), "--target-return", str(args.target),
          *args.flags]  # fmt: skip


def launch(args: Args, seed: int, run_dir: pathlib.Path, cache: pathlib.Path) -> dict:
  """One run: seconds from launch to the target's log line (None: not reached) and to exit."""
  cmd = [sys.executable, str(EXPERIMENTS / f"{args.agent}.py"), *_flags(args, seed),
         "--run-dir", str(run_dir)]  # fmt: skip
  env = dict(os.environ, PYTHONUNBUFFERED="1", JAX_COMPILATION_CACHE_DIR=str(cache))
  start = time.perf_counter()
  proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env=env)  # fmt: skip
  timer = threading.Timer(args.timeout_s, proc.kill)  # a hung run ends the read below
  timer.start()
  target_s, target_steps, tail = None, None, []
  for line in proc.stdout:
    tail = (tail + [line])[-20:]
    match = _LINE.search(line)
    if target_s is None and match and match.group(2) != "nan":
      if float(match.group(2)) >= args.target:
        target_s, target_steps = time.perf_counter() - start, int(match.group(1))
  code = proc.wait()
  timer.cancel()
  exit_s = time.perf_counter() - start
  if exit_s >= args.timeout_s:
    raise RuntimeError(f"{' '.join(cmd)} ran past --timeout-s {args.timeout_s:g} s:\n"
                       f"{''.join(tail)}")  # fmt: skip
  if code != 0:
    raise RuntimeError(f"{' '.join(cmd)} failed ({code}):\n{''.join(tail)}")
  return {"seed": seed, "target_s": target_s, "target_env_steps": target_steps, "exit_s": exit_s}


def _median(rows: list[dict], key: str) -> Optional[float]:
  """The median over seeds, None (the target not reached) counting as infinite: None when
  the median seed did not reach it (the median of the seeds that did would flatter)."""
  if not rows:
    return None
  median = statistics.median(math.inf if r[key] is None else r[key] for r in rows)
  return median if math.isfinite(median) else None


def main(args: Args) -> dict:
  stamp = time.strftime("%Y%m%d-%H%M%S")
  with refusals():  # bad arguments: one line and exit code 2 (script_main), before any run
    if args.agent not in AGENTS:
      raise ValueError(f"--agent must be one of {AGENTS}, got {args.agent!r}")
    if not args.seeds or len(set(args.seeds)) < len(args.seeds) or min(args.seeds) < 0:
      raise ValueError(f"--seeds needs at least one seed, each once and >= 0; got {args.seeds}")
    if not (math.isfinite(args.timeout_s) and args.timeout_s > 0):
      raise ValueError(f"--timeout-s must be > 0, got {args.timeout_s}")
    if not math.isfinite(args.target):
      raise ValueError(f"--target must be finite, got {args.target}")
    presets.check_command(args.agent, _flags(args, args.seeds[0]))  # e.g. --flags
    report_path = pathlib.Path(args.out_dir) / f"launch-{stamp}.json"
    out = check_output_file("--out-dir", report_path).parent
  results: dict[str, list[dict]] = {"cold": [], "warm": []}
  for seed in args.seeds:
    cache = out / f"cache-{stamp}-seed{seed}"  # empty: the cold run compiles everything
    for case in ("cold", "warm"):
      row = launch(args, seed, out / f"{case}-{stamp}-seed{seed}", cache)
      results[case].append(row)
      reached = "not reached" if row["target_s"] is None else f"{row['target_s']:.2f} s"
      print(f"[bench_launch] {case} seed {seed}: target {reached} "
            f"(env step {row['target_env_steps']}), exit {row['exit_s']:.2f} s", flush=True)  # fmt: skip
  summary = {
      case: {"median_target_s": _median(rows, "target_s"),
             "median_exit_s": _median(rows, "exit_s"),
             "reached": sum(r["target_s"] is not None for r in rows), "runs": len(rows)}
      for case, rows in results.items()
  }  # fmt: skip
  print(f"{args.agent} {args.env_id}, target {args.target}, {len(args.seeds)} seeds:")
  for case, s in summary.items():
    target = "-" if s["median_target_s"] is None else f"{s['median_target_s']:.2f} s"
    print(f"  {case}: launch to target {target} (median; reached {s['reached']}/{s['runs']}), "
          f"launch to exit {s['median_exit_s']:.2f} s")  # fmt: skip
  report = {"args": dataclasses.asdict(args), "runs": results, "summary": summary}
  out.mkdir(parents=True, exist_ok=True)
  (out / report_path.name).write_text(json.dumps(report, indent=2))
  print(f"wrote {out / report_path.name}")
  return report


if __name__ == "__main__":
  script_main(lambda: parse_plain(Args, __doc__), main)
