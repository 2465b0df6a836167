"""SQIL's settings: the script's `Args`, its presets (SQL's, with SQIL's batches and
temperatures), and `run`, which loads the demonstrations.

    from offpolicy_ac.presets import sqil
    args = dataclasses.replace(sqil.PRESETS["pendulum"], demos="pendulum.npz")
    sqil.run(args)          # what experiments/sqil.py --preset pendulum --demos ... runs

The demonstrations must be of the run's task (`--env-id`): record them from a run on it
(experiments/record_demos.py).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
from typing import Literal
from typing import Optional

import jax

from offpolicy_ac import _memory
from offpolicy_ac import demos as demos_lib
from offpolicy_ac.agents import SqlConfig
from offpolicy_ac.agents import make_sqil
from offpolicy_ac.agents import make_sqil_batch_fn
from offpolicy_ac.agents.base import check_int
from offpolicy_ac.cli import NO_PRESET
from offpolicy_ac.cli import EnvPresets
from offpolicy_ac.presets import common
from offpolicy_ac.presets import sql
from offpolicy_ac.training import TrainConfig
from offpolicy_ac.training import prepare_process
from offpolicy_ac.training import refusals
from offpolicy_ac.training import run_experiment
from offpolicy_ac.training.learner import make_replay
from offpolicy_ac.training.sources import task_spec


@dataclasses.dataclass(frozen=True)
class Args:
  """experiments/sqil.py's command line."""

  demos: str
  """Demonstrations (.npz from experiments/record_demos.py)."""
  # CartPole-v1: 50k env steps with the step size annealed to 0. SQIL's greedy policy
  # scores 500 from its first evaluations on, then drifts away from the demonstrations the
  # longer it trains on its own data: after 200k, 1 or 2 of 5 seeds' final policies
  # scored below 450 (results/defaults/).
  train: TrainConfig = sql.Args().train.replace(total_env_steps=50_000, mini_batch_size=32)
  """--mini-batch-size is the agent's sequences per batch (see --demo-batch-size)."""
  demo_batch_size: Optional[int] = None
  """Demonstration sequences per batch (default: --mini-batch-size, as in SQIL's paper).
  More than --mini-batch-size weigh the agent's data less in the loss, as
  the paper's lambda_samp < 1 does (lambda_samp = --mini-batch-size / --demo-batch-size)."""
  agent: SqlConfig = SqlConfig()
  cut_mode: Literal["drop", "last", "null_padding"] = "last"
  """How demonstration episodes are cut into sequences: drop, last, null_padding."""
  learning_rate_cooldown: float = 1.0
  """Lower the learning rate to 0 over this last fraction of the run, as in sql.py. 0
  keeps it constant unless --learning-rate-decay-* are set."""
  resume: bool = False
  """Continue the run in --run-dir from its last checkpoint. --demos may name another path:
  the file's content must be the one the run started with."""
  import_modules: tuple[str, ...] = ()
  """Modules to import first (dotted names, or .py files): those that register a custom
  torso the agent names (`networks.register_torso`; --torso NAME)."""
  run_dir: Optional[str] = None
  """Run directory (default: runs/sqil-<env>-seed<seed>-<time>)."""


def _from_sql(preset: str, train_fields: dict, learning_rate_cooldown: float = 0.0,
              **agent_fields) -> Args:  # fmt: skip
  """SQL's preset `preset` with these train and agent fields changed (no demonstrations)."""
  base = sql.PRESETS[preset]
  return Args(
      demos="",
      train=base.train.replace(**train_fields),
      agent=dataclasses.replace(base.agent, **agent_fields),
      learning_rate_cooldown=learning_rate_cooldown,
  )


PRESETS = {
    "cartpole": Args(demos=""),
    # DI-engine's CartPole-v0 protocol: SQL's preset with batches of 64 agent + 64
    # demonstration windows.
    "cartpole-v0": _from_sql("cartpole-v0", dict(mini_batch_size=64)),
    # Continuous SQIL: SQL's pendulum preset with discount 0.95 and temperature 0.02 (with
    # 0.99, or 0.05 and above, the greedy returns fell back after learning), a budget of
    # 20k env steps and the step size annealed to 0 over them; from 10 demonstrations it
    # reaches about -150 after 4k to 8k. (At a constant step size, 2 of 5 seeds' final
    # greedy policies scored -268 and -297; annealed, all 5 -191 to -212.)
    "pendulum": _from_sql(
        "pendulum",
        dict(total_env_steps=20_000, mini_batch_size=32),
        learning_rate_cooldown=1.0,
        gamma=0.95,
        alpha=0.02,
    ),
    # HalfCheetah-v4: SQL's halfcheetah preset with raw rewards, temperature 0.05, batches
    # of 32 + 32 windows and a 300k budget (the imitation library's SQIL with SAC: 1,401 at
    # 300k). Record the demonstrations inside the box (`record_demos.py
    # --action-box-fraction 0.9`): the tanh sampler does not reach bang-bang actions.
    "halfcheetah": _from_sql(
        "halfcheetah",
        dict(total_env_steps=300_000, mini_batch_size=32, reward_scale=1.0),
        alpha=0.05,
    ),
    # Atari: SQL's atari preset with batches of 16 agent + 16 demonstration windows, 4 of
    # them per iteration of 64 env steps, discount 0.97 and temperature 0.1 (SQIL's values
    # are of order 1 / (1 - gamma), its rewards being 1 at every demonstrated step); nearer
    # DI-engine's Pong SQIL (discount 0.97, 10 updates per 96 env steps). On Pong-v5 (small
    # CNN, 30 games of an IMPALA player) its greedy policies won 9 and 12 of 20 games at 1M
    # env steps (seeds 0, 1); with SQL's discount 0.99 and 1 update it lost every game
    # (results/notes/atari.md).
    "atari": _from_sql(
        "atari", dict(mini_batch_size=16, num_updates_per_train_iter=4), alpha=0.1, gamma=0.97
    ),
}
"""experiments/sqil.py's presets (--preset NAME); each needs --demos."""


ENV_PRESETS = EnvPresets(
    {
        "Pendulum-v1": "pendulum",
        "gymnax:Pendulum-v1": "pendulum",
        "HalfCheetah-v4": "halfcheetah",
    },
    atari="atari",
)
"""The preset an --env-id selects when no --preset is given (--preset none: defaults)."""


def _preset_for(env_id: str) -> str:
  """The preset for a run on `env_id`: the one its --env-id selects, else one made for it,
  else the defaults (`NO_PRESET`). The advice for demonstrations of another task names it,
  since the run's own preset may not fit that task."""
  try:
    selected = ENV_PRESETS.select(env_id)
  except ValueError:  # a task envpool does not know: its own refusal comes later
    selected = None
  made_for = [name for name, args in PRESETS.items() if args.train.env.env_id == env_id]
  return selected or next(iter(made_for), NO_PRESET)


def _check_demos_fit(sequences, demo_batch_size: int) -> None:
  """Refuses demonstrations and a batch of them larger than the default device has free
  (both go to it; --demo-batch-size 2**31 - 1 asked for terabytes at the first update)."""
  total = sum(x.nbytes for x in jax.tree.leaves(sequences))
  count = sequences.step_type.shape[1]
  _memory.check_fits(
      total + demo_batch_size * (total // count), _memory.free_memory_bytes(),
      what="the demonstrations and a batch of them need",
      details=f"{count:,} sequences of {total // count:,} bytes, --demo-batch-size "
              f"{demo_batch_size:,} of them a batch",
      free_said="free", hint="a smaller --demo-batch-size",
  )  # fmt: skip


def run(args: Args, **run_kwargs):
  """Trains SQIL from `args.demos` as experiments/sqil.py does; `run_kwargs` go to
  `training.run_experiment` (e.g. a `rollout_factory`).

  Raises:
    ValueError: no demonstrations, a demonstration batch size below 1, or demonstrations
      of another task than the run's.
  """
  common.import_registrations(args)
  with refusals():  # bad demonstrations: one line from the script, before anything runs
    if not args.demos:
      raise ValueError("--demos FILE is required (record one with experiments/record_demos.py)")
    if args.demo_batch_size is not None:
      check_int("--demo-batch-size", args.demo_batch_size, 1)
    # A bad flag named as such before the file is loaded and cut into the replay's windows
    # (their length, --mini-batch-length + 1, at most the unrolls').
    args.train.validate()
    make_replay(args.train)
    demos = demos_lib.load_demos(args.demos)
    spec = task_spec(args.train)  # an unknown task is refused as such, not as another task
    if demos["env_id"] != args.train.env.env_id:
      held = demos["env_id"]
      raise ValueError(
          f"the demonstrations are of {held}, --env-id is {args.train.env.env_id}: pass "
          f"--env-id {held} --preset {_preset_for(held)}, or record demonstrations of "
          f"{args.train.env.env_id}"
      )
    demos_lib.check_demos(demos, spec, where=args.demos)
    demo_batch_size = args.demo_batch_size or args.train.replay.mini_batch_size
    length = args.train.replay.mini_batch_length + 1
    sequences = demos_lib.cut_episodes(demos, length, args.cut_mode)
    prepare_process(args.train)  # before the demonstrations go to the device
    _check_demos_fit(sequences, demo_batch_size)
    batch_fn = make_sqil_batch_fn(sequences, batch_size=demo_batch_size, length=length)
    with open(os.path.expanduser(args.demos), "rb") as f:  # compared on --resume
      digest = hashlib.file_digest(f, "sha256").hexdigest()
  agent = sql.cooled_agent(args.agent, args.train, args.learning_rate_cooldown)
  return run_experiment("sqil", args, functools.partial(make_sqil, config=agent),
                        batch_fn=batch_fn, inputs={"demos": digest}, **run_kwargs)  # fmt: skip
