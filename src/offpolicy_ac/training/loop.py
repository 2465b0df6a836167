"""The training loop (ALF's scheme): alternate an unroll with a training iteration.

On-policy agents update once on each fresh unroll [T+1, B]. Off-policy agents
store raw unrolls in a sequence replay buffer and run
`num_updates_per_train_iter` updates on sampled `(mini_batch_size,
mini_batch_length)` windows per iteration, or, with
`whole_replay_buffer_training`, sweep the whole buffer shuffled along the batch
axis in mini-batches. Agents with `fresh_update_first` (ACER) also update once
on each fresh unroll before the replayed updates. Every `log_every` env steps a
line goes to metrics.jsonl; every `eval_every` env steps the greedy policy is
evaluated on a separate env pool, and the run stops once the mean evaluation
return reaches `target_return`.

Checkpoints and exact resume. Environments cannot be snapshotted, so the run is
cut into *segments* at checkpoint points (every `checkpoint_every` env steps):
at a cut the last step of the unroll is recorded as a time-limit truncation
(LAST with discount 1, so its value is still bootstrapped and learning is not
biased), the whole state is checkpointed, and every environment is re-created
with a seed derived from (seed, segment). An uninterrupted run does exactly the
same, so a run stopped at a checkpoint point and resumed logs exactly what the
uninterrupted run logs (every number of metrics.jsonl but the wall-clock ones).
"""

from __future__ import annotations

import dataclasses
import threading
import warnings
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

# Fields of a metrics line that depend on the wall clock (excluded from exact resume).
WALL_CLOCK_FIELDS = ("wall_time_s", "env_steps_per_s")


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
  atari: bool = False
  """Atari preprocessing (84x84 grey, frame stack 4, no-op starts; episodic life and
  reward clipping for training only); returns are raw game scores."""
  log_every: int = 5_000
  """Env steps between metrics.jsonl lines."""
  eval_every: int = 0
  """Env steps between greedy evaluations (0: never)."""
  eval_episodes: int = 5
  """Episodes per evaluation, each on its own environment."""
  target_return: Optional[float] = None
  """Stop once an evaluation's mean return reaches this."""
  checkpoint_every: int = 10_000
  """Env steps between checkpoints (0: none, not even at the end)."""
  keep_checkpoints: int = 3
  """How many of the newest checkpoints are kept."""
  num_seeds: int = 1
  """Run this many seeds (seed, seed + 1, ...), each with its own env pools, run
  directory <run-dir>/seed<k> and logs, one after the other; plus a plot of all."""
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
                 "mini_batch_size", "mini_batch_length", "keep_checkpoints", "num_seeds"):
      value = getattr(self, name)
      if not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    for name in ("eval_every", "checkpoint_every"):
      if getattr(self, name) < 0:
        raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
    if self.target_return is not None and self.eval_every == 0:
      raise ValueError("target_return needs evaluations: set eval_every > 0")
    if self.max_episode_steps is not None and self.max_episode_steps < 1:
      raise ValueError(f"max_episode_steps must be >= 1, got {self.max_episode_steps}")
    if self.min_replay_size > self.replay_capacity:
      raise ValueError(f"min_replay_size ({self.min_replay_size}) exceeds "
                       f"replay_capacity ({self.replay_capacity})")


@dataclasses.dataclass
class RunResult:
  env_steps: int
  num_updates: int
  wall_time_s: float
  reached_target: bool
  last_eval_return: Optional[float]
  interrupted: bool
  agent_state: Any


class NonFiniteError(FloatingPointError):
  """A loss or gradient became NaN or infinite."""


def env_kwargs(config: LoopConfig) -> dict:
  return {} if config.max_episode_steps is None else {
      "max_episode_steps": config.max_episode_steps}


def make_env(config: LoopConfig, num_envs: int, seed: int, *, train: bool = True):
  """A training (or evaluation) pool for the config's task."""
  if config.atari:
    return envs.make_atari(config.env_id, num_envs, seed, train=train, **env_kwargs(config))
  return envs.make(config.env_id, num_envs, seed, **env_kwargs(config))


def segment_seed(seed: int, segment: int) -> int:
  """Environment seed of a segment (segment 0 uses `seed` itself)."""
  return (seed + 1_000_003 * segment) % (2**31 - 1)


def make_replay(config: LoopConfig) -> replay_lib.SequenceReplay:
  return replay_lib.make_sequence_replay(
      capacity=config.replay_capacity, sequence_length=config.unroll_length + 1,
      sample_length=config.mini_batch_length + 1, batch_size=config.mini_batch_size)


def example_trajectory(agent: Agent, params: Any, config: LoopConfig) -> envs.Trajectory:
  """Zeros shaped like the rollout's trajectories [T+1, num_envs, ...]."""
  spec = agent.spec
  lead = (config.unroll_length + 1, config.num_envs)
  obs = jax.ShapeDtypeStruct((config.num_envs,) + tuple(spec.observation_shape),
                             jnp.dtype(spec.observation_dtype))
  action, extras = jax.eval_shape(agent.act, params, obs, jax.random.PRNGKey(0))
  zeros = lambda s: jnp.zeros(lead + tuple(s.shape[1:]), s.dtype)
  return envs.Trajectory(
      step_type=jnp.zeros(lead, jnp.int32), reward=jnp.zeros(lead, jnp.float32),
      discount=jnp.zeros(lead, jnp.float32),
      observation=jnp.zeros(lead + tuple(spec.observation_shape), obs.dtype),
      env_id=jnp.zeros(lead, jnp.int32), action=zeros(action),
      extras=jax.tree.map(zeros, extras))


def mark_cut(traj: envs.Trajectory) -> envs.Trajectory:
  """Records the end of an unroll as a time-limit truncation: LAST, discount 1.

  A step that already is a termination (LAST, discount 0) stays one.
  """
  last_is_termination = (traj.step_type[-1] == envs.LAST) & (traj.discount[-1] == 0)
  return traj._replace(
      step_type=traj.step_type.at[-1].set(envs.LAST),
      discount=traj.discount.at[-1].set(jnp.where(last_is_termination, 0.0, 1.0)))


class _Envs:
  """The training and evaluation pools of one segment, and the rollout over them."""

  def __init__(self, agent: Agent, config: LoopConfig, segment: int):
    seed = segment_seed(config.seed, segment)
    self.env = make_env(config, config.num_envs, seed)
    self.eval_env = (make_env(config, config.eval_episodes,
                              segment_seed(config.seed + 7, segment), train=False)
                     if config.eval_every else None)
    self.rollout = envs.make_rollout(self.env, agent.act, config.unroll_length)
    key = jax.random.fold_in(jax.random.PRNGKey(config.seed), segment)
    self.rollout_state = self.rollout.init(key)

  def close(self) -> None:
    self.env.close()
    if self.eval_env is not None:
      self.eval_env.close()


def _fresh_counters(config: LoopConfig) -> dict:
  return {"env_steps": 0, "segment": 0, "log_lines": 0, "wall_time_s": 0.0,
          "next_log": config.log_every,
          "next_eval": config.eval_every if config.eval_every else None,
          "next_checkpoint": config.checkpoint_every if config.checkpoint_every else None,
          "returns": [], "lengths": [], "metric_sums": {}, "metric_count": 0,
          "last_eval": None, "reached": False}


def train(agent_factory: Callable[[Any], Agent], config: LoopConfig, logger: RunLogger,
          *, batch_fn: Optional[Callable] = None, checkpointer: Any = None,
          resume: bool = False, should_stop: Callable[[], bool] = lambda: False) -> RunResult:
  """Runs the loop. `agent_factory(spec) -> Agent` is called once the env exists.

  Args:
    agent_factory: builds the agent from the environment spec.
    config: the loop settings.
    logger: where metrics lines go.
    batch_fn: `batch_fn(batch, key) -> batch` applied to each sampled replay
      batch before the update (e.g. SQIL mixes in demonstrations).
    checkpointer: a `Checkpointer` (None: no checkpoints).
    resume: continue from the newest readable checkpoint.
    should_stop: polled each iteration (signal handlers); when it returns True a
      checkpoint is saved and the loop returns with `interrupted=True`.
  """
  config.validate()
  probe = make_env(config, 1, config.seed)
  spec = probe.spec._replace(num_envs=config.num_envs, batch_size=config.num_envs)
  probe.close()
  agent = agent_factory(spec)
  replay = make_replay(config) if agent.off_policy else None

  agent_key, replay_key = jax.random.split(jax.random.PRNGKey(config.seed))
  state = agent.init(agent_key)
  example = example_trajectory(agent, state.params, config)
  replay_state = replay.init(example) if replay else None
  counters = _fresh_counters(config)
  wall_offset = 0.0
  if resume:
    if checkpointer is None:
      raise ValueError("resume needs checkpoints (checkpoint_every > 0)")
    restored = checkpointer.restore_latest(
        {"agent": state, "replay": replay_state, "replay_key": replay_key})
    if restored is None:  # killed before its first checkpoint: start over
      warnings.warn(f"no readable checkpoint in {checkpointer.directory}: the run starts "
                    "again from the beginning", RuntimeWarning)
      logger.truncate(0)
    else:
      _, arrays, record = restored
      state = jax.tree.map(jnp.asarray, arrays["agent"])
      replay_state = (jax.tree.map(jnp.asarray, arrays["replay"])
                      if replay_state is not None else None)
      replay_key = jnp.asarray(arrays["replay_key"])
      counters = record["counters"]
      logger.truncate(counters["log_lines"])
      wall_offset = counters["wall_time_s"] - seconds_since_launch()

  train_iter, warmup = _make_train_iter(agent, replay, config, batch_fn)
  greedy = jax.jit(agent.greedy_act)
  # Compile the learner (and the greedy policy) on dummy inputs in a background
  # thread while the first unrolls run: the functions are pure, so the warm-up
  # results are simply dropped. Joined before the first update.
  warm = _Background(warmup, state, replay_state, example, greedy)
  pools = _Envs(agent, config, counters["segment"])
  steps_per_iter = config.unroll_length * config.num_envs
  c = counters
  last_log_time, last_log_steps = seconds_since_launch(), c["env_steps"]
  interrupted = False

  def save(env_steps: int) -> None:
    if checkpointer is not None:
      c["wall_time_s"] = wall_offset + seconds_since_launch()
      checkpointer.save(env_steps, {"agent": state, "replay": replay_state,
                                    "replay_key": replay_key}, {"counters": c})

  try:
    while c["env_steps"] < config.total_env_steps and not c["reached"]:
      if should_stop():
        c["segment"] += 1
        save(c["env_steps"])
        interrupted = True
        break
      pools.rollout_state, traj, stats = pools.rollout.unroll(state.params, pools.rollout_state)
      c["env_steps"] += steps_per_iter
      env_steps = c["env_steps"]
      cut = ((c["next_checkpoint"] is not None and env_steps >= c["next_checkpoint"])
             or env_steps >= config.total_env_steps)
      if cut:
        traj = mark_cut(traj)
      c["returns"].extend(stats.episode_return.tolist())
      c["lengths"].extend(stats.episode_length.tolist())
      warm.join()
      if agent.off_policy:
        replay_key, sub = jax.random.split(replay_key)
        state, replay_state, metrics = train_iter(state, replay_state, traj, sub)
      else:
        state, metrics = train_iter(state, traj)
      if metrics is not None:
        host = jax.device_get(metrics)
        for name, value in host.items():
          if not np.all(np.isfinite(value)):
            raise NonFiniteError(
                f"non-finite {name} = {value} at env step {env_steps} (update "
                f"{int(state.num_updates)}); stopping. The last good checkpoint is kept"
                + (f" in {checkpointer.directory}" if checkpointer is not None else "") + ".")
          c["metric_sums"][name] = c["metric_sums"].get(name, 0.0) + float(value)
        c["metric_count"] += 1

      logged = False
      eval_now = c["next_eval"] is not None and env_steps >= c["next_eval"]
      if env_steps >= c["next_log"] or eval_now:
        record = _flush(c, env_steps, wall_offset, last_log_time, last_log_steps,
                        int(state.num_updates))
        if eval_now:
          eval_returns = evaluate(pools.eval_env, greedy, state.params, config.eval_episodes)
          c["last_eval"] = float(np.mean(eval_returns))
          record["eval_return"] = c["last_eval"]
          record["eval_return_min"] = float(np.min(eval_returns))
          c["reached"] = (config.target_return is not None
                          and c["last_eval"] >= config.target_return)
          while c["next_eval"] <= env_steps:
            c["next_eval"] += config.eval_every
        logger.log(record)
        c["log_lines"] += 1
        logged = True
        while c["next_log"] <= env_steps:
          c["next_log"] += config.log_every
        last_log_time, last_log_steps = seconds_since_launch(), env_steps

      end = env_steps >= config.total_env_steps or c["reached"]
      if cut or end:
        c["segment"] += 1
        if c["next_checkpoint"] is not None:
          while c["next_checkpoint"] <= env_steps:
            c["next_checkpoint"] += config.checkpoint_every
        save(env_steps)
        if not end:
          pools.close()
          pools = _Envs(agent, config, c["segment"])
      if end and not logged and (c["returns"] or c["metric_count"]):
        # A final line for the partial interval; a resumed run drops it (it is
        # after the checkpoint's log_lines) and logs the interval in full.
        record = _flush(c, env_steps, wall_offset, last_log_time, last_log_steps,
                        int(state.num_updates))
        record["final"] = True
        logger.log(record)
  finally:
    pools.close()
  return RunResult(env_steps=c["env_steps"], num_updates=int(state.num_updates),
                   wall_time_s=wall_offset + seconds_since_launch(),
                   reached_target=bool(c["reached"]), last_eval_return=c["last_eval"],
                   interrupted=interrupted, agent_state=state)


def _flush(c: dict, env_steps: int, wall_offset: float, last_time: float,
           last_steps: int, num_updates: int) -> dict:
  """A metrics line from the accumulators, which it then empties."""
  now = seconds_since_launch()
  record = {"env_steps": env_steps, "wall_time_s": wall_offset + now,
            "episode_return": float(np.mean(c["returns"])) if c["returns"] else None,
            "episode_length": float(np.mean(c["lengths"])) if c["lengths"] else None,
            "episodes": len(c["returns"]), "num_updates": num_updates,
            "env_steps_per_s": (env_steps - last_steps) / max(now - last_time, 1e-9)}
  if c["metric_count"]:
    record.update({k: v / c["metric_count"] for k, v in c["metric_sums"].items()})
  c["returns"], c["lengths"], c["metric_sums"], c["metric_count"] = [], [], {}, 0
  return record


class _Background:
  """Runs fn(*args) in a daemon thread; `join` waits (errors surface in the real call)."""

  def __init__(self, fn, *args):
    self._thread = threading.Thread(target=self._run, args=(fn, args), daemon=True)
    self._thread.start()

  @staticmethod
  def _run(fn, args):
    try:
      fn(*args)
    except Exception:  # pylint: disable=broad-except
      pass  # the same call on real data raises the error where it can be handled

  def join(self) -> None:
    self._thread.join()


def _make_train_iter(agent: Agent, replay, config: LoopConfig, batch_fn):
  """(train_iter, warmup): one training iteration, and its compile-only warm-up."""
  def warm_greedy(state, greedy, traj):
    jax.block_until_ready(greedy(state.params, traj.observation[0]))

  if not agent.off_policy:
    def warmup_on_policy(state, replay_state, traj, greedy):
      jax.block_until_ready(agent.update(state, traj))
      warm_greedy(state, greedy, traj)
    return agent.update, warmup_on_policy

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
        num_batches = jax.tree.leaves(batches)[0].shape[0]
        batches = jax.vmap(batch_fn)(batches, jax.random.split(key, num_batches))
      state, metrics = sweep(state, batches)
    else:
      state, metrics = sample_and_update(state, replay_state, key)
    if fresh_metrics is not None:  # average the fresh update in with equal weight
      n = config.num_updates_per_train_iter
      metrics = jax.tree.map(lambda f, m: (f + n * m) / (n + 1), fresh_metrics, metrics)
    return state, replay_state, metrics

  def warmup(state, replay_state, traj, greedy):
    replay_state = add(replay_state, traj)
    if agent.fresh_update_first:
      jax.block_until_ready(agent.update(state, traj))
    if not config.whole_replay_buffer_training:
      jax.block_until_ready(sample_and_update(state, replay_state, jax.random.PRNGKey(0)))
    warm_greedy(state, greedy, traj)

  return train_iter, warmup
