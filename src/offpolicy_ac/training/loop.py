"""The training driver: alternate collecting trajectories with a training iteration.

    results = train(agent_factory, config, loggers, checkpointer=..., resume=False)

One driver serves every workflow. The learner (`training/learner.py`) holds S seeds
along a leading axis (S = `num_seeds` when they share one vmapped learner, else 1); each
seed has its own source of trajectories (`training/sources.py`: inline, actor pools or
async actors), its own accumulators and logger, while the schedule (`records.Schedule`)
is shared. Every `log_every` env steps each seed writes a metrics line; every
`TrainConfig.eval_interval` env steps (by default about 20 times over the budget) its
greedy policy is evaluated on a separate pool (`training/evaluation.py`), and the run
stops once every seed's mean evaluation return reached `target_return`.

Checkpoints and exact resume. Environments cannot be snapshotted, so the run is cut into
*segments* at checkpoint points (every `checkpoint_every` env steps): at a cut the last
step of the unroll is recorded as a time-limit truncation (LAST with discount 1, so its
value is still bootstrapped and learning is not biased), the whole state is
checkpointed, and every environment is re-created with a seed derived from (seed,
segment). An uninterrupted run does exactly the same, so a run stopped at a checkpoint
point and resumed logs exactly what the uninterrupted run logs (every number of
metrics.jsonl but the wall-clock ones). Actor threads cannot be cut exactly; their runs
resume from the last checkpoint all the same.
"""

from __future__ import annotations

import dataclasses
from typing import Any
from typing import Callable
from typing import Optional
from typing import Sequence

import jax
import numpy as np

from offpolicy_ac.agents.base import Agent
from offpolicy_ac.agents.hyperparams import hyperparams_of
from offpolicy_ac.agents.hyperparams import with_hyperparams
from offpolicy_ac.training import records
from offpolicy_ac.training.clock import seconds_since_launch
from offpolicy_ac.training.config import TrainConfig
from offpolicy_ac.training.evaluation import evaluate
from offpolicy_ac.training.learner import Learner
from offpolicy_ac.training.learner import LearnerState
from offpolicy_ac.training.logger import RunLogger
from offpolicy_ac.training.parallel import DataParallel
from offpolicy_ac.training.resume import mark_cut
from offpolicy_ac.training.resume import restore
from offpolicy_ac.training.sources import RolloutFactory
from offpolicy_ac.training.sources import make_env
from offpolicy_ac.training.sources import make_source
from offpolicy_ac.training.sources import make_training_rollout
from offpolicy_ac.training.sources import process_seed
from offpolicy_ac.training.sources import segment_seed
from offpolicy_ac.training.sources import task_spec
from offpolicy_ac.training.sweeps import setting_label
from offpolicy_ac.training.sweeps import stack_hyperparams
from offpolicy_ac.training.sweeps import sweep_lanes

# Fields of a metrics line that depend on the wall clock (excluded from exact resume).
WALL_CLOCK_FIELDS = ("wall_time_s", "env_steps_per_s")


@dataclasses.dataclass
class RunResult:
  """The outcome of one seed's run, as `train` returns it.

  Attributes:
    env_steps: environment steps taken.
    num_updates: learner updates made.
    wall_time_s: wall-clock seconds since the training loop started, after the set-up and
      the warm-up compilation (plus those of the runs it resumed).
    reached_target: whether the evaluation return reached the config's target.
    last_eval_return: the last evaluation return, or None if the run never evaluated.
    interrupted: whether `should_stop` (SIGTERM or SIGINT in the scripts) stopped the run
      before its step budget.
    agent_state: the final agent state (parameters, optimizer state, ...).
    transform_state: the final data-transformer state (e.g. observation statistics).
  """

  env_steps: int
  num_updates: int
  wall_time_s: float
  reached_target: bool
  last_eval_return: Optional[float]
  interrupted: bool
  agent_state: Any
  transform_state: Any = None


class NonFiniteError(FloatingPointError):
  """A loss or gradient became NaN or infinite."""


class _Run:
  """The driver's per-run context: sources and evaluation pools per seed, the loggers and
  the clock, and saving."""

  def __init__(self, learner: Learner, config: TrainConfig, seeds: Sequence[int],
               process: int, rollout_factory: RolloutFactory, checkpointer: Any,
               loggers: Sequence[RunLogger]):  # fmt: skip
    self.learner, self.config, self.seeds, self.process = learner, config, seeds, process
    self.rollout_factory, self.checkpointer, self.loggers = rollout_factory, checkpointer, loggers
    self.sources, self.evals = [], []
    self.wall_offset, self.last_log = 0.0, (0.0, 0)

  def start_clock(self, schedule: records.Schedule) -> None:
    """Wall-clock time goes on from the schedule's (a resumed run's) time."""
    self.wall_offset = schedule.wall_time_s - seconds_since_launch()
    self.last_log = (seconds_since_launch(), schedule.env_steps)

  def wall_time(self) -> float:
    return self.wall_offset + seconds_since_launch()

  def log(self, accs: list, schedule: records.Schedule, versions: np.ndarray,
          acting: Optional[list], final: bool = False) -> None:  # fmt: skip
    """One metrics line per seed; with `acting`, each seed's greedy policy is evaluated
    (which decides whether it reached the target return)."""
    config, now = self.config, seconds_since_launch()
    rate = (schedule.env_steps - self.last_log[1]) / max(now - self.last_log[0], 1e-9)
    for k, (acc, logger) in enumerate(zip(accs, self.loggers)):
      line = acc.flush(schedule.env_steps, self.wall_offset + now, rate, int(versions[k]))
      if acting is not None:
        line.update(_evaluate(self.evals[k], self.learner, acting[k], config))
        acc.last_eval = line["eval_return"]
        target = config.eval.target_return
        acc.reached = target is not None and acc.last_eval >= target
      logger.log({**line, "final": True} if final else line)
    self.last_log = (seconds_since_launch(), schedule.env_steps)

  def open(self, segment: int, acting: list, version: int) -> None:
    config, learner = self.config, self.learner
    try:
      for seed, act in zip(self.seeds, acting):
        self.sources.append(make_source(
            learner.act, config, seed=seed, segment=segment, process=self.process,
            acting=act, version=version, rollout_factory=self.rollout_factory,
            to_device=len(self.seeds) == 1 and learner.dp.trivial,
        ))  # fmt: skip
        if config.eval_interval:
          eval_seed = segment_seed(process_seed(seed + 7, self.process), segment)
          self.evals.append(make_env(config, config.eval.eval_episodes, eval_seed, train=False))
    except Exception:
      self.close()
      raise

  def close(self) -> None:
    for source in self.sources:
      source.close()
    for env in self.evals:
      env.close()
    self.sources, self.evals = [], []

  def save(self, state: LearnerState, schedule: records.Schedule, accs: list) -> None:
    if self.checkpointer is not None:
      schedule.wall_time_s = self.wall_time()
      self.checkpointer.save(
          schedule.env_steps,
          {"learner": self.learner.dp.local(state)},
          records.to_record(schedule, accs),
      )


def train(agent_factory: Callable[[Any], Agent], config: TrainConfig,
          loggers: Sequence[RunLogger], *, batch_fn: Optional[Callable] = None,
          checkpointer: Any = None, resume: bool = False,
          should_stop: Callable[[], bool] = lambda: False,
          rollout_factory: RolloutFactory = make_training_rollout,
          make_agent: Optional[Callable[[Any, Any], Agent]] = None) -> list[RunResult]:  # fmt: skip
  """Trains the config's seeds with one learner; returns one RunResult per seed (per
  lane of a sweep).

  Args:
    agent_factory: builds the agent from the environment spec (`envs.spec`).
    config: the run's settings; with `num_seeds` > 1 every seed shares one vmapped
      learner (`config.vmap_unsupported_reason()` must be None). With `sweep`, one lane
      per (setting, seed) in `training.sweeps` order, each trained as the single run of
      its setting and seed would be: its own environments, keys and hyper-parameters.
    loggers: one per seed (per lane), where its metrics lines go.
    batch_fn: `batch_fn(batch, key) -> batch` applied to each sampled replay batch
      before the data transformer (SQIL mixes in demonstrations). An `agents.BatchFn`
      (as `make_sqil_batch_fn` returns) enters the compiled update as an argument, its
      data an input buffer rather than a constant compiled into the program.
    checkpointer: a `Checkpointer` (None: no checkpoints).
    resume: continue from the newest readable checkpoint.
    should_stop: polled each iteration (signal handlers); when it returns True a
      checkpoint is saved and the loop returns with `interrupted=True`.
    rollout_factory: makes each training pool and its rollout (see `sources`).
    make_agent: `make_agent(spec, agent_config) -> Agent` (`make_impala`, ...), needed
      with a sweep: each lane's agent is the agent's config with the lane's
      hyper-parameters (`agents.hyperparams.with_hyperparams`, traced arrays), built
      inside the vmapped learner.
  """
  config.validate()
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
  agent = agent_factory(task_spec(config))
  if agent.off_policy and config.replay.mini_batch_size % dp.num_devices:
    raise ValueError(
        f"mini_batch_size ({config.replay.mini_batch_size}) must divide evenly over the "
        f"{dp.num_devices} learner devices"
    )
  lanes = sweep_lanes(agent.config, config)  # without a sweep: the seeds
  seeds = [seed for _, seed in lanes]
  if len(loggers) != len(seeds):
    raise ValueError(f"need one logger per seed ({len(seeds)}), got {len(loggers)}")
  hyperparams = agent_at = None
  names = [f" for seed {s}" if len(seeds) > 1 else "" for s in seeds]
  if config.budget.sweep:
    spec, base = agent.spec, agent.config
    agent_at = lambda hp: make_agent(spec, with_hyperparams(base, hp))  # noqa: E731
    hyperparams = stack_hyperparams(hyperparams_of(base), [setting for setting, _ in lanes])
    names = [f" for {setting_label(setting)} seed {s}" for setting, s in lanes]
  learner = Learner(agent, config, dp, num_seeds=len(seeds), batch_fn=batch_fn,
                    hyperparams=hyperparams, agent_at=agent_at)  # fmt: skip
  state = learner.init(seeds)
  schedule = records.Schedule.start(
      config.budget.log_every, config.eval_interval, config.checkpoint.checkpoint_every
  )
  accs = [records.Accumulators() for _ in seeds]
  if resume:
    restored = restore(checkpointer, dp.local(state), len(seeds))
    step = -1 if restored is None else restored[1].env_steps
    steps = dp.gather_processes(np.array(step, np.int64))
    if (steps != step).any():
      raise RuntimeError(f"the processes restored different checkpoints (env steps "
                         f"{steps.tolist()}); resume each from the same step")  # fmt: skip
    if restored is None:  # killed before its first checkpoint: start over
      for logger in loggers:
        logger.truncate(0)
    else:
      state, schedule, accs = dp.replicate(restored[0]), restored[1], restored[2]
      for logger in loggers:
        logger.truncate(schedule.log_lines)
  replay_fill = 0 if state.replay is None else int(np.ravel(dp.local(state.replay.size))[0])
  acting, versions = learner.acting(state), learner.num_updates(state)
  # A round of several pools is their concatenation along the batch axis.
  pools = config.acting.num_actors if config.acting.actors == "pools" else 1
  example = jax.device_get(learner.example(acting[0], pools * config.env.num_envs))
  warm = learner.warm_up(state, learner.batch([example] * len(seeds)))
  run = _Run(learner, config, seeds, dp.process_index, rollout_factory, checkpointer, loggers)
  run.start_clock(schedule)
  run.open(schedule.segment, acting, int(versions[0]))
  interrupted, reached = False, [a.reached for a in accs]

  def agree(local_steps: int, stop: bool) -> tuple[int, bool]:
    """Env steps of every process together, and whether any process must stop."""
    if dp.num_processes == 1:
      return local_steps, stop
    both = dp.gather_processes(np.array([local_steps, int(stop)], np.int64))
    return int(both[:, 0].sum()), bool(both[:, 1].any())

  try:
    while schedule.env_steps < config.budget.total_env_steps and not all(reached):
      stop = should_stop()
      got = [] if stop else [s.collect(a, int(versions[0]), should_stop)
                             for s, a in zip(run.sources, acting)]  # fmt: skip
      stop = stop or any(g.traj is None for g in got)
      new_steps, stop = agree(got[0].env_steps if got else 0, stop)
      # Steps taken are counted even when a stop request leaves them unlearned.
      schedule.env_steps += new_steps
      for acc, g in zip(accs, got):
        for stats in g.stats:
          acc.add_episodes(stats)
        acc.discarded += g.discarded
      if stop:
        schedule.segment += 1
        run.save(state, schedule, accs)
        interrupted = True
        break
      end = schedule.env_steps >= config.budget.total_env_steps
      due = schedule.checkpoint_due()
      trajs = [mark_cut(g.traj) if run.sources[0].exact and (due or end) else g.traj for g in got]
      for acc, g in zip(accs, got):
        if g.policy_lag is not None:
          acc.add_lag(g.policy_lag)
      batch = learner.batch(trajs)
      warm.join()
      state, metrics, key = learner.ingest(state, batch)
      if state.replay is not None:
        replay_fill = min(replay_fill + Learner.columns(batch, len(seeds)),
                          config.replay.replay_capacity)  # fmt: skip
        if _can_learn(config, replay_fill):
          state, replayed = learner.sample_and_update(state, key)
          metrics = learner.mix(metrics, replayed)
      acting, versions = learner.acting(state), learner.num_updates(state)
      if metrics is not None:
        _accumulate(jax.device_get(dp.local(metrics)), accs, names, schedule, versions,
                    checkpointer)  # fmt: skip

      logged = schedule.log_due()
      if logged:
        run.log(accs, schedule, versions, acting if schedule.eval_due() else None)
        reached = [r or a.reached for r, a in zip(reached, accs)]
        schedule.logged(config.budget.log_every, config.eval_interval)
      end = end or all(reached)
      if due or end:
        schedule.cut(config.checkpoint.checkpoint_every)
        run.save(state, schedule, accs)
        if run.sources[0].exact and not end:
          run.close()
          run.open(schedule.segment, acting, int(versions[0]))
      if end and not logged and any(a.pending for a in accs):
        # A final line for the partial interval; a resumed run drops it (it is after the
        # checkpoint's log_lines) and logs the interval in full.
        run.log(accs, schedule, versions, None, final=True)
  finally:
    run.close()
  wall = run.wall_time()
  local = dp.local(state)
  return [
      RunResult(
          env_steps=schedule.env_steps, num_updates=int(versions[k]), wall_time_s=wall,
          reached_target=bool(reached[k]), last_eval_return=accs[k].last_eval,
          interrupted=interrupted, agent_state=jax.tree.map(lambda x: x[k], local.agent),
          transform_state=jax.tree.map(lambda x: x[k], local.transform),
      )  # fmt: skip
      for k in range(len(seeds))
  ]


def _can_learn(config: TrainConfig, replay_fill: int) -> bool:
  if replay_fill < config.replay.min_replay_size:
    return False
  return not (config.replay.whole_replay_buffer_training
              and replay_fill < config.replay.mini_batch_size)  # fmt: skip


def raise_if_non_finite(values: dict, context: str) -> None:
  """Raises NonFiniteError naming the first metric that is NaN or infinite; `context`
  says where (seed, env step, update) and what is kept."""
  for name, value in values.items():
    if not np.all(np.isfinite(value)):
      raise NonFiniteError(f"non-finite {name} = {value}{context}")


def _accumulate(metrics: dict, accs: list, names: Sequence[str], schedule: records.Schedule,
                versions: np.ndarray, checkpointer: Any) -> None:  # fmt: skip
  """Adds each seed's metrics [S] to its accumulators; raises on a non-finite value,
  naming the seed (lane) by `names[k]` (" for seed 3", or "" for a single run)."""
  for k, acc in enumerate(accs):
    values = {name: np.asarray(v)[k] for name, v in metrics.items()}
    where = f" in {checkpointer.directory}" if checkpointer is not None else ""
    raise_if_non_finite(values, f"{names[k]} at env step {schedule.env_steps} (update "
                        f"{int(versions[k])}); stopping. The last good checkpoint is kept{where}.")  # fmt: skip
    acc.add_metrics(values)


def _evaluate(env: Any, learner: Learner, acting: Any, config: TrainConfig) -> dict:
  """The greedy policy's mean and min return (over every process's evaluation pool)."""
  returns = evaluate(env, learner.greedy, acting, config.eval.eval_episodes)
  means = learner.dp.gather_processes(np.array([np.mean(returns), np.min(returns)], np.float64))
  return {"eval_return": float(np.mean(means[:, 0])),
          "eval_return_min": float(np.min(means[:, 1]))}  # fmt: skip
