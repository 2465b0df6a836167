"""The envpool program: N lanes (seeds, or a sweep's settings x seeds) of one learner,
each collecting from its own envpool environments.

    results = train(agent_factory, config, loggers, checkpointer=..., resume=False)

`EnvpoolProgram` is what `training/driver.py` drives for every envpool task. The learner
(`training/learner.py`) holds the lanes along a leading axis (one vmapped computation);
each lane has its own source of trajectories (`training/sources.py`: inline, actor pools
or async actors). One iteration collects an unroll per lane and learns from it: the
transformer's statistics, the replay, the fresh update and the replayed updates.

Segments. Environments cannot be snapshotted, so the run is cut into segments at the
driver's checkpoint points: at a cut the last step of the unroll is recorded as a
time-limit truncation (`mark_cut`: LAST with discount 1, so its value is still
bootstrapped and learning is not biased), and every environment is re-created with a
seed derived from (seed, segment) (`Program.open`). An uninterrupted run does exactly
the same, so a run resumed from a checkpoint repeats it exactly. Actor threads cannot be
cut exactly: their pools go on across checkpoints, and their runs resume from the last
checkpoint all the same.
"""

from __future__ import annotations

from typing import Any
from typing import Callable
from typing import Optional
from typing import Sequence
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from offpolicy_ac import envs
from offpolicy_ac.agents.base import Agent
from offpolicy_ac.agents.base import check_is_agent
from offpolicy_ac.agents.hyperparams import hyperparams_of
from offpolicy_ac.agents.hyperparams import with_hyperparams
from offpolicy_ac.training.config import TrainConfig
from offpolicy_ac.training.driver import NonFiniteError
from offpolicy_ac.training.driver import Progress
from offpolicy_ac.training.driver import RunResult
from offpolicy_ac.training.driver import Update
from offpolicy_ac.training.driver import drive
from offpolicy_ac.training.evaluation import evaluate
from offpolicy_ac.training.learner import Learner
from offpolicy_ac.training.learner import LearnerState
from offpolicy_ac.training.learner import take_lane
from offpolicy_ac.training.logger import Logger
from offpolicy_ac.training.parallel import DataParallel
from offpolicy_ac.training.sources import RolloutFactory
from offpolicy_ac.training.sources import make_env
from offpolicy_ac.training.sources import make_source
from offpolicy_ac.training.sources import make_training_rollout
from offpolicy_ac.training.sources import pool_seed
from offpolicy_ac.training.sources import task_kwargs
from offpolicy_ac.training.sources import task_spec
from offpolicy_ac.training.sweeps import lane_names
from offpolicy_ac.training.sweeps import stack_hyperparams
from offpolicy_ac.training.sweeps import sweep_lanes


def mark_cut(traj: envs.Trajectory) -> envs.Trajectory:
  """Records the end of an unroll as a time-limit truncation: LAST, discount 1.

  A step that already is a termination (LAST, discount 0) stays one. Works on device
  (JAX) and host (NumPy) trajectories.
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


_FLOAT_FIELDS = ("reward", "discount", "observation")
_all_finite = jax.jit(lambda fields: {n: jnp.isfinite(x).all() for n, x in fields.items()})


def warn_if_checkpoints_cut_episodes(config: TrainConfig) -> None:
  """Warns when the checkpoints of an exact run cut every training episode short of the
  task's time limit. Each checkpoint starts new environments (a truncation there), so with
  fewer steps per environment between checkpoints than the time limit, no training episode
  that would reach it runs whole, and the training returns logged are of cut episodes
  (evaluations are not cut). Atari is left out: its games end long before its limit."""
  every, budget = config.checkpoint.checkpoint_every, config.budget.total_env_steps
  if not every or every >= budget or config.env.atari:
    return
  iteration, unroll = config.steps_per_iteration, config.env.unroll_length
  limit = envs.time_limit(config.env.env_id, **task_kwargs(config))
  longest = -(-every // iteration) * unroll  # a cut falls on the iteration at or after it
  if longest < limit:
    warnings.warn(
        f"checkpoint_every {every:,} cuts every training episode after at most {longest:,} "
        f"steps of its environment, short of {config.env.env_id}'s time limit of {limit:,}: "
        "training episodes that would reach it never run whole, and the training returns "
        "logged are of cut episodes (evaluations are whole); with checkpoint_every "
        f"{-(-limit // unroll) * iteration:,} or more, they can",
        RuntimeWarning,
        stacklevel=2,
    )


def _host_view(x: Any) -> Optional[np.ndarray]:
  """`x` as a NumPy array when that costs no transfer (a host array, or a JAX array on the
  CPU, which NumPy reads in place); None for an accelerator's array."""
  if isinstance(x, np.ndarray):
    return x
  if all(d.platform == "cpu" for d in x.devices()):
    return np.asarray(x)
  return None


def check_finite_data(traj: envs.Trajectory, where: str) -> None:
  """Raises NonFiniteError when an unroll's rewards, discounts or (float) observations
  hold a NaN or an infinity, naming the field, the environment (env_id) and `where`: such
  data is stopped before the learner's statistics and replay take it, so no checkpoint
  holds it. Host arrays are checked on the host, an accelerator's arrays in one compiled
  call."""
  fields = {n: getattr(traj, n) for n in _FLOAT_FIELDS
            if np.issubdtype(getattr(traj, n).dtype, np.floating)}  # fmt: skip
  host = {n: _host_view(x) for n, x in fields.items()}
  on_host = {n: bool(np.isfinite(x).all()) for n, x in host.items() if x is not None}
  on_device = {n: x for n, x in fields.items() if n not in on_host}
  finite = {**on_host, **(jax.device_get(_all_finite(on_device)) if on_device else {})}
  for name, ok in finite.items():
    if ok:
      continue
    values = np.asarray(fields[name])
    t, b = np.argwhere(~np.isfinite(values.reshape(values.shape[:2] + (-1,))).all(-1))[0]
    env_id = int(np.asarray(traj.env_id)[t, b])
    raise NonFiniteError(
        f"non-finite {name} from environment {env_id} (row {t} of the unroll) of {where}; "
        "stopping before it is learned from or stored. The last checkpoint is kept."
    )


class EnvpoolProgram:
  """The lanes of an envpool run (see the module docstring); a `driver.Program`."""

  kind = "envpool"

  def __init__(self, agent_factory: Callable[[Any], Agent], config: TrainConfig, *,
               batch_fn: Optional[Callable] = None,
               rollout_factory: RolloutFactory = make_training_rollout,
               make_agent: Optional[Callable[[Any, Any], Agent]] = None):  # fmt: skip
    """Validates the config and builds the learner; nothing runs before `init`.

    Args:
      agent_factory: builds the agent from the environment spec (`envs.spec`).
      config: the run's settings; with `num_seeds` > 1 every seed is a lane of one
        vmapped learner (`config.vmap_unsupported_reason()` must be None). With `sweep`,
        one lane per (setting, seed) in `training.sweeps` order.
      batch_fn: `batch_fn(batch, key) -> batch` applied to each sampled replay batch
        before the data transformer (SQIL mixes in demonstrations). An `agents.BatchFn`
        enters the compiled update as an argument, not as a constant.
      rollout_factory: makes each training pool and its rollout (see `sources`).
      make_agent: `make_agent(spec, agent_config) -> Agent`, needed with a sweep: each
        lane's agent is rebuilt with its hyper-parameters inside the vmapped learner.
    """
    if not isinstance(config, TrainConfig):
      raise ValueError(f"config must be a TrainConfig, got {config!r}")
    config.validate()
    if config.compiled:
      raise ValueError(f"{config.env.env_id} is a JAX environment, whose run is one compiled "
                       "program: training.make_train (or run_experiment), not training.train")  # fmt: skip
    if len(config.seeds) > 1 and config.vmap_unsupported_reason() is not None:
      raise ValueError(f"seeds cannot share a vmapped learner with "
                       f"{config.vmap_unsupported_reason()}")  # fmt: skip
    if config.budget.sweep and make_agent is None:
      raise ValueError("a sweep rebuilds the agent with each lane's hyper-parameters: "
                       "pass make_agent")  # fmt: skip
    dp = DataParallel.create(config.parallel.learner_devices)
    if dp.num_processes != config.parallel.num_processes:
      raise ValueError(
          f"num_processes={config.parallel.num_processes} but this JAX job has "
          f"{dp.num_processes} process(es): call parallel.initialize_distributed first"
      )
    if config.env.rollout == "compiled":  # refused here, before anything is built
      env_id = config.env.env_id
      envs.check_compiled_task(env_id, **task_kwargs(config))
    agent = check_is_agent(agent_factory(task_spec(config)), "agent_factory(spec)")
    if agent.off_policy and config.replay.mini_batch_size % dp.num_devices:
      raise ValueError(
          f"mini_batch_size ({config.replay.mini_batch_size}) must divide evenly over the "
          f"{dp.num_devices} learner devices"
      )
    lanes = sweep_lanes(agent.config, config)  # without a sweep: the seeds
    self.seeds = [seed for _, seed in lanes]
    self.num_lanes = len(lanes)
    self.lane_names = lane_names(lanes)
    hyperparams = agent_at = None
    if config.budget.sweep:
      spec, base = agent.spec, agent.config
      agent_at = lambda hp: make_agent(spec, with_hyperparams(base, hp))  # noqa: E731
      hyperparams = stack_hyperparams(hyperparams_of(base), [setting for setting, _ in lanes])
    self.config, self.dp, self.rollout_factory = config, dp, rollout_factory
    self.learner = Learner(agent, config, dp, num_seeds=self.num_lanes, batch_fn=batch_fn,
                           hyperparams=hyperparams, agent_at=agent_at)  # fmt: skip
    self.exact = not config.uses_actor_threads
    # Actor threads promise no exact resume: their stop saves what they learned.
    self.checkpoint_at_stop = not self.exact
    self.sources, self.evals = [], []
    self._warm, self._acting, self._versions, self._replay_fill = None, None, None, 0

  # -- state and checkpoints ---------------------------------------------------

  def init(self) -> LearnerState:
    return self.learner.init(self.seeds)

  def checkpoint_arrays(self, state: LearnerState) -> dict:
    return {"learner": self.dp.local(state)}

  def from_checkpoint(self, state: LearnerState, arrays: dict) -> LearnerState:
    del state
    return self.dp.replicate(LearnerState(*jax.tree.map(jnp.asarray, arrays["learner"])))

  def agree_on_restore(self, env_steps: int) -> None:
    steps = self.dp.gather_processes(np.array(env_steps, np.int64))
    if (steps != env_steps).any():
      raise RuntimeError(f"the processes restored different checkpoints (env steps "
                         f"{steps.tolist()}); resume each from the same step")  # fmt: skip

  def num_updates(self, state: LearnerState) -> np.ndarray:
    return self.learner.num_updates(state)

  def final(self, state: LearnerState, lane: int) -> tuple[Any, Any]:
    local = self.dp.local(state)
    return take_lane(local.agent, lane), take_lane(local.transform, lane)

  # -- environments ------------------------------------------------------------

  def open(self, state: LearnerState, segment: int) -> None:
    if self._warm is None:  # the run's first segment (fresh or resumed)
      if self.exact:  # once the run's settings are checked: a refused resume warns nothing
        warn_if_checkpoints_cut_episodes(self.config)
      self._start(state)
    elif not self.exact:
      return  # actor threads go on across checkpoints
    self._close_environments()
    config, learner, process = self.config, self.learner, self.dp.process_index
    try:
      for seed, acting in zip(self.seeds, self._acting):
        self.sources.append(make_source(
            learner.act, config, seed=seed, segment=segment, process=process, acting=acting,
            version=int(self._versions[0]), rollout_factory=self.rollout_factory,
            to_device=self.num_lanes == 1 and learner.dp.trivial,
        ))  # fmt: skip
        if config.eval_interval:
          eval_seed = pool_seed(seed, "evaluation", segment=segment, process=process)
          self.evals.append(make_env(config, config.eval.eval_episodes, eval_seed, train=False))
    except Exception:
      self.close()
      raise

  def _start(self, state: LearnerState) -> None:
    """What the loop carries between iterations, from the (fresh or restored) state, and
    the warm-up compilation of the iteration in the background."""
    learner, config = self.learner, self.config
    replay = state.replay
    self._replay_fill = 0 if replay is None else int(np.ravel(self.dp.local(replay.size))[0])
    self._acting, self._versions = learner.acting(state), learner.num_updates(state)
    # A round of several pools is their concatenation along the batch axis.
    pools = config.acting.num_actors if config.acting.actors == "pools" else 1
    example = jax.device_get(learner.example(self._acting[0], pools * config.env.num_envs))
    self._warm = learner.warm_up(state, learner.batch([example] * self.num_lanes), self._acting[0])

  def _close_environments(self) -> None:
    for source in self.sources:
      source.close()
    for env in self.evals:
      env.close()
    self.sources, self.evals = [], []

  def close(self) -> None:
    """The environments. A warm-up compilation still running (a run stopped before its
    first update) is left to finish: the interpreter's exit waits for it."""
    self._close_environments()

  # -- training ----------------------------------------------------------------

  def advance(self, state: LearnerState, env_steps: int, until: int, cut_at: int,
              should_stop: Callable[[], bool]) -> tuple[LearnerState, Progress]:  # fmt: skip
    learner, config = self.learner, self.config
    episodes = [[0, 0.0, 0.0] for _ in self.seeds]
    discarded, lags = [0] * self.num_lanes, [[] for _ in self.seeds]
    updates, taken, stopped = [], 0, False
    while True:
      stop = should_stop()
      # This process's share of the steps left to `until`: async actors that drop every
      # trajectory stop collecting there (`Collected.short`) rather than run past it.
      budget = max(1, -(-(until - env_steps - taken) // self.dp.num_processes))
      got = [] if stop else [s.collect(a, int(self._versions[0]), should_stop, budget)
                             for s, a in zip(self.sources, self._acting)]  # fmt: skip
      stop = stop or any(g.traj is None and not g.short for g in got)
      short = any(g.short for g in got)
      new_steps, stop, short = self._agree(got[0].env_steps if got else 0, stop, short)
      # Steps taken are counted even when a stop request leaves them unlearned.
      taken += new_steps
      now = env_steps + taken
      for k, g in enumerate(got):
        for stats in g.stats:
          episodes[k][0] += len(stats.episode_return)
          episodes[k][1] += float(np.sum(stats.episode_return, dtype=np.float64))
          episodes[k][2] += float(np.sum(stats.episode_length, dtype=np.float64))
        discarded[k] += g.discarded
      if stop:
        stopped = True
        break
      if short:  # no update: a process's trajectories were all dropped up to the point
        for k, g in enumerate(got):
          discarded[k] += g.traj is not None  # got while another process's were dropped
        if now >= until:
          break
        continue
      cut = self.exact and now >= cut_at
      trajs = [mark_cut(g.traj) if cut else g.traj for g in got]
      for k, traj in enumerate(trajs):
        check_finite_data(traj, f"{config.env.env_id}{self.lane_names[k]} at env step {now}")
      for k, g in enumerate(got):
        if g.policy_lag is not None:
          lags[k].append(g.policy_lag)
      batch = learner.batch(trajs)
      # (The processes of a job stop together, where they agree: each waits for its own.)
      alone = self.dp.num_processes == 1
      if not learner.finished(self._warm, should_stop if alone else lambda: False):
        stopped = True
        break
      learner.check_warm_up()
      state, fresh, key = learner.ingest(state, batch)
      replayed = None
      if state.replay is not None:
        self._replay_fill = min(self._replay_fill + Learner.columns(batch, self.num_lanes),
                                config.replay.replay_capacity)  # fmt: skip
        if self._replay_fill >= config.replay.min_replay_size:
          state, replayed = learner.sample_and_update(state, key)
      self._acting, self._versions = learner.acting(state), learner.num_updates(state)
      if fresh is not None or replayed is not None:
        # Read back, then mixed on the host: eager arithmetic on arrays that span a
        # multi-process job's devices is a computation every process must run in step
        # (ACER's fresh and replayed metrics deadlocked a job of two processes).
        fresh, replayed = jax.device_get(self.dp.local((fresh, replayed)))  # one read-back
        host = learner.mix(fresh, replayed)
        per_lane = [{name: np.asarray(v)[k] for name, v in host.items()}
                    for k in range(self.num_lanes)]  # fmt: skip
        updates.append(Update(now, self._versions.tolist(), per_lane))
      if now >= until:
        break
    return state, Progress(taken, stopped, [tuple(e) for e in episodes], updates, discarded, lags)

  def _agree(self, local_steps: int, stop: bool, short: bool) -> tuple[int, bool, bool]:
    """Env steps of every process together, whether any process must stop, and whether
    any has no trajectory to learn from (`Collected.short`)."""
    if self.dp.num_processes == 1:
      return local_steps, stop, short
    every = self.dp.gather_processes(np.array([local_steps, int(stop), int(short)], np.int64))
    return int(every[:, 0].sum()), bool(every[:, 1].any()), bool(every[:, 2].any())

  def evaluate(self, state: LearnerState,
               should_stop: Callable[[], bool]) -> list[tuple[float, float]]:  # fmt: skip
    """Each lane's greedy policy on its evaluation pool (over every process's pools);
    `EvaluationStopped` on a stop request during it (one process: several evaluate
    together, their returns gathered, so they do not stop alone)."""
    del state  # the acting parameters are the state's, split off after its last update
    stop = should_stop if self.dp.num_processes == 1 else None
    out = []
    for env, acting in zip(self.evals, self._acting):
      returns = evaluate(env, self.learner.greedy, acting, self.config.eval.eval_episodes,
                         should_stop=stop)  # fmt: skip
      stats = np.array([np.mean(returns), np.min(returns)], np.float64)
      both = self.dp.gather_processes(stats)
      out.append((float(np.mean(both[:, 0])), float(np.min(both[:, 1]))))
    return out


def train(agent_factory: Callable[[Any], Agent], config: TrainConfig,
          loggers: Sequence[Logger], *, batch_fn: Optional[Callable] = None,
          checkpointer: Any = None, resume: bool = False,
          should_stop: Callable[[], bool] = lambda: False,
          rollout_factory: RolloutFactory = make_training_rollout,
          make_agent: Optional[Callable[[Any, Any], Agent]] = None) -> list[RunResult]:  # fmt: skip
  """Trains an envpool run's lanes (`EnvpoolProgram`, whose arguments these are) with the
  driver (`training.driver.drive`: one logger per lane, `checkpointer`, `resume`,
  `should_stop`); returns one RunResult per lane."""
  program = EnvpoolProgram(agent_factory, config, batch_fn=batch_fn,
                           rollout_factory=rollout_factory, make_agent=make_agent)  # fmt: skip
  outcome = drive(program, config, loggers, checkpointer=checkpointer, resume=resume,
                  should_stop=should_stop)  # fmt: skip
  return outcome.results
