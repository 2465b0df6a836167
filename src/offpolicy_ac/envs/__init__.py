"""Environments: envpool with ALF's TimeStep semantics, rollouts, data transformers.

DESIGN.md Contract 2. Public API:

    env = make(task_id, num_envs, seed, **envpool_kwargs)   # or make_atari(..., train=True)
    ts = env.reset(); ts = env.step(action)                # TimeStep, batched
    rollout = make_rollout(env, act_fn, unroll_length)
    state = rollout.init(key); state, traj, stats = rollout.unroll(params, state)
    rollout = make_xla_rollout(env, act_fn, unroll_length)  # switch: one compiled loop per
                                                            # unroll; init takes (params, key)
    inputs = loss_inputs(traj, gamma)                      # r_t, discount_t, mask: [T, B]
    transformer = make_data_transformer(obs_shape, normalize_observations=True)
"""

from offpolicy_ac.envs._envpool_env import (
    ATARI_EVAL_KWARGS,
    ATARI_TRAIN_KWARGS,
    EnvPoolEnv,
    make,
    make_atari,
)
from offpolicy_ac.envs._rollout import ActFn, Rollout, RolloutState, make_rollout
from offpolicy_ac.envs._timestep import FIRST, LAST, MID, EnvSpec, EpisodeStats, TimeStep
from offpolicy_ac.envs._trajectory import LossInputs, Trajectory, TransformedTrajectory, loss_inputs
from offpolicy_ac.envs._xla_rollout import (
    XlaAsyncRolloutState,
    XlaRollout,
    XlaRolloutState,
    make_xla_rollout,
)
from offpolicy_ac.envs._transformers import (
    DataTransformer,
    RunningStats,
    TransformerState,
    clip_reward,
    make_data_transformer,
    normalize,
    running_stats_init,
    running_stats_update,
    scale_reward,
)

__all__ = [
    "ATARI_EVAL_KWARGS",
    "ATARI_TRAIN_KWARGS",
    "FIRST",
    "LAST",
    "MID",
    "ActFn",
    "clip_reward",
    "DataTransformer",
    "EnvPoolEnv",
    "EnvSpec",
    "EpisodeStats",
    "loss_inputs",
    "LossInputs",
    "make",
    "make_atari",
    "make_data_transformer",
    "make_rollout",
    "make_xla_rollout",
    "normalize",
    "Rollout",
    "RolloutState",
    "running_stats_init",
    "running_stats_update",
    "RunningStats",
    "scale_reward",
    "TimeStep",
    "Trajectory",
    "TransformedTrajectory",
    "TransformerState",
    "XlaAsyncRolloutState",
    "XlaRollout",
    "XlaRolloutState",
]
