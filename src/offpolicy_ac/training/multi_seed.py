"""Several seeds in one process with vmapped learners (`--num-seeds N`).

Seed k (= seed, seed + 1, ...) gets exactly what a single run with that seed
gets: its agent and replay keys, its own environment pool and evaluation pool
with the seeds a single run would use, and its own run directory
`<run_dir>/seed<k>` (metrics.jsonl, TensorBoard, PNG). The learners are one
computation: the agent state is stacked along a leading seed axis [N, ...] and
`init` / `update` (and for off-policy agents the replay add and sampling) are
`jax.vmap`ped, so N seeds cost one compiled update. The pools are stepped one
after the other, each with its seed's parameters.

The run is cut into segments at checkpoints exactly like the single-seed loop
(loop.py), so a resumed multi-seed run logs exactly what the uninterrupted one
logs. One checkpoint (in `<run_dir>/checkpoints`) holds every seed's state.
With `target_return`, the run stops once every seed's evaluation reached it.

Not vmapped (run_experiment then runs the seeds one after the other): actor
threads, several learner devices or processes, whole-replay-buffer training.
"""

from __future__ import annotations

import dataclasses
from typing import Any
from typing import Callable
from typing import Optional
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from offpolicy_ac.agents.base import Agent
from offpolicy_ac.training.clock import seconds_since_launch
from offpolicy_ac.training.evaluation import evaluate
from offpolicy_ac.training.logger import RunLogger
from offpolicy_ac.training.loop import LoopConfig
from offpolicy_ac.training.loop import NonFiniteError
from offpolicy_ac.training.loop import RunResult
from offpolicy_ac.training.loop import _Background
from offpolicy_ac.training.loop import _flush
from offpolicy_ac.training.loop import _fresh_counters
from offpolicy_ac.training.loop import _InlineSource
from offpolicy_ac.training.loop import example_trajectory
from offpolicy_ac.training.loop import make_env
from offpolicy_ac.training.loop import make_replay
from offpolicy_ac.training.loop import make_sample_and_update
from offpolicy_ac.training.loop import mark_cut
from offpolicy_ac.training.loop import next_point
from offpolicy_ac.training.loop import restore_training_state
from offpolicy_ac.training.loop import segment_seed

# Counter fields shared by every seed (the seeds advance in lockstep).
_SHARED = (
    "env_steps",
    "segment",
    "log_lines",
    "wall_time_s",
    "next_log",
    "next_eval",
    "next_checkpoint",
)


def vmap_unsupported_reason(config: LoopConfig) -> Optional[str]:
  """Why `config`'s seeds cannot share a vmapped learner (None: they can)."""
  if config.uses_actor_threads:
    return "actor threads (async_actors / actor_pools)"
  if config.learner_devices > 1 or config.num_processes > 1:
    return "a learner over several devices or processes"
  if config.whole_replay_buffer_training:
    return "whole-replay-buffer training (a data-dependent number of batches)"
  return None


def _stack(trees: Sequence[Any]) -> Any:
  """Stacks the trees along a new seed axis on the host, then copies the result to the
  device once."""
  return jax.device_put(jax.tree.map(lambda *xs: np.stack(xs), *trees))


def _index(tree: Any, k: int) -> Any:
  return jax.tree.map(lambda x: x[k], tree)


def _make_vmapped_train_iter(agent: Agent, replay, config: LoopConfig, batch_fn):
  """(train_iter, warmup) over a leading seed axis; see loop._make_train_iter."""
  update = jax.jit(jax.vmap(agent.update))
  if not agent.off_policy:

    def train_on_policy(state, replay_state, traj, key, size):
      del key, size
      state, metrics = update(state, traj)
      return state, replay_state, metrics

    def warmup_on_policy(state, replay_state, traj):
      jax.block_until_ready(update(state, traj))

    return train_on_policy, warmup_on_policy

  num_updates = config.num_updates_per_train_iter
  sample_and_update = jax.jit(
      jax.vmap(make_sample_and_update(agent, replay, num_updates, batch_fn))
  )
  add = jax.jit(jax.vmap(replay.add))

  def train_iter(state, replay_state, traj, key, size):
    """`size`: the buffer's fill after this add (the same for every seed)."""
    replay_state = add(replay_state, traj)
    fresh_metrics = None
    if agent.fresh_update_first:
      state, fresh_metrics = update(state, traj)
    if size < config.min_replay_size:
      return state, replay_state, fresh_metrics
    state, metrics = sample_and_update(state, replay_state, key)
    if fresh_metrics is not None:
      metrics = jax.tree.map(
          lambda f, m: (f + num_updates * m) / (num_updates + 1), fresh_metrics, metrics
      )
    return state, replay_state, metrics

  def warmup(state, replay_state, traj):
    replay_state = add(replay_state, traj)
    if agent.fresh_update_first:
      jax.block_until_ready(update(state, traj))
    keys = jax.random.split(jax.random.PRNGKey(0), state.num_updates.shape[0])
    jax.block_until_ready(sample_and_update(state, replay_state, keys))

  return train_iter, warmup


def train_seeds(
    agent_factory: Callable[[Any], Agent],
    config: LoopConfig,
    loggers: Sequence[RunLogger],
    *,
    batch_fn: Optional[Callable] = None,
    checkpointer: Any = None,
    resume: bool = False,
    should_stop: Callable[[], bool] = lambda: False,
) -> list[RunResult]:
  """Trains `config.num_seeds` seeds with one vmapped learner; one logger per seed.

  Returns one RunResult per seed (its `agent_state` unstacked).
  """
  config.validate()
  reason = vmap_unsupported_reason(config)
  if reason is not None:
    raise ValueError(f"seeds cannot share a vmapped learner with {reason}")
  num = config.num_seeds
  if len(loggers) != num:
    raise ValueError(f"need one logger per seed ({num}), got {len(loggers)}")
  seeds = [config.seed + k for k in range(num)]
  seed_configs = [dataclasses.replace(config, seed=s, num_seeds=1) for s in seeds]
  probe = make_env(config, 1, config.seed)
  spec = probe.spec._replace(num_envs=config.num_envs, batch_size=config.num_envs)
  probe.close()
  agent = agent_factory(spec)
  replay = make_replay(config) if agent.off_policy else None

  keys = [jax.random.split(jax.random.PRNGKey(s)) for s in seeds]
  # Eager vmap: jit(vmap(init)) of ACER deadlocks XLA:CPU (jax 0.10.2).
  state = jax.vmap(agent.init)(jnp.stack([k[0] for k in keys]))
  replay_key = jnp.stack([k[1] for k in keys])
  example = example_trajectory(agent, _index(state.params, 0), config)
  replay_state = (
      jax.tree.map(lambda x: jnp.broadcast_to(x, (num,) + x.shape), replay.init(example))
      if replay
      else None
  )
  cs = [_fresh_counters(config) for _ in seeds]
  wall_offset = 0.0
  if resume:
    restored = restore_training_state(checkpointer, state, replay_state, replay_key)
    if restored is None:
      for logger in loggers:
        logger.truncate(0)
    else:
      state, replay_state, replay_key = restored.state, restored.replay_state, restored.replay_key
      cs = [{**_fresh_counters(config), **c} for c in restored.record["counters"]]
      for logger, c in zip(loggers, cs):
        logger.truncate(c["log_lines"])
      wall_offset = cs[0]["wall_time_s"] - seconds_since_launch()
  stored = int(replay_state.size[0]) if replay_state is not None else 0

  train_iter, warmup = _make_vmapped_train_iter(agent, replay, config, batch_fn)
  # Each seed's parameters for acting, split off in one compiled call per iteration.
  unstack = jax.jit(lambda tree: [_index(tree, k) for k in range(num)])
  greedy = jax.jit(agent.greedy_act)
  batch_example = _stack([example] * num)
  warm = _Background(warmup, state, replay_state, batch_example)
  shared = cs[0]

  def make_pools(segment):
    # Host trajectories: the seeds' unrolls are stacked on the host and copied to the
    # device once per iteration.
    sources = [
        _InlineSource(agent, c, segment, 0, to_device=False, params=p)
        for c, p in zip(seed_configs, unstack(state.params))
    ]
    evals = (
        [
            make_env(config, config.eval_episodes, segment_seed(s + 7, segment), train=False)
            for s in seeds
        ]
        if config.eval_every
        else [None] * num
    )
    return sources, evals

  def close(sources, evals):
    for source in sources:
      source.close()
    for env in evals:
      if env is not None:
        env.close()

  def save(env_steps):
    if checkpointer is not None:
      for c in cs:
        c["wall_time_s"] = wall_offset + seconds_since_launch()
      checkpointer.save(
          env_steps,
          {"agent": state, "replay": replay_state, "replay_key": replay_key},
          {"counters": cs},
      )

  def advance(field, value):
    for c in cs:
      c[field] = value

  sources, evals = make_pools(shared["segment"])
  steps_per_iter = config.unroll_length * config.num_envs
  last_log_time, last_log_steps = seconds_since_launch(), shared["env_steps"]
  interrupted = False
  ever_reached = [bool(c["reached"]) for c in cs]
  try:
    while shared["env_steps"] < config.total_env_steps and not all(ever_reached):
      if should_stop():
        advance("segment", shared["segment"] + 1)
        save(shared["env_steps"])
        interrupted = True
        break
      trajs = []
      seed_params = unstack(state.params)
      for k, source in enumerate(sources):
        got = source.collect(seed_params[k], 0, should_stop)
        trajs.append(got.traj)
        for stats in got.stats:
          cs[k]["returns"].extend(stats.episode_return.tolist())
          cs[k]["lengths"].extend(stats.episode_length.tolist())
      advance("env_steps", shared["env_steps"] + steps_per_iter)
      env_steps = shared["env_steps"]
      end = env_steps >= config.total_env_steps
      due = shared["next_checkpoint"] is not None and env_steps >= shared["next_checkpoint"]
      if due or end:
        trajs = [mark_cut(t) for t in trajs]
      traj = _stack(trajs)
      warm.join()
      if agent.off_policy:
        split = jax.vmap(jax.random.split)(replay_key)
        replay_key, sub = split[:, 0], split[:, 1]
        stored = min(stored + config.num_envs, config.replay_capacity)
        state, replay_state, metrics = train_iter(state, replay_state, traj, sub, stored)
      else:
        state, replay_state, metrics = train_iter(state, replay_state, traj, None, None)
      num_updates = np.asarray(state.num_updates)
      if metrics is not None:
        host = jax.device_get(metrics)
        for name, values in host.items():
          for k, value in enumerate(np.asarray(values)):
            if not np.isfinite(value):
              raise NonFiniteError(
                  f"non-finite {name} = {value} for seed {seeds[k]} at env step "
                  f"{env_steps} (update {int(num_updates[k])}); stopping. The last good "
                  "checkpoint is kept"
                  + (f" in {checkpointer.directory}" if checkpointer is not None else "")
                  + "."
              )
            cs[k]["metric_sums"][name] = cs[k]["metric_sums"].get(name, 0.0) + float(value)
        for c in cs:
          c["metric_count"] += 1

      logged = False
      eval_now = shared["next_eval"] is not None and env_steps >= shared["next_eval"]
      if env_steps >= shared["next_log"] or eval_now:
        eval_params = unstack(state.params) if eval_now else None
        for k, (c, logger) in enumerate(zip(cs, loggers)):
          record = _flush(
              c, env_steps, wall_offset, last_log_time, last_log_steps, int(num_updates[k])
          )
          if eval_now:
            returns = evaluate(evals[k], greedy, eval_params[k], config.eval_episodes)
            c["last_eval"] = float(np.mean(returns))
            record["eval_return"] = c["last_eval"]
            record["eval_return_min"] = float(np.min(returns))
            c["reached"] = (
                config.target_return is not None and c["last_eval"] >= config.target_return
            )
            ever_reached[k] = ever_reached[k] or c["reached"]
          logger.log(record)
        if eval_now:
          advance("next_eval", next_point(shared["next_eval"], config.eval_every, env_steps))
        advance("log_lines", shared["log_lines"] + 1)
        logged = True
        advance("next_log", next_point(shared["next_log"], config.log_every, env_steps))
        last_log_time, last_log_steps = seconds_since_launch(), env_steps

      end = end or all(ever_reached)
      if due or end:
        advance("segment", shared["segment"] + 1)
        if shared["next_checkpoint"] is not None:
          advance(
              "next_checkpoint",
              next_point(shared["next_checkpoint"], config.checkpoint_every, env_steps),
          )
        save(env_steps)
        if not end:
          close(sources, evals)
          sources, evals = make_pools(shared["segment"])
      if end and not logged and (shared["returns"] or shared["metric_count"]):
        for k, (c, logger) in enumerate(zip(cs, loggers)):
          record = _flush(
              c, env_steps, wall_offset, last_log_time, last_log_steps, int(num_updates[k])
          )
          record["final"] = True
          logger.log(record)
  finally:
    close(sources, evals)
  wall = wall_offset + seconds_since_launch()
  num_updates = np.asarray(state.num_updates)
  return [
      RunResult(
          env_steps=shared["env_steps"],
          num_updates=int(num_updates[k]),
          wall_time_s=wall,
          reached_target=ever_reached[k],
          last_eval_return=cs[k]["last_eval"],
          interrupted=interrupted,
          agent_state=_index(state, k),
      )
      for k in range(num)
  ]
