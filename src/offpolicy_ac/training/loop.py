"""The training loop (ALF's scheme): alternate an unroll with a training iteration.

On-policy agents update once on each fresh unroll [T+1, B]. Off-policy agents
store raw unrolls in a sequence replay buffer and run
`num_updates_per_train_iter` updates on sampled `(mini_batch_size,
mini_batch_length)` windows per iteration, or, with
`whole_replay_buffer_training`, sweep the whole buffer shuffled along the batch
axis in mini-batches. Every `log_every` env steps a line goes to metrics.jsonl;
Agents with `fresh_update_first` (ACER) also update once on each fresh
unroll before the replayed updates. Every `eval_every` env steps the greedy policy is evaluated on a separate env
pool, and the run stops once the mean evaluation return reaches
`target_return`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from offpolicy_ac import envs
from offpolicy_ac import replay as replay_lib
from offpolicy_ac.agents.base import Agent
from offpolicy_ac.training.clock import seconds_since_launch
from offpolicy_ac.training.evaluation import evaluate
from offpolicy_ac.training.logger import RunLogger


@dataclasses.dataclass(frozen=True)
class LoopConfig:
  env_id: str = "CartPole-v1"
  """envpool task id."""
  seed: int = 0
  """Seeds the agent, the environments and replay sampling."""
  total_env_steps: int = 500_000
  """Budget of environment steps (all envs together)."""
  num_envs: int = 16
  """Environments stepped together."""
  unroll_length: int = 16
  """T: steps per environment per unroll (trajectories are [T+1, num_envs])."""
  max_episode_steps: Optional[int] = None
  """Override the task's time limit (envpool's max_episode_steps)."""
  log_every: int = 5_000
  """Env steps between metrics.jsonl lines."""
  eval_every: int = 0
  """Env steps between greedy evaluations (0: never)."""
  eval_episodes: int = 5
  """Episodes per evaluation, each on its own environment."""
  target_return: Optional[float] = None
  """Stop once an evaluation's mean return reaches this."""
  replay_capacity: int = 2_000
  """Off-policy: stored sequences (each unroll adds num_envs of them)."""
  min_replay_size: int = 64
  """Off-policy: sequences stored before training starts."""
  num_updates_per_train_iter: int = 1
  """Off-policy: updates per training iteration."""
  mini_batch_size: int = 64
  """Off-policy: sequences per update."""
  mini_batch_length: int = 8
  """Off-policy: transitions per sampled sequence (windows of length + 1 steps)."""
  whole_replay_buffer_training: bool = False
  """Off-policy: sweep the whole shuffled buffer each iteration instead of sampling."""

  def validate(self) -> None:
    for name in ("total_env_steps", "num_envs", "unroll_length", "log_every",
                 "eval_episodes", "replay_capacity", "num_updates_per_train_iter",
                 "mini_batch_size", "mini_batch_length"):
      value = getattr(self, name)
      if not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    if self.eval_every < 0:
      raise ValueError(f"eval_every must be >= 0, got {self.eval_every}")
    if self.target_return is not None and self.eval_every == 0:
      raise ValueError("target_return needs evaluations: set eval_every > 0")
    if self.max_episode_steps is not None and self.max_episode_steps < 1:
      raise ValueError(f"max_episode_steps must be >= 1, got {self.max_episode_steps}")


@dataclasses.dataclass
class RunResult:
  env_steps: int
  num_updates: int
  wall_time_s: float
  reached_target: bool
  last_eval_return: Optional[float]
  agent_state: Any


def env_kwargs(config: LoopConfig) -> dict:
  return {} if config.max_episode_steps is None else {
      "max_episode_steps": config.max_episode_steps}


def make_replay(agent: Agent, config: LoopConfig) -> replay_lib.SequenceReplay:
  return replay_lib.make_sequence_replay(
      capacity=config.replay_capacity, sequence_length=config.unroll_length + 1,
      sample_length=config.mini_batch_length + 1, batch_size=config.mini_batch_size)


def train(agent_factory: Callable[[Any], Agent], config: LoopConfig, logger: RunLogger,
          *, batch_fn: Optional[Callable] = None) -> RunResult:
  """Runs the loop. `agent_factory(spec) -> Agent` is called once the env exists.

  `batch_fn(batch, key) -> batch` (optional) transforms each sampled replay batch
  before the update (e.g. SQIL mixes in demonstrations).
  """
  config.validate()
  env = envs.make(config.env_id, config.num_envs, config.seed, **env_kwargs(config))
  agent = agent_factory(env.spec)
  replay = make_replay(agent, config) if agent.off_policy else None
  if agent.off_policy and config.min_replay_size > config.replay_capacity:
    raise ValueError(f"min_replay_size ({config.min_replay_size}) exceeds "
                     f"replay_capacity ({config.replay_capacity})")
  eval_env = (envs.make(config.env_id, config.eval_episodes, config.seed + 1_000_003,
                        **env_kwargs(config)) if config.eval_every else None)
  greedy = jax.jit(agent.greedy_act)

  key = jax.random.PRNGKey(config.seed)
  agent_key, rollout_key, replay_key = jax.random.split(key, 3)
  state = agent.init(agent_key)
  rollout = envs.make_rollout(env, agent.act, config.unroll_length)
  rollout_state = rollout.init(rollout_key)

  train_iter = _make_train_iter(agent, replay, config, batch_fn)
  replay_state = None
  env_steps, iteration = 0, 0
  steps_per_iter = config.unroll_length * config.num_envs
  next_log, next_eval = config.log_every, (config.eval_every or math.inf)
  returns, lengths, metric_sums, metric_count = [], [], {}, 0
  last_log_time, last_log_steps = seconds_since_launch(), 0
  last_eval, reached = None, False

  while env_steps < config.total_env_steps:
    rollout_state, traj, stats = rollout.unroll(state.params, rollout_state)
    env_steps += steps_per_iter
    iteration += 1
    returns.extend(stats.episode_return.tolist())
    lengths.extend(stats.episode_length.tolist())
    if agent.off_policy:
      if replay_state is None:
        replay_state = replay.init(traj)
      replay_key, sub = jax.random.split(replay_key)
      state, replay_state, metrics = train_iter(state, replay_state, traj, sub)
    else:
      state, metrics = train_iter(state, traj)
    if metrics is not None:
      metric_count += 1
      for k, v in metrics.items():
        metric_sums[k] = metric_sums.get(k, 0.0) + v

    eval_now = env_steps >= next_eval
    if env_steps >= next_log or eval_now or env_steps >= config.total_env_steps:
      now = seconds_since_launch()
      record = {"env_steps": env_steps, "wall_time_s": now,
                "episode_return": float(np.mean(returns)) if returns else None,
                "episode_length": float(np.mean(lengths)) if lengths else None,
                "episodes": len(returns), "num_updates": int(state.num_updates),
                "env_steps_per_s": (env_steps - last_log_steps) / max(now - last_log_time, 1e-9)}
      if metric_count:
        host = jax.device_get(metric_sums)
        record.update({k: float(v) / metric_count for k, v in host.items()})
      if eval_now:
        eval_returns = evaluate(eval_env, greedy, state.params, config.eval_episodes)
        last_eval = float(np.mean(eval_returns))
        record["eval_return"] = last_eval
        record["eval_return_min"] = float(np.min(eval_returns))
        reached = config.target_return is not None and last_eval >= config.target_return
        while next_eval <= env_steps:
          next_eval += config.eval_every
      logger.log(record)
      while next_log <= env_steps:
        next_log += config.log_every
      returns, lengths, metric_sums, metric_count = [], [], {}, 0
      last_log_time, last_log_steps = now, env_steps
      if reached:
        break

  env.close()
  if eval_env is not None:
    eval_env.close()
  return RunResult(env_steps=env_steps, num_updates=int(state.num_updates),
                   wall_time_s=seconds_since_launch(), reached_target=reached,
                   last_eval_return=last_eval, agent_state=state)


def _make_train_iter(agent: Agent, replay, config: LoopConfig, batch_fn):
  if not agent.off_policy:
    return agent.update

  num_updates = config.num_updates_per_train_iter
  min_size = config.min_replay_size

  @jax.jit
  def sample_and_update(state, replay_state, key):
    def body(state, key):
      batch_key, fn_key = jax.random.split(key)
      batch = replay.sample(replay_state, batch_key)
      if batch_fn is not None:
        batch = batch_fn(batch, fn_key)
      return agent.update(state, batch)
    state, metrics = jax.lax.scan(body, state, jax.random.split(key, num_updates))
    return state, jax.tree.map(jnp.mean, metrics)

  @jax.jit
  def sweep(state, batches):
    state, metrics = jax.lax.scan(agent.update, state, batches)
    return state, jax.tree.map(jnp.mean, metrics)

  add = jax.jit(replay.add)

  def train_iter(state, replay_state, traj, key):
    replay_state = add(replay_state, traj)
    fresh_metrics = None
    if agent.fresh_update_first:
      state, fresh_metrics = agent.update(state, traj)
    if int(replay_state.size) < min_size:
      return state, replay_state, fresh_metrics
    if config.whole_replay_buffer_training:
      epoch_key, key = jax.random.split(key)
      batches = replay.epoch(replay_state, epoch_key)
      if batch_fn is not None:
        batches = jax.vmap(batch_fn)(batches, jax.random.split(key, jax.tree.leaves(batches)[0].shape[0]))
      state, metrics = sweep(state, batches)
    else:
      state, metrics = sample_and_update(state, replay_state, key)
    if fresh_metrics is not None:  # average the fresh update in with equal weight
      n = config.num_updates_per_train_iter
      metrics = jax.tree.map(lambda f, m: (f + n * m) / (n + 1), fresh_metrics, metrics)
    return state, replay_state, metrics

  return train_iter
