"""Smoke test of experiments/bench_async.py (a benchmark script, not a timed test).

Runs the script in a fresh process (it sets a JAX option that must precede any JAX work)
with tiny budgets and checks the report's structure, never the speeds.
"""

import json
import pathlib
import subprocess
import sys

import pytest

SCRIPT = pathlib.Path(__file__).parents[2] / "experiments" / "bench_async.py"


def test_bench_async_runs_with_tiny_budgets(tmp_path):
  out = tmp_path / "async_cpu"
  cmd = [
      sys.executable,
      str(SCRIPT),
      "--tasks",
      "CartPole-v1",
      "--cartpole-steps",
      "6000",
      "--repeats",
      "1",
      "--raw-seconds",
      "0.2",
      "--probe-seconds",
      "0.05",
      "--out",
      str(out),
  ]
  proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
  assert "goal async >= 1.5 x sync" in proc.stdout
  assert "goal async_xla >= 1.5 x sync_xla" in proc.stdout  # the same rollout's sync
  text = (tmp_path / "async_cpu.txt").read_text()
  assert "CartPole-v1" in text and "raw 2 pools x 16" in text
  result = json.loads((tmp_path / "async_cpu.json").read_text())["tasks"]["CartPole-v1"]
  medians = result["medians"]
  for name in (
      "raw_1xN",
      "raw_1xKN",
      "raw_KxN",
      "sync",
      "sync_pools",
      "async",
      "async_nolearn",
      "sync_xla",
      "async_xla",
      "async_xla_nolearn",
  ):
    assert medians[name]["env_steps_per_s"] > 0, name
  for name in (
      "sync",
      "sync_pools",
      "async",
      "async_nolearn",
      "sync_xla",
      "async_xla",
      "async_xla_nolearn",
  ):
    assert medians[name]["updates_per_s"] > 0, name
  for name in ("async", "async_xla"):
    assert 0 <= medians[name]["dropped_fraction"] <= 1
    assert 0 <= medians[name]["policy_lag"] <= 4  # max_policy_lag
  # /sync compares the env steps learned from (an async run's dropped trajectories left
  # out), /raw the env steps taken.
  async_, sync = medians["async"], medians["sync"]
  assert result["ratios"]["async"]["vs_sync"] == pytest.approx(
      async_["used_env_steps_per_s"] / sync["env_steps_per_s"]
  )
  async_xla, sync_xla = medians["async_xla"], medians["sync_xla"]
  assert result["ratios"]["async_xla"]["vs_sync"] == pytest.approx(
      async_xla["used_env_steps_per_s"] / sync_xla["env_steps_per_s"]
  )
  assert result["ratios"]["async"]["vs_raw_KxN"] == pytest.approx(
      async_["env_steps_per_s"] / medians["raw_KxN"]["env_steps_per_s"]
  )
  assert "learned/s" in text
  assert result["probe"]["unroll_s"] > 0 and result["probe"]["update_s"] > 0
