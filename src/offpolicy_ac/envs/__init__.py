"""Environments: envpool with ALF's TimeStep semantics, rollouts, data transformers.

DESIGN.md Contract 2. Public API:

    env = make(task_id, num_envs, seed, **envpool_kwargs)   # or make_atari(..., train=True)
    ts = env.reset(); ts = env.step(action)                # TimeStep, batched
    rollout = make_rollout(env, act_fn, unroll_length)
    state = rollout.init(key); state, traj, stats = rollout.unroll(params, state)
    inputs = loss_inputs(traj, gamma)                      # r_t, discount_t, mask: [T, B]
"""

from offpolicy_ac.envs.envpool_env import (
    ATARI_EVAL_KWARGS,
    ATARI_TRAIN_KWARGS,
    EnvPoolEnv,
    make,
    make_atari,
)
from offpolicy_ac.envs.rollout import ActFn, Rollout, RolloutState, make_rollout
from offpolicy_ac.envs.timestep import FIRST, LAST, MID, EnvSpec, EpisodeStats, TimeStep
from offpolicy_ac.envs.trajectory import LossInputs, Trajectory, TransformedTrajectory, loss_inputs

__all__ = [
    "ATARI_EVAL_KWARGS",
    "ATARI_TRAIN_KWARGS",
    "FIRST",
    "LAST",
    "MID",
    "ActFn",
    "EnvPoolEnv",
    "EnvSpec",
    "EpisodeStats",
    "LossInputs",
    "Rollout",
    "RolloutState",
    "TimeStep",
    "Trajectory",
    "TransformedTrajectory",
    "loss_inputs",
    "make",
    "make_atari",
    "make_rollout",
]
