"""Smoke test of experiments/bench_envs.py (a benchmark script, not a timed test).

Runs the script in a fresh process (it sets a JAX option that must precede any JAX work)
with tiny budgets and checks the report's structure, never the speeds.
"""

import pathlib
import subprocess
import sys

SCRIPT = pathlib.Path(__file__).parents[2] / "experiments" / "bench_envs.py"


def test_bench_envs_runs_every_backend_in_both_modes():
  cmd = [
      sys.executable,
      str(SCRIPT),
      "--tasks",
      "CartPole-v1",
      "--cartpole-envs",
      "8",
      "--cartpole-seconds",
      "0.05",
      "--repeats",
      "1",
      "--unroll-length",
      "4",
  ]
  proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
  rows = {
      line.split()[1]: line.split()
      for line in proc.stdout.splitlines()
      if line.startswith("CartPole-v1")
  }
  assert set(rows) == {"sync", "batched"}
  for mode, row in rows.items():
    envs_, batch = int(row[2]), int(row[3])
    assert envs_ == 8 and batch == (8 if mode == "sync" else 4)
    # raw, rollout, ratio, xla rollout, ratio, then steps per CPU-second of each.
    numbers = [float(x.rstrip(",").replace(",", "")) for x in row[4:9]]
    assert all(x > 0 for x in numbers), row
