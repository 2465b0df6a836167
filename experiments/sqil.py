"""SQIL on an envpool task or a JAX environment, from recorded demonstrations.

    python experiments/record_demos.py --run-dir runs/sql-cartpole --episodes 10 --out demos.npz
    python experiments/sqil.py --demos demos.npz --env-id CartPole-v1 --run-dir runs/sqil
    python experiments/sqil.py --preset cartpole-v0 --demos demos-v0.npz  # DI-engine's v0
    python experiments/sqil.py --preset cartpole-v0 --env-id gymnax:CartPole-v1 \
        --demos gymnax-demos.npz   # one compiled program; demos of a gymnax:CartPole-v1 run
    python experiments/sql.py --preset pendulum --run-dir runs/sql-pendulum
    python experiments/record_demos.py --run-dir runs/sql-pendulum --out pendulum.npz
    python experiments/sqil.py --preset pendulum --demos pendulum.npz   # continuous actions
    python experiments/impala.py --env-id HalfCheetah-v4 --preset mujoco-pg --num-seeds 3 \
        --run-dir runs/impala-hc
    python experiments/record_demos.py --run-dir runs/impala-hc/seed1 --out hc.npz \
        --action-box-fraction 0.9   # the best seed: some stop near 1,000, others pass 3,000
    python experiments/sqil.py --env-id HalfCheetah-v4 --demos hc.npz   # the halfcheetah preset

The demonstrations must be of the run's task (`--env-id`): record them from a run on it.

Preset cartpole-v0: DI-engine's CartPole-v0 protocol (stop when 5 greedy episodes
average 195, evaluating every 500 env steps), tuned for few agent env steps: a high
replay ratio (16 updates of 64 + 64 windows per 32 env steps, training from 8
stored sequences on), temperature 0.12 and step size 3e-3.

Preset pendulum: continuous SQIL (SQL with an SVGD sampler, see sql.py's pendulum preset)
with discount 0.95 and temperature 0.02: from 10 demonstrations the greedy returns reach
about -150 after 4k to 8k env steps (4 of 4 seeds, demonstrations averaging -150). With
discount 0.99 (or temperature 0.05 and above) they fell back to -700 or below after
learning; with 0.95 that came later too (once, after 20k env steps): the budget is 20k.

Preset halfcheetah: continuous SQIL on HalfCheetah-v4 with sql.py's network sizes, 16
value samples and 16 SVGD particles, and: two Q networks (clipped double Q: with one, a
seed's Q diverged and its return collapsed after 190k env steps), the soft value's proposal
half uniform and half around the sampler's action (`value_proposal_std` 0.1), temperature
0.05, Polyak tau 0.005, and half an update per env step (32 updates of 32 + 32 windows
per 64 env steps). Record the demonstrations inside the box (`record_demos.py
--action-box-fraction 0.9`): the tanh sampler does not reach a Gaussian policy's
bang-bang actions, and from those every run fell to a return of about 0. Budget 300k env
steps (the imitation library's SQIL with SAC: 1,401 at 300k); docs/benchmarks.md has the
runs. From a stronger demonstrator (SQL's, results/mujoco_sqil/mujoco_halfcheetah_sql_demos.npz,
return 6,392) weigh the agent's data less and learn faster: with `--mini-batch-size 16
--demo-batch-size 48 --alpha 0.025 --learning-rate 8e-4` 5 seeds pass 80% of it within
300k env steps (greedy IQM at 300k: 86%).

Preset atari: sql.py's atari preset (a 100k-transition buffer, Adam 3e-4, Polyak tau 0.01)
with batches of 16 agent and 16 demonstration windows, and temperature 0.1 (SQL's is 0.01:
SQIL's values are of order 1 / (1 - gamma), its rewards being 1 at every demonstrated step).
On Breakout-v5 with the small_cnn torso, from 30 games of ACER's CPU run (its behaviour
policy, 3.5 points a game), it scores 1.6 times a random policy after 800k env steps; with
temperature 0.01 or 1, 1.3 times.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Optional

from offpolicy_ac import demos as demos_lib
from offpolicy_ac.agents import SqlConfig
from offpolicy_ac.agents import make_sqil
from offpolicy_ac.agents import make_sqil_batch_fn
from offpolicy_ac.training import EnvPresets
from offpolicy_ac.training import TrainConfig
from offpolicy_ac.training import exit_process
from offpolicy_ac.training import parse_args
from offpolicy_ac.training import run_experiment


@dataclasses.dataclass(frozen=True)
class Args:
  demos: str
  """Demonstrations (.npz from experiments/record_demos.py)."""
  train: TrainConfig = TrainConfig.of(
      env_id="CartPole-v1",
      total_env_steps=200_000,
      num_envs=4,
      unroll_length=8,
      replay_capacity=5_000,
      min_replay_size=32,
      num_updates_per_train_iter=4,
      mini_batch_size=32,
      mini_batch_length=4,
  )
  """mini_batch_size is the agent's windows per batch (see --demo-batch-size)."""
  demo_batch_size: Optional[int] = None
  """Demonstration windows per batch (default: mini_batch_size, the SQIL paper's half and
  half batches). More than mini_batch_size weigh the agent's data less in the loss, as
  the paper's lambda_samp < 1 does (lambda_samp = mini_batch_size / demo_batch_size)."""
  agent: SqlConfig = SqlConfig()
  cut_mode: str = "last"
  """How demonstration episodes are cut into sequences: drop, last, null_padding."""
  resume: bool = False
  """Continue the run in --run-dir from its last checkpoint."""
  run_dir: Optional[str] = None
  """Run directory (default: runs/sqil-<env>-seed<seed>-<time>)."""


PRESETS = {
    "cartpole": Args(demos=""),
    "cartpole-v0": Args(
        demos="",
        train=TrainConfig.of(
            env_id="CartPole-v0",
            total_env_steps=100_000,
            num_envs=4,
            unroll_length=8,
            replay_capacity=5_000,
            min_replay_size=8,
            num_updates_per_train_iter=16,
            mini_batch_size=64,
            mini_batch_length=4,
            eval_every=500,
            eval_episodes=5,
            target_return=195.0,
        ),
        agent=SqlConfig(alpha=0.12, learning_rate=3e-3),
    ),
    "pendulum": Args(
        demos="",
        train=TrainConfig.of(
            env_id="Pendulum-v1",
            total_env_steps=20_000,
            num_envs=4,
            unroll_length=8,
            replay_capacity=5_000,
            min_replay_size=32,
            num_updates_per_train_iter=16,
            mini_batch_size=32,
            mini_batch_length=2,
            log_every=2_000,
            eval_every=2_000,
            eval_episodes=4,
        ),
        agent=SqlConfig(
            gamma=0.95,
            alpha=0.02,
            n_step=1,
            learning_rate=1e-3,
            target_update_tau=0.01,
            hidden_sizes=(64, 64),
            num_particles=8,
            num_value_samples=8,
        ),
    ),
    "halfcheetah": Args(
        demos="",
        train=TrainConfig.of(
            env_id="HalfCheetah-v4",
            total_env_steps=300_000,
            num_envs=16,
            unroll_length=4,
            replay_capacity=250_000,
            min_replay_size=250,
            num_updates_per_train_iter=32,
            mini_batch_size=32,
            mini_batch_length=2,
            log_every=10_000,
            eval_every=10_000,
            checkpoint_every=50_000,
        ),
        agent=SqlConfig(
            alpha=0.05,
            epsilon=0.0,
            n_step=1,
            learning_rate=3e-4,
            target_update_tau=0.005,
            hidden_sizes=(128, 128),
            num_particles=16,
            num_value_samples=16,
            value_proposal_std=0.1,
            num_q_networks=2,
        ),
    ),
    "atari": Args(
        demos="",
        train=TrainConfig.of(
            env_id="Pong-v5",
            atari=True,
            total_env_steps=5_000_000,
            num_envs=8,
            unroll_length=8,
            replay_capacity=12_500,
            min_replay_size=500,
            num_updates_per_train_iter=1,
            mini_batch_size=16,
            mini_batch_length=4,
            log_every=20_000,
            checkpoint_every=200_000,
        ),
        agent=SqlConfig(
            torso="nature_cnn",
            alpha=0.1,
            learning_rate=3e-4,
            target_update_tau=0.01,
            max_grad_norm=10.0,
        ),
    ),
}


ENV_PRESETS = EnvPresets(
    {
        "Pendulum-v1": "pendulum",
        "gymnax:Pendulum-v1": "pendulum",
        "HalfCheetah-v4": "halfcheetah",
    },
    atari="atari",
)
"""The preset an --env-id selects when no --preset is given (--preset none: defaults)."""


def main(args: Args, **run_kwargs):
  """Trains; `run_kwargs` go to `run_experiment` (e.g. a `rollout_factory`)."""
  if not args.demos:
    raise ValueError("--demos FILE is required (record one with experiments/record_demos.py)")
  if args.demo_batch_size is not None and args.demo_batch_size < 1:
    raise ValueError(f"--demo-batch-size must be >= 1, got {args.demo_batch_size}")
  demos = demos_lib.load_demos(args.demos)
  if demos["env_id"] != args.train.env.env_id:
    raise ValueError(
        f"the demonstrations are of {demos['env_id']}, the run is on " f"{args.train.env.env_id}"
    )
  demo_batch_size = args.demo_batch_size or args.train.replay.mini_batch_size
  length = args.train.replay.mini_batch_length + 1
  sequences = demos_lib.cut_episodes(demos, length, args.cut_mode)
  batch_fn = make_sqil_batch_fn(sequences, batch_size=demo_batch_size, length=length)
  return run_experiment(
      "sqil", args, functools.partial(make_sqil, config=args.agent), batch_fn=batch_fn, **run_kwargs
  )


if __name__ == "__main__":
  main(parse_args(Args, PRESETS, description=__doc__, env_presets=ENV_PRESETS))
  exit_process()  # skip the interpreter's slow teardown (see its docstring)
