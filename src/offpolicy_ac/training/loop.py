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
import time
from typing import Any
from typing import Callable
from typing import NamedTuple
from typing import Optional
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from offpolicy_ac import envs
from offpolicy_ac import replay as replay_lib
from offpolicy_ac.agents.base import Agent
from offpolicy_ac.training.actors import Actors
from offpolicy_ac.training.clock import seconds_since_launch
from offpolicy_ac.training.evaluation import evaluate
from offpolicy_ac.training.logger import RunLogger
from offpolicy_ac.training.parallel import DataParallel

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
  xla_rollout: bool = False
  """Step the training environments in one compiled loop per unroll (envpool's XLA
  interface, envs.make_xla_rollout) instead of the host loop: no Python per step, and an
  actor thread holds the GIL only between unrolls. Needs int32/float32 actions (not the
  MuJoCo tasks' float64); the policy runs on the CPU."""
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
  directory <run-dir>/seed<k> and logs; plus a plot of all. The learners are one
  vmapped computation (training/multi_seed.py) unless vmap_seeds is off or the
  config needs actor threads, several learner devices/processes or whole-buffer
  training; then the seeds run one after the other."""
  vmap_seeds: bool = True
  """With num_seeds > 1: vmap the seeds' learners in one process (see num_seeds)."""
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
  async_actors: int = 0
  """Asynchronous actor-learner with K actor threads, each stepping its own pool of
  num_envs environments with the newest parameters it has; the learner updates on each
  trajectory as it arrives (0: the synchronous loop)."""
  max_policy_lag: Optional[int] = None
  """Async: drop trajectories from parameters more than L updates old (counted as
  dropped_trajectories in the metrics). None: use every trajectory."""
  actor_queue_size: int = 0
  """Async / several pools: trajectories waiting for the learner before actors block
  (back-pressure). 0: one per actor."""
  actor_pools: int = 1
  """Synchronous mode: pools of num_envs environments stepped in parallel threads, all
  with the same parameters; an iteration updates on the trajectories of the pools that
  reported (see min_pools)."""
  min_pools: int = 0
  """Synchronous mode with several pools (MARO's slow-worker tolerance): go on once this
  many pools reported, waiting at most grace_period_s for the others; a late trajectory
  (older parameters) is dropped and counted. 0: wait for every pool."""
  grace_period_s: float = 0.5
  """Synchronous mode: how long to wait for the remaining pools once min_pools reported."""
  learner_devices: int = 1
  """Local devices the learner splits each batch over (data parallel, gradients
  all-reduced). On CPU the scripts create that many host devices."""
  num_processes: int = 1
  """Processes of a multi-host job (jax.distributed); each runs its own actors and a
  learner shard, and learners all-reduce gradients every update."""
  process_id: int = 0
  """This process's index in [0, num_processes)."""
  coordinator_address: Optional[str] = None
  """HOST:PORT of process 0 (multi-host only)."""

  def validate(self) -> None:
    for name in (
        "total_env_steps",
        "num_envs",
        "unroll_length",
        "log_every",
        "eval_episodes",
        "replay_capacity",
        "num_updates_per_train_iter",
        "mini_batch_size",
        "mini_batch_length",
        "keep_checkpoints",
        "num_seeds",
    ):
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
      raise ValueError(
          f"min_replay_size ({self.min_replay_size}) exceeds "
          f"replay_capacity ({self.replay_capacity})"
      )
    for name in ("async_actors", "actor_queue_size", "min_pools"):
      value = getattr(self, name)
      if not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an int >= 0, got {value!r}")
    for name in ("actor_pools", "learner_devices"):
      value = getattr(self, name)
      if not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    if self.async_actors and self.actor_pools > 1:
      raise ValueError(
          "choose one: async_actors (asynchronous) or actor_pools > 1 "
          "(synchronous with several pools)"
      )
    if self.min_pools > self.actor_pools:
      raise ValueError(f"min_pools ({self.min_pools}) exceeds actor_pools " f"({self.actor_pools})")
    if not self.grace_period_s >= 0:
      raise ValueError(f"grace_period_s must be >= 0, got {self.grace_period_s}")
    if self.max_policy_lag is not None:
      if not self.async_actors:
        raise ValueError(
            "max_policy_lag applies to the asynchronous mode: set " "async_actors >= 1"
        )
      if not isinstance(self.max_policy_lag, int) or self.max_policy_lag < 0:
        raise ValueError(f"max_policy_lag must be an int >= 0, got {self.max_policy_lag!r}")
    if self.num_envs % self.learner_devices:
      raise ValueError(
          f"num_envs ({self.num_envs}) must divide evenly over "
          f"learner_devices ({self.learner_devices})"
      )
    from offpolicy_ac.training.parallel import check_distributed_args

    check_distributed_args(self.num_processes, self.process_id, self.coordinator_address)
    if self.num_processes > 1 and self.min_pools and self.min_pools < self.actor_pools:
      raise ValueError(
          "min_pools < actor_pools gives batches of varying size, which "
          "processes of a multi-host job cannot agree on; use all pools"
      )

  @property
  def uses_actor_threads(self) -> bool:
    return bool(self.async_actors) or self.actor_pools > 1


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
  return {} if config.max_episode_steps is None else {"max_episode_steps": config.max_episode_steps}


def make_env(config: LoopConfig, num_envs: int, seed: int, *, train: bool = True):
  """A training (or evaluation) pool for the config's task."""
  if config.atari:
    return envs.make_atari(config.env_id, num_envs, seed, train=train, **env_kwargs(config))
  return envs.make(config.env_id, num_envs, seed, **env_kwargs(config))


def make_training_rollout(
    agent: Agent, config: LoopConfig, seed: int, params: Any, *, to_device: bool
) -> Any:
  """A pool of `config.num_envs` training environments seeded `seed` and the config's
  rollout over it (`envs.make_rollout`; the pool is `.env`), its `init(key)` bound to
  `params`. The pool is closed again if the rollout cannot be made (e.g. the compiled loop
  refuses the task)."""
  env = make_env(config, config.num_envs, seed)
  backend = "compiled" if config.xla_rollout else "host"
  try:
    rollout = envs.make_rollout(
        env, agent.act, config.unroll_length, backend=backend, to_device=to_device
    )
  except Exception:
    env.close()
    raise
  return rollout._replace(init=lambda key: rollout.init(params, key))


def segment_seed(seed: int, segment: int) -> int:
  """Environment seed of a segment (segment 0 uses `seed` itself)."""
  return (seed + 1_000_003 * segment) % (2**31 - 1)


def make_replay(config: LoopConfig) -> replay_lib.SequenceReplay:
  return replay_lib.make_sequence_replay(
      capacity=config.replay_capacity,
      sequence_length=config.unroll_length + 1,
      sample_length=config.mini_batch_length + 1,
      batch_size=config.mini_batch_size,
  )


def example_trajectory(agent: Agent, params: Any, config: LoopConfig) -> envs.Trajectory:
  """Zeros shaped like the rollout's trajectories [T+1, num_envs, ...]."""
  spec = agent.spec
  lead = (config.unroll_length + 1, config.num_envs)
  obs = jax.ShapeDtypeStruct(
      (config.num_envs,) + tuple(spec.observation_shape), jnp.dtype(spec.observation_dtype)
  )
  action, extras = jax.eval_shape(agent.act, params, obs, jax.random.PRNGKey(0))
  zeros = lambda s: jnp.zeros(lead + tuple(s.shape[1:]), s.dtype)
  return envs.Trajectory(
      step_type=jnp.zeros(lead, jnp.int32),
      reward=jnp.zeros(lead, jnp.float32),
      discount=jnp.zeros(lead, jnp.float32),
      observation=jnp.zeros(lead + tuple(spec.observation_shape), obs.dtype),
      env_id=jnp.zeros(lead, jnp.int32),
      action=zeros(action),
      extras=jax.tree.map(zeros, extras),
  )


def mark_cut(traj: envs.Trajectory) -> envs.Trajectory:
  """Records the end of an unroll as a time-limit truncation: LAST, discount 1.

  A step that already is a termination (LAST, discount 0) stays one. Works on
  device (JAX) and host (NumPy) trajectories.
  """
  last_is_termination = (traj.step_type[-1] == envs.LAST) & (traj.discount[-1] == 0)
  if isinstance(traj.step_type, np.ndarray):
    step_type, discount = traj.step_type.copy(), traj.discount.copy()
    step_type[-1] = envs.LAST
    discount[-1] = np.where(last_is_termination, 0.0, 1.0)
    return traj._replace(step_type=step_type, discount=discount)
  return traj._replace(
      step_type=traj.step_type.at[-1].set(envs.LAST),
      discount=traj.discount.at[-1].set(jnp.where(last_is_termination, 0.0, 1.0)),
  )


def process_seed(seed: int, process_index: int) -> int:
  """Environment seed of a process of a multi-host job (process 0 keeps `seed`)."""
  return (seed + 7_919 * process_index) % (2**31 - 1)


class _Collected(NamedTuple):
  """What a source hands the learner: one trajectory [T+1, B_local] (or None when
  asked to stop), the episodes finished, and the env steps it took, including those
  of discarded trajectories."""

  traj: Any
  stats: list
  env_steps: int
  discarded: int = 0
  policy_lag: float = 0.0


class _InlineSource:
  """The synchronous loop with one pool: unroll, then update, in this thread.

  `exact`: cut into segments at checkpoints (pools re-created with seeds derived from
  the segment) so a resumed run repeats the uninterrupted one exactly.
  """

  exact = True

  def __init__(
      self,
      agent: Agent,
      config: LoopConfig,
      segment: int,
      process: int,
      to_device: bool,
      params: Any,
  ):
    seed = process_seed(config.seed, process)
    self.rollout = make_training_rollout(
        agent, config, segment_seed(seed, segment), params, to_device=to_device
    )
    self.env = self.rollout.env
    key = jax.random.fold_in(jax.random.PRNGKey(seed), segment)
    self.rollout_state = self.rollout.init(key)
    self._steps = config.unroll_length * config.num_envs

  def collect(self, params: Any, version: int, should_stop: Callable) -> _Collected:
    del version, should_stop
    self.rollout_state, traj, stats = self.rollout.unroll(params, self.rollout_state)
    return _Collected(traj, [stats], self._steps)

  def close(self) -> None:
    self.env.close()


class _ActorSource:
  """Actor threads (training/actors.py) feeding the learner.

  Asynchronous (`config.async_actors` = K): the learner takes each trajectory as
  it arrives, dropping those more than `max_policy_lag` updates old.
  Synchronous with several pools (`config.actor_pools` = K): every pool unrolls
  once per iteration with that iteration's parameters; the learner waits for
  `min_pools` of them, then at most `grace_period_s` for the rest, and updates on
  their concatenation (batch axis); trajectories of earlier iterations arriving
  late are dropped.
  """

  exact = False

  def __init__(
      self, agent: Agent, config: LoopConfig, segment: int, process: int, params: Any, version: int
  ):
    self.config = config
    self.asynchronous = bool(config.async_actors)
    k = config.async_actors or config.actor_pools
    self.num_actors = k
    self.min_pools = config.min_pools or k
    self._steps = config.unroll_length * config.num_envs
    rollouts, keys = [], []
    base = process_seed(config.seed, process)
    try:
      for i in range(k):
        seed = segment_seed(base + 104_729 * (i + 1), segment)
        rollouts.append(make_training_rollout(agent, config, seed, params, to_device=False))
        keys.append(jax.random.fold_in(jax.random.PRNGKey(seed), segment))
    except Exception:
      for r in rollouts:
        r.env.close()
      raise
    # Synchronous mode tags trajectories with a round (one per `collect`), not the
    # update count: an iteration that makes no update (off-policy before
    # min_replay_size) must still let the gated actors unroll again.
    self._published = version if self.asynchronous else 0
    self._round = None
    self.actors = Actors(
        rollouts,
        keys,
        params,
        version=self._published,
        queue_size=config.actor_queue_size or k,
        gated=not self.asynchronous,
    )

  def collect(self, params: Any, version: int, should_stop: Callable) -> _Collected:
    if self.asynchronous:
      if version != self._published:
        self.actors.publish(params, version)
        self._published = version
      return self._collect_async(version, should_stop)
    if self._round is None:  # the actors already unroll the initial parameters
      self._round = self._published
    else:
      self._round += 1
      self.actors.publish(params, self._round)
    return self._collect_sync(self._round, should_stop)

  def _collect_async(self, version: int, should_stop: Callable) -> _Collected:
    stats, steps, dropped = [], 0, 0
    lag_limit = self.config.max_policy_lag
    while True:
      item = self.actors.get(timeout=0.05)
      if item is None:
        if should_stop():
          return _Collected(None, stats, steps, dropped)
        continue
      stats.append(item.stats)
      steps += self._steps
      lag = version - item.version
      if lag_limit is not None and lag > lag_limit:
        dropped += 1
        continue
      return _Collected(item.traj, stats, steps, dropped, float(lag))

  def _collect_sync(self, version: int, should_stop: Callable) -> _Collected:
    stats, steps, late, fresh = [], 0, 0, []
    deadline = None
    while len(fresh) < self.num_actors:
      wait = 0.05 if deadline is None else min(0.05, max(deadline - time.monotonic(), 0.0))
      item = self.actors.get(timeout=wait)
      if item is None:
        if should_stop():
          return _Collected(None, stats, steps, late)
        if deadline is not None and time.monotonic() >= deadline:
          break
        continue
      stats.append(item.stats)
      steps += self._steps
      if item.version != version:
        late += 1
        continue
      fresh.append(item)
      if deadline is None and len(fresh) >= self.min_pools:
        deadline = time.monotonic() + self.config.grace_period_s
    fresh.sort(key=lambda it: it.actor_id)
    traj = jax.tree.map(lambda *xs: np.concatenate(xs, axis=1), *[it.traj for it in fresh])
    return _Collected(traj, stats, steps, late)

  def close(self) -> None:
    self.actors.close()


class Restored(NamedTuple):
  """The training state of a checkpoint (host arrays as JAX arrays) and its record."""

  step: int
  state: Any
  replay_state: Any
  replay_key: jax.Array
  record: dict


def restore_training_state(
    checkpointer: Any, state: Any, replay_state: Any, replay_key: jax.Array
) -> Optional[Restored]:
  """The newest readable checkpoint, shaped like the given (template) state, or
  None, with a warning, when there is none (the run starts over)."""
  if checkpointer is None:
    raise ValueError("resume needs checkpoints (checkpoint_every > 0)")
  restored = checkpointer.restore_latest(
      {"agent": state, "replay": replay_state, "replay_key": replay_key}
  )
  if restored is None:
    warnings.warn(
        f"no readable checkpoint in {checkpointer.directory}: the run starts "
        "again from the beginning",
        RuntimeWarning,
    )
    return None
  step, arrays, record = restored
  return Restored(
      step,
      jax.tree.map(jnp.asarray, arrays["agent"]),
      (jax.tree.map(jnp.asarray, arrays["replay"]) if replay_state is not None else None),
      jnp.asarray(arrays["replay_key"]),
      record,
  )


def next_point(point: int, every: int, env_steps: int) -> int:
  """A schedule point (log, eval, checkpoint) moved past `env_steps` in `every` steps."""
  while point <= env_steps:
    point += every
  return point


def _fresh_counters(config: LoopConfig) -> dict:
  return {
      "env_steps": 0,
      "segment": 0,
      "log_lines": 0,
      "wall_time_s": 0.0,
      "next_log": config.log_every,
      "next_eval": config.eval_every if config.eval_every else None,
      "next_checkpoint": config.checkpoint_every if config.checkpoint_every else None,
      "returns": [],
      "lengths": [],
      "metric_sums": {},
      "metric_count": 0,
      "last_eval": None,
      "reached": False,
      "discarded": 0,
      "lag_sum": 0.0,
      "lag_count": 0,
  }


def train(
    agent_factory: Callable[[Any], Agent],
    config: LoopConfig,
    logger: RunLogger,
    *,
    batch_fn: Optional[Callable] = None,
    checkpointer: Any = None,
    resume: bool = False,
    should_stop: Callable[[], bool] = lambda: False,
) -> RunResult:
  """Runs the loop. `agent_factory(spec) -> Agent` is called once the env exists.

  Workflows (see LoopConfig): the synchronous loop (one pool, unroll then
  update), synchronous with several pools in actor threads, or asynchronous
  actors; the learner on `learner_devices` devices of each of `num_processes`
  processes (the caller joins the `jax.distributed` job first, see
  `parallel.initialize_distributed`).

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
  dp = DataParallel.create(config.learner_devices)
  if dp.num_processes != config.num_processes:
    raise ValueError(
        f"num_processes={config.num_processes} but this JAX job has "
        f"{dp.num_processes} process(es): call "
        "parallel.initialize_distributed first"
    )
  process = dp.process_index
  probe = make_env(config, 1, config.seed)
  spec = probe.spec._replace(num_envs=config.num_envs, batch_size=config.num_envs)
  probe.close()
  agent = agent_factory(spec)
  replay = make_replay(config) if agent.off_policy else None
  if agent.off_policy and config.mini_batch_size % dp.num_devices:
    raise ValueError(
        f"mini_batch_size ({config.mini_batch_size}) must divide evenly over "
        f"the {dp.num_devices} learner devices"
    )

  agent_key, replay_key = jax.random.split(jax.random.PRNGKey(config.seed))
  state = jax.jit(agent.init)(agent_key)  # one compiled program, not op-by-op
  example = example_trajectory(agent, state.params, config)
  replay_state = replay.init(example) if replay else None
  counters = _fresh_counters(config)
  wall_offset = 0.0
  if resume:
    restored = restore_training_state(checkpointer, state, replay_state, replay_key)
    step = -1 if restored is None else restored.step
    steps = dp.gather_processes(np.array(step, np.int64))
    if (steps != step).any():
      raise RuntimeError(
          f"the processes restored different checkpoints (env steps "
          f"{steps.tolist()}); resume each from the same step"
      )
    if restored is None:  # killed before its first checkpoint: start over
      logger.truncate(0)
    else:
      state, replay_state, replay_key = restored.state, restored.replay_state, restored.replay_key
      counters = {**_fresh_counters(config), **restored.record["counters"]}
      logger.truncate(counters["log_lines"])
      wall_offset = counters["wall_time_s"] - seconds_since_launch()
  state, replay_state = dp.replicate(state), dp.replicate(replay_state)

  train_iter, warmup = _make_train_iter(agent, replay, config, batch_fn, dp)
  greedy = jax.jit(agent.greedy_act)
  # Compile the learner (and the greedy policy) on dummy inputs in a background
  # thread while the first unrolls run: the functions are pure, so the warm-up
  # results are simply dropped. Joined before the first update.
  # Several synchronous pools: a full round's batch is every pool's columns.
  warm_example = (
      jax.tree.map(lambda x: jnp.concatenate([x] * config.actor_pools, axis=1), example)
      if config.actor_pools > 1
      else example
  )
  warm = _Background(
      warmup,
      state,
      replay_state,
      dp.shard(jax.device_get(warm_example)),
      greedy,
      dp.local(state.params),
  )
  c = counters
  version = int(dp.local(state.num_updates))
  local_params = dp.local(state.params)

  def make_sources(segment):
    if config.uses_actor_threads:
      source = _ActorSource(agent, config, segment, process, local_params, version)
    else:
      source = _InlineSource(
          agent, config, segment, process, to_device=dp.trivial, params=local_params
      )
    eval_env = None
    if config.eval_every:
      eval_seed = segment_seed(process_seed(config.seed + 7, process), segment)
      eval_env = make_env(config, config.eval_episodes, eval_seed, train=False)
    return source, eval_env

  source, eval_env = make_sources(c["segment"])
  last_log_time, last_log_steps = seconds_since_launch(), c["env_steps"]
  interrupted = False

  def save(env_steps: int) -> None:
    if checkpointer is not None:
      c["wall_time_s"] = wall_offset + seconds_since_launch()
      checkpointer.save(
          env_steps,
          {"agent": dp.local(state), "replay": dp.local(replay_state), "replay_key": replay_key},
          {"counters": c},
      )

  def agree(local_steps: int, stop: bool) -> tuple[int, bool]:
    """Env steps of every process together, and whether any process must stop."""
    if dp.num_processes == 1:
      return local_steps, stop
    both = dp.gather_processes(np.array([local_steps, int(stop)], np.int64))
    return int(both[:, 0].sum()), bool(both[:, 1].any())

  try:
    while c["env_steps"] < config.total_env_steps and not c["reached"]:
      stop = should_stop()
      got = None if stop else source.collect(local_params, version, should_stop)
      stop = stop or got.traj is None
      new_steps, stop = agree(0 if got is None else got.env_steps, stop)
      # Steps taken are counted even when a stop request leaves them unlearned
      # (trajectories an actor source collected or dropped before the request).
      c["env_steps"] += new_steps
      if got is not None:
        for stats in got.stats:
          c["returns"].extend(stats.episode_return.tolist())
          c["lengths"].extend(stats.episode_length.tolist())
        c["discarded"] += got.discarded
      if stop:
        c["segment"] += 1
        save(c["env_steps"])
        interrupted = True
        break
      env_steps = c["env_steps"]
      end = env_steps >= config.total_env_steps
      due = c["next_checkpoint"] is not None and env_steps >= c["next_checkpoint"]
      traj = got.traj
      if source.exact and (due or end):
        traj = mark_cut(traj)
      if config.uses_actor_threads:
        c["lag_sum"] += got.policy_lag
        c["lag_count"] += 1
      batch = dp.shard(traj)
      warm.join()
      if agent.off_policy:
        replay_key, sub = jax.random.split(replay_key)
        state, replay_state, metrics = train_iter(state, replay_state, batch, sub)
      else:
        state, metrics = train_iter(state, batch)
      version = int(dp.local(state.num_updates))
      local_params = dp.local(state.params)
      if metrics is not None:
        host = jax.device_get(dp.local(metrics))
        for name, value in host.items():
          if not np.all(np.isfinite(value)):
            raise NonFiniteError(
                f"non-finite {name} = {value} at env step {env_steps} (update "
                f"{version}); stopping. The last good checkpoint is kept"
                + (f" in {checkpointer.directory}" if checkpointer is not None else "")
                + "."
            )
          c["metric_sums"][name] = c["metric_sums"].get(name, 0.0) + float(value)
        c["metric_count"] += 1

      logged = False
      eval_now = c["next_eval"] is not None and env_steps >= c["next_eval"]
      if env_steps >= c["next_log"] or eval_now:
        record = _flush(c, env_steps, wall_offset, last_log_time, last_log_steps, version)
        if eval_now:
          eval_returns = evaluate(eval_env, greedy, local_params, config.eval_episodes)
          means = dp.gather_processes(
              np.array([np.mean(eval_returns), np.min(eval_returns)], np.float64)
          )
          c["last_eval"] = float(np.mean(means[:, 0]))
          record["eval_return"] = c["last_eval"]
          record["eval_return_min"] = float(np.min(means[:, 1]))
          c["reached"] = config.target_return is not None and c["last_eval"] >= config.target_return
          c["next_eval"] = next_point(c["next_eval"], config.eval_every, env_steps)
        logger.log(record)
        c["log_lines"] += 1
        logged = True
        c["next_log"] = next_point(c["next_log"], config.log_every, env_steps)
        last_log_time, last_log_steps = seconds_since_launch(), env_steps

      end = end or c["reached"]
      if due or end:
        c["segment"] += 1
        if c["next_checkpoint"] is not None:
          c["next_checkpoint"] = next_point(
              c["next_checkpoint"], config.checkpoint_every, env_steps
          )
        save(env_steps)
        if source.exact and not end:
          source.close()
          if eval_env is not None:
            eval_env.close()
          source, eval_env = make_sources(c["segment"])
      if end and not logged and (c["returns"] or c["metric_count"]):
        # A final line for the partial interval; a resumed run drops it (it is
        # after the checkpoint's log_lines) and logs the interval in full.
        record = _flush(c, env_steps, wall_offset, last_log_time, last_log_steps, version)
        record["final"] = True
        logger.log(record)
  finally:
    source.close()
    if eval_env is not None:
      eval_env.close()
  return RunResult(
      env_steps=c["env_steps"],
      num_updates=version,
      wall_time_s=wall_offset + seconds_since_launch(),
      reached_target=bool(c["reached"]),
      last_eval_return=c["last_eval"],
      interrupted=interrupted,
      agent_state=dp.local(state),
  )


def _flush(
    c: dict, env_steps: int, wall_offset: float, last_time: float, last_steps: int, num_updates: int
) -> dict:
  """A metrics line from the accumulators, which it then empties."""
  now = seconds_since_launch()
  record = {
      "env_steps": env_steps,
      "wall_time_s": wall_offset + now,
      "episode_return": float(np.mean(c["returns"])) if c["returns"] else None,
      "episode_length": float(np.mean(c["lengths"])) if c["lengths"] else None,
      "episodes": len(c["returns"]),
      "num_updates": num_updates,
      "env_steps_per_s": (env_steps - last_steps) / max(now - last_time, 1e-9),
  }
  if c["metric_count"]:
    record.update({k: v / c["metric_count"] for k, v in c["metric_sums"].items()})
  if c["lag_count"]:  # actor threads: trajectories dropped, lag of those used
    record["dropped_trajectories"] = c["discarded"]
    record["policy_lag"] = c["lag_sum"] / c["lag_count"]
  c["returns"], c["lengths"], c["metric_sums"], c["metric_count"] = [], [], {}, 0
  c["discarded"], c["lag_sum"], c["lag_count"] = 0, 0.0, 0
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


def make_sample_and_update(
    agent: Agent, replay, num_updates: int, batch_fn, constrain: Callable = lambda batch: batch
) -> Callable:
  """`(state, replay_state, key) -> (state, mean metrics)`: `num_updates` updates, each
  on a fresh replay sample (passed through `batch_fn`, then laid out by `constrain`).
  Pure and unjitted: the single, data-parallel and vmapped learners wrap it."""

  def sample_and_update(state, replay_state, key):
    def body(state, key):
      batch_key, fn_key = jax.random.split(key)
      batch = replay.sample(replay_state, batch_key)
      if batch_fn is not None:
        batch = batch_fn(batch, fn_key)
      return agent.update(state, constrain(batch))

    state, metrics = jax.lax.scan(body, state, jax.random.split(key, num_updates))
    return state, jax.tree.map(jnp.mean, metrics)

  return sample_and_update


def _make_train_iter(agent: Agent, replay, config: LoopConfig, batch_fn, dp: DataParallel):
  """(train_iter, warmup): one training iteration, and its compile-only warm-up.

  Every jitted piece lays batches out over the learner mesh (`dp.constrain`) and
  returns replicated state, so on several devices XLA all-reduces the gradients.
  """

  def warm_greedy(greedy, local_params, traj):
    jax.block_until_ready(greedy(local_params, dp.local(traj.observation[0])))

  update = (
      agent.update
      if dp.trivial
      else dp.jit(lambda state, batch: agent.update(state, dp.constrain(batch)))
  )

  if not agent.off_policy:

    def warmup_on_policy(state, replay_state, traj, greedy, local_params):
      jax.block_until_ready(update(state, traj))
      warm_greedy(greedy, local_params, traj)

    return update, warmup_on_policy

  num_updates = config.num_updates_per_train_iter
  min_size = config.min_replay_size

  sample_and_update = dp.jit(
      make_sample_and_update(agent, replay, num_updates, batch_fn, dp.constrain)
  )

  @dp.jit
  def sweep(state, batches):
    def body(state, batch):
      return agent.update(state, dp.constrain(batch))

    state, metrics = jax.lax.scan(body, state, batches)
    return state, jax.tree.map(jnp.mean, metrics)

  add = dp.jit(replay.add)

  def train_iter(state, replay_state, traj, key):
    replay_state = add(replay_state, traj)
    fresh_metrics = None
    if agent.fresh_update_first:
      state, fresh_metrics = update(state, traj)
    size = int(dp.local(replay_state.size))
    if size < min_size or (config.whole_replay_buffer_training and size < config.mini_batch_size):
      return state, replay_state, fresh_metrics
    if config.whole_replay_buffer_training:
      epoch_key, key = jax.random.split(key)
      batches = replay.epoch(dp.local(replay_state), epoch_key)
      if batch_fn is not None:
        num_batches = jax.tree.leaves(batches)[0].shape[0]
        batches = jax.vmap(batch_fn)(batches, jax.random.split(key, num_batches))
      state, metrics = sweep(state, dp.replicate(batches))
    else:
      state, metrics = sample_and_update(state, replay_state, key)
    if fresh_metrics is not None:  # average the fresh update in with equal weight
      n = config.num_updates_per_train_iter
      metrics = jax.tree.map(lambda f, m: (f + n * m) / (n + 1), fresh_metrics, metrics)
    return state, replay_state, metrics

  def warmup(state, replay_state, traj, greedy, local_params):
    replay_state = add(replay_state, traj)
    if agent.fresh_update_first:
      jax.block_until_ready(update(state, traj))
    if not config.whole_replay_buffer_training:
      jax.block_until_ready(sample_and_update(state, replay_state, jax.random.PRNGKey(0)))
    warm_greedy(greedy, local_params, traj)

  return train_iter, warmup
