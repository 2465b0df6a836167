"""Environments: envpool with ALF's TimeStep semantics, rollouts, data transformers.

docs/design.md, "Contract 2: environments". Public API:

    env = make(task_id, num_envs, seed, **envpool_kwargs)   # or make_atari(..., train=True)
    ts = env.reset(); ts = env.step(action)                # TimeStep, batched
    env_spec = spec(task_id, atari=False)                  # EnvSpec, no environment made
    protocol = atari_protocol(task_id)                     # how Atari scores are produced
    rollout = make_rollout(env, act_fn, unroll_length, backend="host", to_device=False)
    state = rollout.init(params, key)                      # backend "compiled": one
    state, traj, stats = rollout.unroll(params, state)     # compiled loop per unroll
    inputs = loss_inputs(traj, gamma)                      # r_t, discount_t, mask: [T, B]
    transformer = make_data_transformer(obs_shape, normalize_observations=True)

JAX-native environments (gymnax, brax) in functional form, and a pure rollout over them:

    env = make_functional("gymnax:CartPole-v1", max_episode_steps=None)
    state, ts = env.reset(key); state, ts = env.step(state, action)   # one env; vmap it
    rollout = make_functional_rollout(env, act_fn, unroll_length=T, num_envs=B)
    state = rollout.init(params, key)
    state, traj, stats = rollout.unroll(params, state)     # pure, jitted; [T+1, B, ...]
    episodes = finished_episodes(stats)                    # host EpisodeStats
    pool = make_functional_pool("gymnax:CartPole-v1", num_envs=8, seed=0)  # host, NumPy:
    ts = pool.reset(); ts = pool.step(action)              # the API of make()'s pools
"""

from offpolicy_ac.envs._atari_protocol import AtariProtocol
from offpolicy_ac.envs._atari_protocol import atari_protocol
from offpolicy_ac.envs._atari_protocol import time_limit
from offpolicy_ac.envs._envpool_env import ATARI_EVAL_KWARGS
from offpolicy_ac.envs._envpool_env import ATARI_TRAIN_KWARGS
from offpolicy_ac.envs._envpool_env import EnvPoolEnv
from offpolicy_ac.envs._envpool_env import is_atari
from offpolicy_ac.envs._envpool_env import make
from offpolicy_ac.envs._envpool_env import make_atari
from offpolicy_ac.envs._envpool_env import pool_action_dtype
from offpolicy_ac.envs._envpool_env import spec
from offpolicy_ac.envs._functional import BRAX_BACKENDS
from offpolicy_ac.envs._functional import BRAX_DEFAULT_BACKEND
from offpolicy_ac.envs._functional import FUNCTIONAL_PREFIXES
from offpolicy_ac.envs._functional import GYMNAX_TASKS
from offpolicy_ac.envs._functional import FunctionalEnv
from offpolicy_ac.envs._functional import FunctionalEnvState
from offpolicy_ac.envs._functional import is_functional
from offpolicy_ac.envs._functional import make_functional
from offpolicy_ac.envs._functional_pool import FunctionalPool
from offpolicy_ac.envs._functional_pool import make_functional_pool
from offpolicy_ac.envs._functional_rollout import FunctionalEpisodeStats
from offpolicy_ac.envs._functional_rollout import FunctionalRollout
from offpolicy_ac.envs._functional_rollout import FunctionalRolloutState
from offpolicy_ac.envs._functional_rollout import finished_episodes
from offpolicy_ac.envs._functional_rollout import make_functional_rollout
from offpolicy_ac.envs._host_rollout import RolloutState
from offpolicy_ac.envs._random_actions import random_actions
from offpolicy_ac.envs._rollout import make_rollout
from offpolicy_ac.envs._rollout_base import ActFn
from offpolicy_ac.envs._rollout_base import Backend
from offpolicy_ac.envs._rollout_base import Rollout
from offpolicy_ac.envs._rollout_base import call_policy
from offpolicy_ac.envs._rollout_base import default_device
from offpolicy_ac.envs._timestep import FIRST
from offpolicy_ac.envs._timestep import LAST
from offpolicy_ac.envs._timestep import MID
from offpolicy_ac.envs._timestep import EnvSpec
from offpolicy_ac.envs._timestep import EpisodeStats
from offpolicy_ac.envs._timestep import TimeStep
from offpolicy_ac.envs._timestep import check_key
from offpolicy_ac.envs._timestep import check_traced_actions
from offpolicy_ac.envs._trajectory import LossInputs
from offpolicy_ac.envs._trajectory import Trajectory
from offpolicy_ac.envs._trajectory import TransformedTrajectory
from offpolicy_ac.envs._trajectory import loss_inputs
from offpolicy_ac.envs._transformers import DataTransformer
from offpolicy_ac.envs._transformers import RunningStats
from offpolicy_ac.envs._transformers import TransformerState
from offpolicy_ac.envs._transformers import clip_reward
from offpolicy_ac.envs._transformers import make_data_transformer
from offpolicy_ac.envs._transformers import normalize
from offpolicy_ac.envs._transformers import running_stats_init
from offpolicy_ac.envs._transformers import running_stats_update
from offpolicy_ac.envs._transformers import scale_reward
from offpolicy_ac.envs._xla_rollout import XlaBatchedRolloutState
from offpolicy_ac.envs._xla_rollout import XlaRolloutState
from offpolicy_ac.envs._xla_rollout import check_action_dtype
from offpolicy_ac.envs._xla_rollout import check_compiled_task

__all__ = [
    "ATARI_EVAL_KWARGS",
    "ATARI_TRAIN_KWARGS",
    "ActFn",
    "AtariProtocol",
    "BRAX_BACKENDS",
    "BRAX_DEFAULT_BACKEND",
    "Backend",
    "DataTransformer",
    "EnvPoolEnv",
    "EnvSpec",
    "EpisodeStats",
    "FUNCTIONAL_PREFIXES",
    "FIRST",
    "FunctionalEnv",
    "FunctionalEnvState",
    "FunctionalPool",
    "FunctionalEpisodeStats",
    "FunctionalRollout",
    "FunctionalRolloutState",
    "GYMNAX_TASKS",
    "LAST",
    "LossInputs",
    "MID",
    "Rollout",
    "RolloutState",
    "RunningStats",
    "TimeStep",
    "Trajectory",
    "TransformedTrajectory",
    "TransformerState",
    "XlaBatchedRolloutState",
    "XlaRolloutState",
    "atari_protocol",
    "call_policy",
    "check_action_dtype",
    "check_compiled_task",
    "check_key",
    "check_traced_actions",
    "clip_reward",
    "default_device",
    "finished_episodes",
    "is_atari",
    "is_functional",
    "loss_inputs",
    "make",
    "make_atari",
    "make_data_transformer",
    "make_functional",
    "make_functional_pool",
    "make_functional_rollout",
    "make_rollout",
    "normalize",
    "pool_action_dtype",
    "random_actions",
    "running_stats_init",
    "running_stats_update",
    "scale_reward",
    "spec",
    "time_limit",
]
