"""A host-side pool over a functional environment, with the API of envpool's pools.

    pool = make_functional_pool("gymnax:CartPole-v1", num_envs=8, seed=0)
    ts = pool.reset()                      # TimeStep of NumPy arrays, batched [8]
    ts = pool.step(action)                 # action [8, *action_shape]
    stats = pool.pop_episode_stats()       # EpisodeStats of the episodes finished since

What `training.evaluate`, `training.load_run(...).make_env`, `demos.record_episodes` and
the experiment scripts (evaluate.py, record_demos.py) take from an `EnvPoolEnv`, for the
JAX environments of `make_functional` (gymnax, brax): a run trained as one compiled
program (`training.make_train`) is evaluated and recorded on the host like any other.

Stepping is the functional environment's own `reset` / `step`, vmapped over `num_envs`
and jitted, so the TimeSteps are exactly those of `make_functional` (ALF semantics,
envpool's auto-reset step after LAST, the time limit as a truncation): the pool only
moves them to the host, validates actions first (`EnvPoolEnv`'s rules: a bad shape or
dtype kind, a discrete action out of range or a non-finite continuous one raises
`ValueError`; continuous actions are clipped to their bounds) and keeps episode
statistics.

Seeds: environment i is reset first with the key `jax.random.fold_in(
jax.random.PRNGKey(seed), i)`, which does not depend on `num_envs`: environment 0 of any
pool of one seed plays the same episodes (as envpool's environment 0 of `seed`). A later
`reset()` resets each environment with the key carried in its state, so it starts new
episodes; the same seed and the same actions always give the same TimeSteps.

Batched stepping (`batch_size < num_envs`, send/recv) is not offered: JAX environments
step together. Rendering is not either: gymnax has no rgb_array renderer, and brax's
(`brax.io.image`, which needs pytinyrenderer) is not wired up; `render()` and
`render_mode=` raise a `ValueError` saying so.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from offpolicy_ac.envs._envpool_env import ActionChecker
from offpolicy_ac.envs._functional import FunctionalEnv
from offpolicy_ac.envs._functional import make_functional
from offpolicy_ac.envs._timestep import ENV_ID_DTYPE
from offpolicy_ac.envs._timestep import FIRST
from offpolicy_ac.envs._timestep import LAST
from offpolicy_ac.envs._timestep import EpisodeStats
from offpolicy_ac.envs._timestep import TimeStep
from offpolicy_ac.envs._timestep import check_int

__all__ = ["FunctionalPool", "make_functional_pool", "render_unsupported_reason"]

_MAX_SEED = 2**32  # jax.random.PRNGKey keeps the low 32 bits of larger seeds


def render_unsupported_reason(task_id: str) -> str:
  """Why a functional environment's frames cannot be rendered (all of them, for now)."""
  prefix = task_id.partition(":")[0]
  if prefix == "gymnax":
    why = "gymnax environments have no rgb_array renderer"
  else:
    why = "brax's renderer (brax.io.image, which needs pytinyrenderer) is not wired up"
  return f"{task_id} cannot be rendered: {why}; evaluate without a video"


class FunctionalPool:
  """`num_envs` copies of a functional environment stepped together, NumPy out.

  Stateful on the host (it holds the environments' batched state); see the module
  docstring. Use `reset()` then `step(action)`.

  Attributes:
    env: the `FunctionalEnv`.
    spec: its `EnvSpec`, with `num_envs` and `batch_size` of this pool.
    num_envs, batch_size, is_batched: the pool's layout (batch_size = num_envs).
    is_atari: False.
    max_episode_steps: the time limit applied.
    seed: the pool's seed.
  """

  def __init__(self, env: FunctionalEnv, num_envs: int, seed: int):
    if not isinstance(env, FunctionalEnv):
      raise ValueError(
          f"env must be a FunctionalEnv (envs.make_functional), got {type(env).__name__}"
      )
    n = check_int("num_envs", num_envs, 1)
    self.seed = check_int("seed", seed, 0, _MAX_SEED)
    self.env = env
    self.spec = env.batch_spec(n)
    self.num_envs = self.batch_size = n
    self.is_batched = self.is_atari = False
    self.max_episode_steps = env.max_episode_steps
    self._check_action = ActionChecker(self.spec)
    self._reset_fn = jax.jit(jax.vmap(env.reset))
    self._step_fn = jax.jit(jax.vmap(env.step))
    self._env_ids = np.arange(n, dtype=ENV_ID_DTYPE)
    base = jax.random.PRNGKey(self.seed)
    self._first_keys = jax.vmap(lambda i: jax.random.fold_in(base, i))(jnp.arange(n))
    self._state: Any = None
    self._episode_return = np.zeros((n,), np.float64)
    self._episode_length = np.zeros((n,), np.int64)
    self._finished: list[EpisodeStats] = []

  def reset(self) -> TimeStep:
    """Resets every environment; returns their FIRST steps. Statistics of unfinished
    episodes are dropped (finished ones wait for `pop_episode_stats`)."""
    keys = self._first_keys if self._state is None else self._state.key
    self._state, ts = self._reset_fn(keys, self._env_ids)
    self._episode_return[:] = 0.0
    self._episode_length[:] = 0
    return jax.device_get(ts)

  def step(self, action: Any, env_id: Any = None) -> TimeStep:
    """Steps every environment with `action` [num_envs, *action_shape] (validated first;
    see the module docstring); returns the TimeSteps [num_envs]. After a LAST step an
    environment's action is ignored and it resets (a FIRST step, reward 0). `env_id`, as
    `EnvPoolEnv.step` takes it, may only name every environment in order (they step
    together)."""
    if env_id is not None and not np.array_equal(np.asarray(env_id), self._env_ids):
      raise ValueError(
          f"a FunctionalPool steps its {self.num_envs} environments together: env_id must be "
          f"None or all of them in order (np.arange({self.num_envs})), got {env_id!r}"
      )
    if self._state is None:
      raise RuntimeError("call reset() before the first step()")
    action = self._check_action(action, self.num_envs)
    if not self.spec.is_discrete:
      action = action.astype(np.float32)
    self._state, ts = self._step_fn(self._state, action)
    ts = jax.device_get(ts)
    self._count(ts)
    return ts

  def _count(self, ts: TimeStep) -> None:
    """Episode statistics: rewards and actions since each environment's FIRST step."""
    first = ts.step_type == FIRST
    self._episode_return = np.where(first, 0.0, self._episode_return + ts.reward)
    self._episode_length = np.where(first, 0, self._episode_length + 1)
    last = ts.step_type == LAST
    if last.any():
      self._finished.append(EpisodeStats(ts.env_id[last].astype(ENV_ID_DTYPE),
                                         self._episode_return[last].copy(),
                                         self._episode_length[last].copy()))  # fmt: skip

  def pop_episode_stats(self) -> EpisodeStats:
    """Episodes finished since the last call, in the order they finished."""
    stats = EpisodeStats.concatenate(self._finished)
    self._finished = []
    return stats

  def render(self, env_ids: Any = None) -> np.ndarray:
    """Not supported (see the module docstring): raises ValueError."""
    del env_ids
    raise ValueError(render_unsupported_reason(self.spec.task_id))

  def close(self) -> None:
    """Drops the environments' state (nothing else to release; a later reset() starts
    over from the seed)."""
    self._state = None

  def __enter__(self) -> FunctionalPool:
    return self

  def __exit__(self, *exc: Any) -> None:
    self.close()

  def __repr__(self) -> str:
    return f"FunctionalPool({self.spec.task_id!r}, num_envs={self.num_envs}, seed={self.seed})"


def make_functional_pool(
    task_id: str,
    num_envs: int,
    seed: int,
    max_episode_steps: int | None = None,
    *,
    render_mode: str | None = None,
    **kwargs: Any,
) -> FunctionalPool:
  """Makes a host-side pool of `num_envs` copies of `make_functional(task_id, ...)`.

  Args:
    task_id: "gymnax:<name>" or "brax:<name>" (see `make_functional`).
    num_envs: environments, >= 1.
    seed: in [0, 2**32); environment i is first reset with `fold_in(PRNGKey(seed), i)`.
    max_episode_steps: the time limit (None: the task's default).
    render_mode: must be None: JAX environments cannot be rendered here (a ValueError
      that says why; the argument exists so that callers asking for frames, as
      `experiments/evaluate.py --video` does, hear it before any work).
    **kwargs: passed to `make_functional` (gymnax's or brax's options).

  Raises:
    ValueError: a bad argument, naming it (before any environment is made).
  """
  if render_mode is not None:
    raise ValueError(f"render_mode={render_mode!r}: {render_unsupported_reason(task_id)}")
  check_int("num_envs", num_envs, 1)
  check_int("seed", seed, 0, _MAX_SEED)
  env = make_functional(task_id, max_episode_steps=max_episode_steps, **kwargs)
  return FunctionalPool(env, num_envs, seed)
