"""Smoke test of experiments/bench_mujoco.py (a benchmark script, not a timed test): tiny
budgets, the report's structure, never the speeds."""

import pytest
from scripts import load_script


def test_bench_mujoco_times_each_agent_against_raw_stepping(capsys):
  bench = load_script("bench_mujoco")
  rows = bench.main(bench.Args(tasks=("Hopper-v4",), agents=("impala", "sql"), env_steps=2_048,
                               sql_env_steps=1_024, raw_seconds=0.05, repeats=1))  # fmt: skip
  assert [(r["agent"], r["preset"], r["num_envs"]) for r in rows] == [
      ("impala", "mujoco", 16),
      ("sql", "hopper", 16),
  ]
  for row in rows:
    assert row["raw_steps_per_s"] > 0 and row["agent_steps_per_s"] > 0
    assert row["agent_s_per_1m"] == pytest.approx(1e6 / row["agent_steps_per_s"])
  table = capsys.readouterr().out.split("agent/raw")[-1]
  assert "Hopper-v4       impala  mujoco" in table and "Hopper-v4       sql     hopper" in table


@pytest.mark.parametrize(
    "kwargs, message",
    [({"agents": ("sqil",)}, "agents must be among"),
     ({"tasks": ("Pong-v5",)}, "Atari task"),
     ({"env_steps": 10}, "env_steps must be at least")],
)  # fmt: skip
def test_bench_mujoco_refuses_bad_arguments(kwargs, message):
  bench = load_script("bench_mujoco")
  with pytest.raises(ValueError, match=message):
    bench.main(bench.Args(**kwargs))
