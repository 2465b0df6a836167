"""Every agent learns gymnax's CartPole as one compiled program (`training.make_train`),
started from its script as a user would: reduced budgets in CI, full ones marked slow."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from offpolicy_ac import presets
from offpolicy_ac.training import read_metrics

pytest.importorskip("gymnax")

CARTPOLE = "gymnax:CartPole-v1"


def _main(script, run_dir, preset=None, agent=None, **fields):
  module = getattr(presets, script)
  args = module.PRESETS[preset] if preset else module.Args()
  if not preset:
    fields = {"env_id": CARTPOLE, **fields}
  train = args.train.replace(**fields)
  agent = dataclasses.replace(args.agent, **(agent or {}))
  return module.run(dataclasses.replace(args, train=train, agent=agent, run_dir=str(run_dir)))


# (script, budget): each reached an evaluation return of 500 on this CPU within about half
# of its budget (IMPALA ~20k env steps, ACER ~10k, SQL ~100k).
BUDGETS = [("impala", 60_000), ("acer", 30_000), ("sql", 200_000)]


@pytest.mark.parametrize("script, budget", BUDGETS, ids=[s for s, _ in BUDGETS])
def test_each_agent_learns_gymnax_cartpole_in_a_reduced_budget(tmp_path, script, budget):
  result = _main(script, tmp_path / script, total_env_steps=budget, log_every=budget // 10,
                 eval_every=budget // 10, target_return=195.0, checkpoint_every=0)  # fmt: skip
  assert result.target_reached_at is not None, read_metrics(tmp_path / script)[-3:]
  assert result.env_steps <= budget + budget // 10


@pytest.mark.slow
@pytest.mark.parametrize("script, budget", BUDGETS, ids=[s for s, _ in BUDGETS])
def test_each_agent_reaches_475_on_gymnax_cartpole_over_five_vmapped_seeds(tmp_path, script,
                                                                          budget):  # fmt: skip
  """Five seeds in one program; every seed's greedy policy reaches 475 (CartPole-v1's
  'solved' threshold) within twice the reduced budget."""
  results = _main(script, tmp_path / script, total_env_steps=2 * budget, num_seeds=5,
                  log_every=budget // 10, eval_every=budget // 10, target_return=475.0,
                  checkpoint_every=0)  # fmt: skip
  best = [max(l.get("eval_return") or 0 for l in read_metrics(tmp_path / script / f"seed{s}"))
          for s in range(5)]  # fmt: skip
  assert min(best) >= 475, best
  assert len(results) == 5


def test_the_gymnax_cartpole_preset_ends_solved(tmp_path):
  """`impala.py --preset gymnax-cartpole` trains its 200k env steps with the step size
  annealed to 0 (the compiled program trains the agent config the script derives), and
  its final greedy policy scores 475 or more."""
  result = _main("impala", tmp_path / "preset", preset="gymnax-cartpole")
  assert result.env_steps >= 200_000 and result.last_eval_return >= 475
  counts = [int(x) for x in jax.tree.leaves(result.agent_state.opt_state)
            if jnp.ndim(x) == 0 and jnp.issubdtype(x.dtype, jnp.integer)]  # fmt: skip
  assert counts.count(result.num_updates) == 2  # Adam's and the annealing schedule's
  lines = read_metrics(tmp_path / "preset")
  assert np.isfinite([l["loss"] for l in lines]).all()


def test_continuous_sql_learns_gymnax_pendulum_in_a_reduced_budget(tmp_path):
  """sql.py's pendulum preset on gymnax's Pendulum (random play returns about -1200)."""
  _main("sql", tmp_path / "sql", preset="pendulum", env_id="gymnax:Pendulum-v1",
        total_env_steps=10_000, checkpoint_every=0)  # fmt: skip
  best = max(l["eval_return"] for l in read_metrics(tmp_path / "sql") if l.get("eval_return"))
  assert best > -500, best


# brax's inverted pendulum (reward 1 per step upright, time limit 1000): the greedy policy
# of a fresh network keeps it up for 40 to 75 steps. (script, preset, fields, budget, bar):
# IMPALA with its MuJoCo preset, ACER with its defaults. Six seeds on this CPU, evaluated
# every 10k env steps, first passed their bar at 10k to 40k (IMPALA) and 30k to 70k env
# steps (ACER): each budget is at least twice the latest.
BRAX = [
    ("impala", "mujoco", {}, 100_000, 250.0),
    ("acer", None, {"unroll_length": 16, "reward_scale": 0.1}, 150_000, 120.0),
]


@pytest.mark.parametrize("script, preset, fields, budget, bar", BRAX, ids=[b[0] for b in BRAX])
def test_continuous_agents_learn_brax_inverted_pendulum_in_a_reduced_budget(
    tmp_path, script, preset, fields, budget, bar
):
  pytest.importorskip("brax")
  result = _main(script, tmp_path / script, preset=preset, env_id="brax:inverted_pendulum",
                 num_envs=32, total_env_steps=budget, log_every=10_000, eval_every=10_000,
                 target_return=bar, checkpoint_every=0, **fields)  # fmt: skip
  best = max(l.get("eval_return") or 0 for l in read_metrics(tmp_path / script))
  assert result.target_reached_at is not None, best


@pytest.mark.parametrize("script", ["impala", "acer"])
def test_the_brax_presets_start_and_train(tmp_path, script):
  """The `brax` presets (halfcheetah on a GPU, docs/benchmarks.md) as they are, on brax's
  inverted pendulum (it compiles in a fraction of halfcheetah's time on this CPU), for two
  log lines: every loss is finite and every unroll is followed by its updates (ACER's
  replayed ones too)."""
  pytest.importorskip("brax")
  module = getattr(presets, script)
  preset = module.PRESETS["brax"].train
  per_log = 4 * preset.env.num_envs * preset.env.unroll_length
  results = _main(script, tmp_path / script, preset="brax", env_id="brax:inverted_pendulum",
                  total_env_steps=2 * per_log, log_every=per_log, eval_every=per_log,
                  checkpoint_every=0)  # fmt: skip
  lines = read_metrics(tmp_path / script)
  assert [l["env_steps"] for l in lines] == [per_log, 2 * per_log]
  assert np.isfinite([l["loss"] for l in lines]).all()
  assert all(np.isfinite(l["eval_return"]) for l in lines)
  replayed = getattr(module.PRESETS["brax"].agent, "replay_ratio", 0)
  assert results.num_updates == 8 * (1 + replayed)  # 8 unrolls, each with its updates


# (script, greedy return measured here at 400k env steps, one seed): a fresh network scores
# about 1 on Asterix-MinAtar.
MINATAR_MEASURED = [("acer", 17.4), ("sql", 12.8)]


@pytest.mark.parametrize("script, measured", MINATAR_MEASURED)
def test_the_minatar_preset_learns_asterix_in_a_reduced_budget(tmp_path, script, measured):
  """The script's minatar preset, one seed, 400k of its 10M env steps, clears 5."""
  _main(script, tmp_path / script, preset="minatar", env_id="gymnax:Asterix-MinAtar",
        total_env_steps=400_000, log_every=100_000, eval_every=100_000,
        checkpoint_every=0)  # fmt: skip
  best = max(l.get("eval_return") or 0 for l in read_metrics(tmp_path / script))
  assert best >= 5.0, (best, measured)
