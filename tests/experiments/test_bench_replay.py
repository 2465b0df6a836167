"""Smoke test of experiments/bench_replay.py (a benchmark script, not a timed test)."""

import numpy as np
import pytest
from scripts import load_script

from offpolicy_ac import envs
from offpolicy_ac.presets import acer
from offpolicy_ac.presets import sql


def test_bench_replay_times_both_variants_on_every_case():
  bench = load_script("bench_replay")
  rows = bench.main(bench.Args(repeats=1))
  assert [row["case"] for row in rows] == [case[0] for case in bench.CASES]
  assert rows[0]["buffer_gb"] > 1.0  # the Atari preset's buffer: 1.5 GB of frames
  for row in rows:
    assert row["copied"] > 0 and row["donated"] > 0
    assert row["ratio"] == row["copied"] / row["donated"]


def test_bench_replay_cases_are_the_presets_buffers():
  """Each case is its preset's buffer as a run holds it: capacity, unroll, environments,
  windows sampled, and the observations' shape and dtype as the environment gives them
  (MinAtar's were timed as bool, a quarter of the float32 a run stores)."""
  pytest.importorskip("gymnax")
  bench = load_script("bench_replay")
  for case, (module, preset) in zip(bench.CASES, [(acer, "atari"), (sql, "minatar")]):
    flat = module.PRESETS[preset].train.fields_by_name()
    env_id = flat["env_id"]
    spec = (envs.make_functional(env_id).spec if envs.is_functional(env_id)
            else envs.spec(env_id, atari=flat["atari"]))  # fmt: skip
    _, capacity, unroll, columns, windows, shape, dtype = case
    assert (capacity, unroll, columns, windows) == (
        flat["replay_capacity"],
        flat["unroll_length"],
        flat["num_envs"],
        flat["mini_batch_size"],
    ), case[0]
    assert (shape, np.dtype(dtype)) == (tuple(spec.observation_shape),
                                        np.dtype(spec.observation_dtype)), case[0]  # fmt: skip
