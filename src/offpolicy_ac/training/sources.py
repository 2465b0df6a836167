"""Where the learner's trajectories come from: one small source per actor topology.

    source = make_source(act, config, segment=0, process=0, acting=..., version=0,
                         rollout_factory=make_training_rollout, to_device=True, seed=0)
    got = source.collect(acting, version, should_stop, budget)  # Collected(traj, stats, ...)
    source.close()

* `InlineSource` (`--actors inline`): unroll, then update, in the learner's thread.
* `PoolsSource` (`--actors pools`): K pools unroll in actor threads with the same
  parameters each iteration; the learner waits for `min_pools` of them, then at most
  `grace_period_s` for the rest, and learns from their concatenation along the batch
  axis; trajectories of earlier iterations that arrive late are dropped.
* `AsyncSource` (`--actors async`): K actor threads unroll with the newest parameters
  and observation statistics they have (sent after every iteration, with or without an
  update); the learner takes each trajectory as it arrives, dropping those more than
  `max_policy_lag` updates old; once the dropped ones' steps reach `budget` (the steps
  left to the run's next log, evaluation or checkpoint point, or its end), it hands over
  none (`Collected.short`), so that an iteration never runs past that point by more than
  one unroll.

Pools come from a `RolloutFactory`: `factory(act, config, seed, to_device) -> rollout`
whose `.env` is the pool it steps. Tests pass their own factory (fakes, counters).
"""

from __future__ import annotations

import time
from typing import Any
from typing import Callable
from typing import NamedTuple

import jax
import numpy as np

from offpolicy_ac import envs
from offpolicy_ac.training.actors import Actors
from offpolicy_ac.training.config import TrainConfig

RolloutFactory = Callable[[Callable, TrainConfig, int, bool], Any]


def task_kwargs(config: TrainConfig) -> dict:
  """The envpool settings of the config's task (shared by its pools and its spec)."""
  if config.env.max_episode_steps is None:
    return {}
  return {"max_episode_steps": config.env.max_episode_steps}


def task_spec(config: TrainConfig) -> envs.EnvSpec:
  """The training pools' spec, from envpool's spec alone (no pool is built); for a JAX
  environment (`config.compiled`) the functional environment's, as `make_train` builds
  its agent with."""
  if config.compiled:
    env = envs.make_functional(config.env.env_id, **task_kwargs(config))
    return env.batch_spec(config.env.num_envs)
  return envs.spec(config.env.env_id, atari=config.env.atari, num_envs=config.env.num_envs,
                   **task_kwargs(config))  # fmt: skip


def make_env(config: TrainConfig, num_envs: int, seed: int, *, train: bool = True,
             batch_size: int = 0, **envpool_kwargs) -> Any:  # fmt: skip
  """A pool of the config's task: training (batched stepping when `batch_size` is set)
  or evaluation (`train=False`: Atari with raw rewards). `envpool_kwargs` are
  further envpool options (e.g. `render_mode="rgb_array"`). For a JAX environment
  (`config.compiled`): a host pool over it, an `envs.FunctionalPool` (`train` makes no
  difference; batched stepping and rendering are refused)."""
  kwargs = {**task_kwargs(config), **envpool_kwargs}
  if config.compiled:
    if batch_size:
      raise ValueError(f"batch_size={batch_size}: {config.env.env_id} steps all its "
                       "environments together (no batched stepping)")  # fmt: skip
    return envs.make_functional_pool(config.env.env_id, num_envs, seed, **kwargs)
  if batch_size:
    kwargs["batch_size"] = batch_size
  if config.env.atari:
    return envs.make_atari(config.env.env_id, num_envs, seed, train=train, **kwargs)
  return envs.make(config.env.env_id, num_envs, seed, **kwargs)


def make_training_rollout(act: Callable, config: TrainConfig, seed: int, to_device: bool) -> Any:
  """A pool of `num_envs` training environments seeded `seed` and the config's rollout
  over it (`rollout.env` is the pool). The pool is closed again if the rollout cannot be
  made (e.g. the compiled loop refuses the task)."""
  env = make_env(config, config.env.num_envs, seed, batch_size=config.env.env_batch_size)
  try:
    return envs.make_rollout(
        env, act, config.env.unroll_length, backend=config.env.rollout, to_device=to_device
    )
  except Exception:
    env.close()
    raise


POOLS = ("training", "evaluation", "evaluate")
"""The kinds of environment pool `pool_seed` tells apart: a run's training pools, its
evaluation pools, and the pools that play a finished run's episodes (evaluate.py,
record_demos.py)."""


def pool_seed(seed: int, pool: str, *, segment: int = 0, process: int = 0, actor: int = 0) -> int:
  """The environment seed of one pool: of kind `pool` (`POOLS`) of a run with seed `seed`,
  in segment `segment` of process `process` (actor thread `actor`'s, with --actors pools or
  async).

  envpool seeds environment i of a pool with `pool seed + i`, so two pools whose seeds lie
  close share environments: with seeds s and s + 1, the first's environment 1 is the
  second's environment 0 (the same initial states, the same random draws). The seed is
  hashed from all five (NumPy's `SeedSequence`), so that runs of other seeds, a run's
  evaluations, its segments and its actors get unrelated environments. It lies in
  [0, 2**31 - 2**20): room for i below envpool's limit.
  """
  if pool not in POOLS:
    raise ValueError(f"pool {pool!r}: one of {POOLS}")
  if min(seed, segment, process, actor) < 0:
    raise ValueError(f"pool_seed takes ints >= 0, got seed={seed}, segment={segment}, "
                     f"process={process}, actor={actor}")  # fmt: skip
  entropy = [seed, POOLS.index(pool), segment, process, actor]
  return int(np.random.SeedSequence(entropy).generate_state(1)[0]) % (2**31 - 2**20)


class Collected(NamedTuple):
  """What a source hands the learner: one trajectory [T+1, B_local] (None when asked to
  stop, or when `short`), the episodes finished, and the env steps it took, including
  those of dropped trajectories. `short`: every trajectory was dropped until the steps
  reached the budget (an iteration without an update, not a stop)."""

  traj: Any
  stats: list
  env_steps: int
  discarded: int = 0
  policy_lag: float | None = None
  short: bool = False


class InlineSource:
  """Unroll, then update, in this thread (see the module docstring)."""

  def __init__(self, rollout: Any, key: jax.Array, acting: Any, steps: int):
    self.rollout, self.env, self._steps = rollout, rollout.env, steps
    self.state = rollout.init(acting, key)

  def collect(self, acting: Any, version: int, should_stop: Callable,
              budget: int | None = None) -> Collected:  # fmt: skip
    del version, should_stop, budget
    self.state, traj, stats = self.rollout.unroll(acting, self.state)
    return Collected(traj, [stats], self._steps)

  def close(self) -> None:
    self.env.close()


class _ThreadSource:
  """K actor threads over K pools; `collect` is the topology's."""

  def __init__(self, rollouts: list, keys: list, acting: Any, version: int,
               config: TrainConfig, gated: bool):  # fmt: skip
    self.config, self.num_actors = config, len(rollouts)
    self._steps = config.steps_per_unroll
    self.actors = Actors(
        rollouts, keys, acting, version=version,
        queue_size=config.acting.actor_queue_size or self.num_actors, gated=gated,
    )  # fmt: skip

  def _next(self, stats: list, timeout: float):
    item = self.actors.get(timeout=timeout)
    if item is not None:
      stats.append(item.stats)
    return item

  def close(self) -> None:
    self.actors.close()


class AsyncSource(_ThreadSource):
  """`--actors async`: each trajectory as it arrives (see the module docstring)."""

  def __init__(self, rollouts, keys, acting, version, config):
    super().__init__(rollouts, keys, acting, version, config, gated=False)
    self._published = acting

  def collect(self, acting: Any, version: int, should_stop: Callable,
              budget: int | None = None) -> Collected:  # fmt: skip
    # New parameters or new transformer statistics: an off-policy agent makes no update
    # while its replay fills, but its observation statistics grow with every unroll.
    if acting is not self._published:
      self.actors.publish(acting, version)
      self._published = acting
    stats, steps, dropped = [], 0, 0
    lag_limit = self.config.acting.max_policy_lag
    while True:
      item = self._next(stats, 0.05)
      if item is None:
        if should_stop():
          return Collected(None, stats, steps, dropped)
        continue
      steps += self._steps
      lag = version - item.version
      if lag_limit is not None and lag > lag_limit:
        dropped += 1
        if budget is not None and steps >= budget:  # at the point, nothing to learn from
          return Collected(None, stats, steps, dropped, short=True)
        continue
      return Collected(item.traj, stats, steps, dropped, float(lag))


class PoolsSource(_ThreadSource):
  """`--actors pools`: one round of every pool's unroll (see the module docstring).

  Trajectories are tagged with a round (one per `collect`), not the update count: an
  iteration that makes no update (off-policy before min_replay_size) must still let the
  gated actors unroll again.
  """

  def __init__(self, rollouts, keys, acting, version, config):
    del version
    super().__init__(rollouts, keys, acting, 0, config, gated=True)
    self.min_pools = config.acting.min_pools or self.num_actors
    self._round = None

  def collect(self, acting: Any, version: int, should_stop: Callable,
              budget: int | None = None) -> Collected:  # fmt: skip
    del version, budget
    if self._round is None:  # the actors already unroll the initial parameters
      self._round = 0
    else:
      self._round += 1
      self.actors.publish(acting, self._round)
    stats, steps, late, fresh = [], 0, 0, []
    deadline = None
    while len(fresh) < self.num_actors:
      wait = 0.05 if deadline is None else min(0.05, max(deadline - time.monotonic(), 0.0))
      item = self._next(stats, wait)
      if item is None:
        if should_stop():
          return Collected(None, stats, steps, late)
        if deadline is not None and time.monotonic() >= deadline:
          break
        continue
      steps += self._steps
      if item.version != self._round:
        late += 1
        continue
      fresh.append(item)
      if deadline is None and len(fresh) >= self.min_pools:
        deadline = time.monotonic() + self.config.acting.grace_period_s
    fresh.sort(key=lambda it: it.actor_id)
    traj = jax.tree.map(lambda *xs: np.concatenate(xs, axis=1), *[it.traj for it in fresh])
    return Collected(traj, stats, steps, late, 0.0)


def make_source(act: Callable, config: TrainConfig, *, seed: int, segment: int, process: int,
                acting: Any, version: int, rollout_factory: RolloutFactory,
                to_device: bool) -> Any:  # fmt: skip
  """The config's source for one seed's learner in this segment and process."""
  if not config.uses_actor_threads:
    env_seed = pool_seed(seed, "training", segment=segment, process=process)
    rollout = rollout_factory(act, config, env_seed, to_device)
    key = jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(seed), process), segment)
    try:
      return InlineSource(rollout, key, acting, config.steps_per_unroll)
    except Exception:
      rollout.env.close()
      raise
  rollouts, keys = [], []
  try:
    for i in range(config.acting.num_actors):
      env_seed = pool_seed(seed, "training", segment=segment, process=process, actor=i)
      rollouts.append(rollout_factory(act, config, env_seed, False))
      keys.append(jax.random.fold_in(jax.random.PRNGKey(env_seed), segment))
  except Exception:
    for r in rollouts:
      r.env.close()
    raise
  cls = AsyncSource if config.acting.actors == "async" else PoolsSource
  return cls(rollouts, keys, acting, version, config)
