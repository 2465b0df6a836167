"""Benchmark: continuous SQL's update for N seeds, vmapped or one seed after the other.

Times one jitted update of `make_sql_continuous` (sqil.py's halfcheetah shapes by default:
(128, 128) networks, 16 value samples from the mixture proposal, 16 SVGD particles, 64
windows of 2 transitions) for 1 and 2 Q networks, in one process, laid out three ways:

* vmapped -- `jit(vmap(update))` over the N seeds' states and batches (`--num-seeds N`),
* mapped  -- `jit(lax.map(update))`: the seeds one after the other in one program,
* calls   -- N calls of `jit(update)`, one per seed (`--num-seeds N --no-vmap-seeds`).

Prints the median milliseconds per seed and update (the median of `rounds` interleaved
rounds of `repeats` updates) and each layout's speed relative to vmapped. The values are
the same in every layout (tests/training/test_seeds.py checks that a vmapped seed is its
single run); only the time differs. This machine is noisy: compare the ratios.

    python experiments/bench_sql_update.py
    python experiments/bench_sql_update.py --num-seeds 8 --windows 128
"""

from __future__ import annotations

import dataclasses
import statistics
import time

import jax
import jax.numpy as jnp

from offpolicy_ac import envs
from offpolicy_ac.agents import SqlConfig
from offpolicy_ac.agents.sql_continuous import make_sql_continuous
from offpolicy_ac.cli import parse_plain
from offpolicy_ac.cli import script_main
from offpolicy_ac.envs import Trajectory
from offpolicy_ac.training import refusals

LAYOUTS = ("vmapped", "mapped", "calls")


@dataclasses.dataclass(frozen=True)
class Args:
  env_id: str = "HalfCheetah-v4"
  """A continuous envpool task (its observation and action shapes)."""
  num_seeds: int = 3
  """N: seeds updated in each layout."""
  windows: int = 64
  """Windows per update (SQIL: agent and demonstration windows together)."""
  window_transitions: int = 2
  """Transitions per window."""
  num_q_networks: tuple[int, ...] = (1, 2)
  """Numbers of Q networks to time, one table row each."""
  hidden_sizes: tuple[int, ...] = (128, 128)
  """Layer sizes of the networks."""
  num_particles: int = 16
  """SVGD particles of the sampler."""
  num_value_samples: int = 16
  """Actions sampled for each soft value."""
  value_proposal_std: float = 0.1
  """Spread of the value samples drawn around the sampler's action."""
  repeats: int = 20
  """Timed updates per layout and round (after one untimed update)."""
  rounds: int = 5
  """Rounds over the layouts, interleaved; the report is the median of the rounds'."""


def random_batch(key, spec, windows: int, length: int) -> Trajectory:
  """Mid-episode windows [length + 1, windows] of random observations and actions in the box."""
  obs_key, action_key, reward_key = jax.random.split(key, 3)
  shape = (length + 1, windows)
  low = jnp.asarray(spec.action_low, jnp.float32)
  high = jnp.asarray(spec.action_high, jnp.float32)
  return Trajectory(
      step_type=jnp.ones(shape, jnp.int32),
      reward=jax.random.uniform(reward_key, shape),
      discount=jnp.ones(shape, jnp.float32),
      observation=jax.random.normal(obs_key, shape + tuple(spec.observation_shape)),
      env_id=jnp.broadcast_to(jnp.arange(windows, dtype=jnp.int32), shape),
      action=jax.random.uniform(
          action_key, shape + tuple(spec.action_shape), minval=low, maxval=high
      ),
      extras={},
  )


def _median_ms(step, state, batch, repeats: int) -> float:
  state = step(state, batch)  # compiles
  jax.block_until_ready(state)
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    state = step(state, batch)
    jax.block_until_ready(state)
    times.append(time.perf_counter() - start)
  return statistics.median(times) * 1e3


def layout_cases(agent, states, batches) -> dict[str, tuple]:
  """Each layout in `LAYOUTS` as (step, its states, its batches), `step(states, batches)`
  giving the updated states. `states` and `batches` are stacked [N, ...] over the seeds;
  "calls" holds them as a list of each seed's (as separate runs do, not sliced per call)."""
  update = lambda s, b: agent.update(s, b)[0]  # the new state (metrics dropped)
  one = jax.jit(update)
  num_seeds = jax.tree.leaves(states)[0].shape[0]
  split = lambda tree: [jax.tree.map(lambda x: x[k], tree) for k in range(num_seeds)]
  return {
      "vmapped": (jax.jit(jax.vmap(update)), states, batches),
      "mapped": (jax.jit(lambda s, b: jax.lax.map(lambda x: update(*x), (s, b))), states, batches),
      "calls": (lambda s, b: [one(*x) for x in zip(s, b)], split(states), split(batches)),
  }


def time_layouts(agent, spec, args: Args) -> dict[str, float]:
  """Median ms per seed and update of each layout in `LAYOUTS`."""
  keys = jax.random.split(jax.random.PRNGKey(0), args.num_seeds)
  states = jax.jit(jax.vmap(agent.init))(keys)
  batches = jax.vmap(lambda k: random_batch(k, spec, args.windows, args.window_transitions))(keys)
  cases = layout_cases(agent, states, batches)
  times = {name: [] for name in LAYOUTS}
  for _ in range(args.rounds):  # interleaved: a slow spell of the machine hits every layout
    for name in LAYOUTS:
      times[name].append(_median_ms(*cases[name], args.repeats) / args.num_seeds)
  return {name: statistics.median(times[name]) for name in LAYOUTS}


def main(args: Args) -> list[dict]:
  with refusals():  # bad arguments: one line and exit code 2 (script_main), before any work
    for name in ("num_seeds", "windows", "window_transitions", "repeats", "rounds"):
      if getattr(args, name) < 1:
        raise ValueError(f"{name} must be at least 1, got {getattr(args, name)}")
    if not args.num_q_networks:
      raise ValueError("--num-q-networks needs at least one number of Q networks")
    spec = envs.spec(args.env_id)
    if spec.num_actions is not None:
      raise ValueError(f"{args.env_id} has discrete actions; continuous SQL needs a box")
    configs = [SqlConfig(hidden_sizes=args.hidden_sizes, num_particles=args.num_particles,
                         num_value_samples=args.num_value_samples,
                         value_proposal_std=args.value_proposal_std, num_q_networks=num_q)
               for num_q in args.num_q_networks]  # fmt: skip
    for config in configs:
      config.validate()
  rows = []
  for config in configs:
    num_q = config.num_q_networks
    ms = time_layouts(make_sql_continuous(spec, config), spec, args)
    row = dict(num_q_networks=num_q, num_seeds=args.num_seeds, **ms)
    row.update({f"{name}_speedup": ms["vmapped"] / ms[name] for name in LAYOUTS[1:]})
    rows.append(row)
    print(f"{num_q} Q network(s), {args.num_seeds} seeds, ms per seed and update: "
          + " | ".join(f"{name} {ms[name]:6.2f}" for name in LAYOUTS)
          + " | speed-up over vmapped: "
          + ", ".join(f"{name} {row[name + '_speedup']:.2f}x" for name in LAYOUTS[1:]),
          flush=True)  # fmt: skip
  return rows


if __name__ == "__main__":
  script_main(lambda: parse_plain(Args, __doc__), main)
