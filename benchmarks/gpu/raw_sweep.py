"""Raw envpool stepping of an Atari task at several layouts: the ceiling of the table run.

    python benchmarks/gpu/raw_sweep.py --task Pong-v5 --configs 1x64:16:32 4x32 --out raw.json

A config is `KxN[:THREADS[:BATCH]]`: K pools of N environments with pre-drawn random actions
and nothing else (no policy, no learner). K = 1 is experiments/bench_envs.py's `raw_timer`:
one pool with envpool's `num_threads` THREADS (0: envpool's default) and batched stepping
(`recv`/`send` of BATCH environments) when BATCH < N. K > 1 is experiments/bench_async.py's
`raw_rate`: K pools stepped in K Python threads, the asynchronous actors' layout (THREADS and
BATCH: envpool's defaults). Each config is timed `--repeats` times for `--seconds`; the
median is kept. Writes OUT (JSON): every config's env steps/s and steps per CPU-second, and
the best.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import statistics
import sys
import time
from typing import Any
from typing import Callable

from offpolicy_ac.cli import check_output_file

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "experiments"))

_CONFIG = re.compile(r"^(\d+)x(\d+)(?::(\d+))?(?::(\d+))?$")


def parse_config(text: str) -> dict:
  """`KxN[:THREADS[:BATCH]]` as a dict (BATCH 0 or absent: N, every env every step)."""
  m = _CONFIG.match(text)
  if not m:
    raise ValueError(f"a raw config is KxN[:THREADS[:BATCH]], got {text!r}")
  pools, n = int(m.group(1)), int(m.group(2))
  threads, batch = int(m.group(3) or 0), int(m.group(4) or 0) or n
  if pools < 1 or n < 1 or not 1 <= batch <= n:
    raise ValueError(f"{text!r}: need K >= 1, N >= 1 and 1 <= BATCH <= N")
  if pools > 1 and (threads or batch != n):
    raise ValueError(f"{text!r}: K > 1 pools take envpool's default threads and batch")
  return {"config": text, "pools": pools, "envs_per_pool": n, "num_threads": threads,
          "batch_size": batch}  # fmt: skip


def measure(task: str, config: dict, seconds: float, seed: int) -> tuple[float, float]:
  """(env steps/s, env steps per CPU-second of the process) of one timing."""
  if config["pools"] == 1:
    import bench_envs

    args = bench_envs.Args(num_threads=config["num_threads"], seed=seed)
    timer = bench_envs.raw_timer(task, config["envs_per_pool"], config["batch_size"], args)
    return timer(seconds)
  import bench_async

  from offpolicy_ac.presets import impala

  k, n = config["pools"], config["envs_per_pool"]
  bench = bench_async._task(task, bench_async.Args(pong_envs=n, cartpole_envs=n), impala.PRESETS)
  out = bench_async.raw_rate(bench, k, n, seconds, seed)
  return out["env_steps_per_s"], out["steps_per_cpu_s"]


def _positive(kind: type) -> Callable[[str], Any]:
  def parse(text: str) -> Any:
    value = kind(text)
    if not value > 0:  # (NaN too)
      raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value

  parse.__name__ = kind.__name__  # argparse's "invalid float value"
  return parse


def main() -> dict:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--task", default="Pong-v5")
  parser.add_argument("--configs", nargs="+", required=True, help="KxN[:THREADS[:BATCH]] ...")
  parser.add_argument("--seconds", type=_positive(float), default=2.0)
  parser.add_argument("--repeats", type=_positive(int), default=1)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--out", type=pathlib.Path, default=None)
  args = parser.parse_args()
  try:  # refused before any stepping, as argparse refuses a flag
    configs = [parse_config(c) for text in args.configs for c in text.split()]
    if args.out:
      check_output_file("--out", args.out)
  except ValueError as e:
    parser.error(str(e))
  print(f"raw envpool stepping of {args.task}, {os.cpu_count()} CPU cores, "
        f"{args.seconds:g} s x {args.repeats} per config", flush=True)  # fmt: skip
  print(f"{'config':<16}{'pools':>6}{'envs':>6}{'threads':>8}{'batch':>7}{'env steps/s':>13}"
        f"{'steps/CPU-s':>13}", flush=True)  # fmt: skip
  results = []
  for config in configs:
    t0 = time.perf_counter()
    try:
      timings = [measure(args.task, config, args.seconds, args.seed) for _ in range(args.repeats)]
    except Exception as error:  # pylint: disable=broad-except
      print(f"{config['config']:<16} failed: {type(error).__name__}: {error}", flush=True)
      results.append({**config, "error": f"{type(error).__name__}: {error}"})
      continue
    row = {
        **config,
        "env_steps_per_s": statistics.median(t[0] for t in timings),
        "steps_per_cpu_s": statistics.median(t[1] for t in timings),
        "seconds_with_setup": time.perf_counter() - t0,
    }
    results.append(row)
    print(f"{row['config']:<16}{row['pools']:>6}{row['pools'] * row['envs_per_pool']:>6}"
          f"{row['num_threads']:>8}{row['batch_size']:>7}{row['env_steps_per_s']:>13,.0f}"
          f"{row['steps_per_cpu_s']:>13,.0f}", flush=True)  # fmt: skip
  measured = [r for r in results if "env_steps_per_s" in r]
  best = max(measured, key=lambda r: r["env_steps_per_s"]) if measured else None
  if best:
    print(f"best: {best['config']} at {best['env_steps_per_s']:,.0f} env steps/s", flush=True)
  out = {"task": args.task, "cpu_count": os.cpu_count(), "seconds": args.seconds,
         "repeats": args.repeats, "results": results, "best": best}  # fmt: skip
  if args.out:
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
  if not measured:
    parser.exit(1, "raw_sweep.py: no config could be measured (the errors are above)\n")
  return out


if __name__ == "__main__":
  main()
