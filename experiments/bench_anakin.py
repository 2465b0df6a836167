"""Compiled training against the environment's own bound, for 1 to 64 vmapped seeds.

    python experiments/bench_anakin.py --env-id gymnax:CartPole-v1 --agent impala
    python experiments/bench_anakin.py --preset minatar --env-id gymnax:Breakout-MinAtar --seeds 1 4 16

For each number of seeds S, side by side in one process (interleaved, medians of
`--repeats`):

* **bound**: a jitted rollout of S x num_envs environments stepped with uniformly random
  actions (`lax.scan` over `env.step`, vmapped): what the environment alone costs;
* **train**: `training.make_train`'s chunk (unroll with the agent's policy, transformer,
  replay, updates) vmapped over S learners, with the script's default settings (or the
  preset given).

Both count environment steps of all S learners together. Prints steps/s and the ratio
train / bound; `--out FILE` also writes them as JSON. Timings exclude compilation.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import statistics
import time
from typing import Optional

import jax
import jax.numpy as jnp

from offpolicy_ac import envs
from offpolicy_ac import presets
from offpolicy_ac.agents.registry import AGENTS
from offpolicy_ac.cli import check_output_file
from offpolicy_ac.cli import check_suffix
from offpolicy_ac.cli import parse_plain
from offpolicy_ac.cli import script_main
from offpolicy_ac.training import make_train
from offpolicy_ac.training import refusals
from offpolicy_ac.training.sources import task_spec


@dataclasses.dataclass(frozen=True)
class Args:
  env_id: str = "gymnax:CartPole-v1"
  """A JAX environment ("gymnax:..." or "brax:...")."""
  agent: str = "impala"
  """impala, acer or sql (sqil trains as sql)."""
  preset: Optional[str] = None
  """A preset of the agent's script (default: its defaults), with --env-id applied."""
  num_envs: Optional[int] = None
  """Environments per learner (default: the script's)."""
  seeds: tuple[int, ...] = (1, 4, 16, 64)
  """Numbers of vmapped learners to measure."""
  steps_per_measurement: int = 400_000
  """Env steps (all learners together) per timed call, rounded to whole iterations."""
  repeats: int = 5
  """Timed calls per measurement; the median is reported."""
  out: Optional[str] = None
  """Also write the results as JSON here."""


def load_script_args(args: Args):
  """The agent's script Args (defaults or preset) with the env id and num_envs applied."""
  module = getattr(presets, args.agent)
  script_args = module.PRESETS[args.preset] if args.preset else module.Args()
  fields = {"env_id": args.env_id, "eval_every": 0, "checkpoint_every": 0}
  if args.num_envs is not None:
    fields["num_envs"] = args.num_envs
  train = script_args.train.replace(**fields)
  if hasattr(script_args, "resolved_train"):  # ACER derives the replay ratio
    script_args = dataclasses.replace(script_args, train=train)
    train = script_args.resolved_train
  return dataclasses.replace(script_args, train=train)


def _bound(env, num_lanes: int, num_envs: int, steps: int):
  """A jitted random-action rollout of num_lanes x num_envs environments, `steps` each."""
  spec, n = env.spec, num_lanes * num_envs

  def random_action(key):
    if spec.is_discrete:
      return jax.random.randint(key, (n,), 0, spec.num_actions)
    low, high = jnp.asarray(spec.action_low), jnp.asarray(spec.action_high)
    return jax.random.uniform(key, (n,) + tuple(spec.action_shape), minval=low, maxval=high)

  @jax.jit
  def rollout(key):
    state, _ = jax.vmap(env.reset)(jax.random.split(key, n), jnp.arange(n, dtype=jnp.int32))

    def body(state, key):
      state, ts = jax.vmap(env.step)(state, random_action(key))
      return state, ts.reward.sum()

    _, rewards = jax.lax.scan(body, state, jax.random.split(key, steps))
    return rewards.sum()

  return rollout


def measure(args: Args) -> list[dict]:
  script_args = load_script_args(args)
  factory = AGENTS[args.agent][0]
  rows = []
  for num_lanes in args.seeds:
    config = script_args.train
    per_iteration = config.env.unroll_length * config.env.num_envs * num_lanes
    iterations = max(1, round(args.steps_per_measurement / per_iteration))
    config = config.replace(
        log_every=iterations * config.env.unroll_length * config.env.num_envs,
        total_env_steps=10 * iterations * config.env.unroll_length * config.env.num_envs,
    )
    compiled = make_train(factory, script_args.agent, config)
    keys = jax.random.split(jax.random.PRNGKey(0), num_lanes)
    hps = {k: jnp.stack([v] * num_lanes) for k, v in compiled.hyperparams.items()}
    state = jax.jit(jax.vmap(compiled.init))(keys, hps)
    run = jax.jit(jax.vmap(compiled.run, in_axes=(0, 0, None)))
    active = jnp.int32(iterations)
    bound = _bound(compiled.env, num_lanes, config.env.num_envs,
                   iterations * config.env.unroll_length)  # fmt: skip
    steps = iterations * per_iteration
    state, metrics = run(state, hps, active)  # compile
    jax.block_until_ready(metrics)
    jax.block_until_ready(bound(jax.random.PRNGKey(0)))
    train_s, bound_s = [], []
    for r in range(args.repeats):
      start = time.perf_counter()
      state, metrics = run(state, hps, active)
      jax.block_until_ready(metrics)
      train_s.append(time.perf_counter() - start)
      start = time.perf_counter()
      jax.block_until_ready(bound(jax.random.PRNGKey(r + 1)))
      bound_s.append(time.perf_counter() - start)
    train_sps = steps / statistics.median(train_s)
    bound_sps = steps / statistics.median(bound_s)
    row = dict(env_id=args.env_id, agent=args.agent, seeds=num_lanes,
               num_envs=config.env.num_envs, steps_per_call=steps, train_sps=train_sps,
               bound_sps=bound_sps, ratio=train_sps / bound_sps)  # fmt: skip
    rows.append(row)
    print(
        f"{args.agent} {args.env_id} seeds {num_lanes:3d} x {config.env.num_envs} envs: "
        f"train {train_sps:12,.0f} steps/s | bound {bound_sps:12,.0f} steps/s | "
        f"ratio {row['ratio']:.3f}",
        flush=True,
    )
  return rows


def check(args: Args) -> None:
  """Refuses (ValueError) bad arguments before anything is compiled."""
  if not envs.is_functional(args.env_id):
    raise ValueError(f"--env-id must name a JAX environment (gymnax:/brax:), got {args.env_id!r}")
  if args.agent not in ("impala", "acer", "sql"):
    raise ValueError(f"--agent must be impala, acer or sql, got {args.agent!r}")
  if not args.seeds or min(args.seeds) < 1:
    raise ValueError(f"--seeds must be positive counts, got {list(args.seeds)}")
  for flag, value in (("--repeats", args.repeats), ("--num-envs", args.num_envs),
                      ("--steps-per-measurement", args.steps_per_measurement)):  # fmt: skip
    if value is not None and value < 1:
      raise ValueError(f"{flag} must be >= 1, got {value}")
  known = sorted(getattr(presets, args.agent).PRESETS)
  if args.preset is not None and args.preset not in known:
    raise ValueError(f"--preset {args.preset}: {args.agent}'s presets are {known}")
  if args.out:
    check_output_file("--out", args.out)
    check_suffix("--out", args.out, ".json", "JSON")
  config = load_script_args(args).train
  config.validate()
  task_spec(config)  # an unknown task id, naming the closest ones


def main(args: Args) -> list[dict]:
  with refusals():  # bad arguments: one line and exit code 2 (script_main), before any work
    check(args)
  print(f"jax {jax.__version__} on {jax.devices()[0].platform}: {jax.devices()[0]}")
  rows = measure(args)
  if args.out:
    out = pathlib.Path(args.out).expanduser()
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w") as f:
      json.dump({"device": str(jax.devices()[0]), "rows": rows}, f, indent=2)
  return rows


if __name__ == "__main__":
  script_main(lambda: parse_plain(Args, __doc__), main)
