"""Smoke test of experiments/bench_sql_update.py (a benchmark script, not a timed test)."""

import jax
import numpy as np
import pytest
from scripts import load_script

from offpolicy_ac import envs
from offpolicy_ac.agents import SqlConfig
from offpolicy_ac.agents.sql_continuous import make_sql_continuous


def test_bench_sql_update_times_every_layout():
  bench = load_script("bench_sql_update")
  args = bench.Args(env_id="Pendulum-v1", num_seeds=2, windows=4, hidden_sizes=(8,),
                    num_particles=4, num_value_samples=4, repeats=1, rounds=2)  # fmt: skip
  rows = bench.main(args)
  assert [row["num_q_networks"] for row in rows] == [1, 2]
  for row in rows:
    assert all(row[name] > 0 for name in bench.LAYOUTS)
    assert row["calls_speedup"] == row["vmapped"] / row["calls"]


def test_the_layouts_update_to_the_same_states():
  """What the benchmark compares differs in time only: every layout's updated states are
  the vmapped layout's."""
  bench = load_script("bench_sql_update")
  spec = envs.spec("Pendulum-v1")
  config = SqlConfig(hidden_sizes=(8,), num_particles=4, num_value_samples=4, num_q_networks=2)
  agent = make_sql_continuous(spec, config)
  keys = jax.random.split(jax.random.PRNGKey(0), 2)
  states = jax.vmap(agent.init)(keys)
  batches = jax.vmap(lambda k: bench.random_batch(k, spec, 4, 2))(keys)
  assert np.all(np.abs(batches.action) <= 2.0)
  cases = bench.layout_cases(agent, states, batches)
  assert set(cases) == set(bench.LAYOUTS)
  updated = {name: step(s, b) for name, (step, s, b) in cases.items()}
  updated["calls"] = jax.tree.map(lambda *xs: np.stack(xs), *updated["calls"])
  for name in ("mapped", "calls"):
    pairs = zip(jax.tree.leaves(updated["vmapped"].params), jax.tree.leaves(updated[name].params))
    for a, b in pairs:
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("field", ["num_seeds", "windows", "repeats", "rounds"])
def test_bench_sql_update_refuses_empty_settings(field):
  bench = load_script("bench_sql_update")
  with pytest.raises(ValueError, match=f"{field} must be at least 1"):
    bench.main(bench.Args(**{field: 0}))
