"""The one host driver of every run: the schedule, metrics lines, evaluation and the target
return, checkpoints and resume, stop requests and the results.

    outcome = drive(program, config, loggers, checkpointer=..., resume=False)

A `Program` is what trains: the envpool program (`training/envpool_program.py`: pools,
actor threads, the learner over a seed axis) or the compiled program
(`training/compiled_program.py`: a JAX environment's run as one vmapped program). Both
train N *lanes* in lockstep (seeds, or a sweep's (setting, seed) pairs), each with its own
logger. The driver asks the program to `advance` to the next schedule point (a log line,
an evaluation, a checkpoint or the end of the budget, in env steps), then acts on it:

* every `log_every` env steps each lane writes a metrics line: the episodes that finished
  and the mean of the update metrics since the previous line (`records.Accumulators`);
* every `TrainConfig.eval_interval` env steps (by default about 20 times over the budget,
  at most once per log line) the greedy policies are evaluated (`Program.evaluate`), and
  at the end of the budget too (that score is not logged: the line at the end is the one a
  longer run would log; it is `RunResult.last_eval_return` and counts as an evaluation);
  each lane's best-scoring parameters so far go to `keep_best` (the scripts write them
  beside the final ones; a resume rewinds them to the checkpoint's), and the run stops
  once every lane's mean evaluation return reached `target_return`;
* every `checkpoint_every` env steps, and at the end, the program's state and the
  driver's records are checkpointed; a program whose environments cannot be
  checkpointed (envpool's) starts a new *segment* there (`Program.open`), in the
  uninterrupted run as in a resumed one, so that a run resumed from a checkpoint logs
  exactly what the uninterrupted run logs (every number of metrics.jsonl but the
  wall-clock fields, `WALL_CLOCK_FIELDS`);
* `should_stop()` (SIGTERM, SIGINT in the scripts) is polled between iterations (and
  within an evaluation, and while the first update waits for its compilation) and the
  run returns, interrupted. Where `Program.checkpoint_at_stop` (a compiled program, whose
  state is the whole run; an envpool program with actor threads, whose resume is not
  exact anyway) the run is checkpointed there; an inline envpool program's environments
  can only be re-created at a segment's start, so its run resumes from the last
  checkpoint (the work since is done again, exactly as the uninterrupted run did it).
  A program's evaluation may stop on the request too (`EvaluationStopped`: an envpool
  program of one process), and the run returns at once, interrupted: an exact program's
  run goes back to its last checkpoint (the evaluation is redone on resume); one that is
  checkpointed at a stop writes the line without the evaluation and a checkpoint there,
  that evaluation skipped (but for the final policy's: a resume from the end scores it).

An advance stops at the first iteration that reaches a point, so a line falls on the first
iteration boundary at or after its point, whatever the program.
"""

from __future__ import annotations

import dataclasses
from typing import Any
from typing import Callable
from typing import NamedTuple
from typing import Optional
from typing import Protocol
from typing import Sequence

import jax
import numpy as np

from offpolicy_ac.training import records
from offpolicy_ac.training.checkpoint import CheckpointAccessError
from offpolicy_ac.training.checkpoint import abstract_arrays
from offpolicy_ac.training.checkpoint import restore_newest
from offpolicy_ac.training.clock import seconds_since_launch
from offpolicy_ac.training.config import TrainConfig
from offpolicy_ac.training.evaluation import EvaluationStopped
from offpolicy_ac.training.logger import Logger
from offpolicy_ac.training.logger import check_loggers

WALL_CLOCK_FIELDS = ("wall_time_s", "env_steps_per_s")
"""Fields of a metrics line that depend on the wall clock (excluded from exact resume)."""


@dataclasses.dataclass
class RunResult:
  """The outcome of one lane (seed) of a run.

  Attributes:
    env_steps: environment steps taken.
    num_updates: learner updates made.
    wall_time_s: wall-clock seconds from the start of the training loop (a compilation still
      running then included), plus those of the runs it resumed.
    target_reached_at: the env steps of the first evaluation whose mean return reached the
      config's `target_return` (None: none did, or no target). A run of several learners
      goes on until every learner reached it, so a learner's last evaluation may be lower:
      its best parameters are the ones that scored `best_eval_return`.
    last_eval_return: the last evaluation's mean return (None: the run never evaluated):
      the final parameters' score when the run used its whole budget.
    best_eval_return: the highest evaluation mean return, scored by the best parameters.
    best_env_steps: the env steps of that evaluation.
    interrupted: whether `should_stop` (SIGTERM or SIGINT in the scripts) stopped the run
      before its step budget.
    checkpoint_env_steps: the env steps of the run's newest checkpoint, where `--resume`
      continues (None: no checkpoint).
    agent_state: the final agent state (parameters, optimizer state, ...).
    transform_state: the final data-transformer state (e.g. observation statistics).
  """

  env_steps: int
  num_updates: int
  wall_time_s: float
  target_reached_at: Optional[int]
  last_eval_return: Optional[float]
  best_eval_return: Optional[float]
  best_env_steps: Optional[int]
  interrupted: bool
  agent_state: Any
  transform_state: Any = None
  checkpoint_env_steps: Optional[int] = None


class NonFiniteError(FloatingPointError):
  """A learner statistic (a loss, a gradient norm) or the environment's data (rewards,
  discounts, observations) became NaN or infinite."""


class ResumeError(ValueError):
  """The run cannot be resumed: no checkpoints configured, none intact, or one of another
  format or kind of run."""


class Update(NamedTuple):
  """One iteration's learner statistics.

  Attributes:
    env_steps: the run's env steps after the iteration.
    num_updates: [N] each lane's updates so far.
    metrics: per lane, {name: float} of the iteration's updates, or None where the lane
      made no update (an off-policy learner while its replay fills).
  """

  env_steps: int
  num_updates: Sequence[int]
  metrics: Sequence[Optional[dict]]


class Progress(NamedTuple):
  """What one `Program.advance` did.

  Attributes:
    env_steps: env steps taken (by every process of a multi-host job together), including
      those of trajectories dropped or left unlearned by a stop request.
    stopped: a stop request ended the advance before its point.
    episodes: per lane, (episodes finished, sum of their returns, sum of their lengths).
    updates: the iterations' learner statistics, in order.
    discarded: per lane, trajectories dropped (actor threads).
    lags: per lane, the policy lag of each trajectory learned from (actor threads).
  """

  env_steps: int
  stopped: bool
  episodes: Sequence[tuple[int, float, float]]
  updates: Sequence[Update]
  discarded: Sequence[int] = ()
  lags: Sequence[Sequence[float]] = ()


class Program(Protocol):
  """What the driver trains (see the module docstring).

  Attributes:
    kind: "envpool" or "compiled", recorded in checkpoints.
    num_lanes: N, the learners trained in lockstep.
    lane_names: how errors name each lane (" for seed 3"; "" for a single learner).
    checkpoint_at_stop: whether a stop request that interrupts an advance writes a
      checkpoint there: a compiled program (it resumes as the run would have gone on) and
      one with actor threads (not exact anyway; it keeps what was learned). Else the stop
      writes none, and the run resumes from its last checkpoint.
  """

  kind: str
  num_lanes: int
  lane_names: Sequence[str]
  checkpoint_at_stop: bool

  def init(self) -> Any:
    """The fresh state of every lane."""

  def checkpoint_arrays(self, state: Any) -> Any:
    """The pytree of arrays a checkpoint holds (also the restore template)."""

  def from_checkpoint(self, state: Any, arrays: Any) -> Any:
    """The state from a checkpoint's arrays (`state`: a fresh state's arrays as
    `jax.ShapeDtypeStruct`s, the template)."""

  def agree_on_restore(self, env_steps: int) -> None:
    """Raises when the processes of a job restored different checkpoints."""

  def open(self, state: Any, segment: int) -> None:
    """Starts segment `segment`: at the start of the run and after each checkpoint cut.
    A program whose environments cannot be checkpointed re-creates them, seeded from the
    segment; one whose environments go on (actor threads, a compiled program's state)
    keeps them."""

  def advance(self, state: Any, env_steps: int, until: int, cut_at: int,
              should_stop: Callable[[], bool]) -> tuple[Any, Progress]:  # fmt: skip
    """Iterates from `env_steps` until the run's env steps reach `until` (or a stop
    request); the iteration that reaches `cut_at` ends a segment."""

  def evaluate(self, state: Any, should_stop: Callable[[], bool]) -> list[tuple[float, float]]:
    """Each lane's greedy evaluation: (mean return, min return). It may raise
    `EvaluationStopped` where `should_stop()` turns True during it."""

  def num_updates(self, state: Any) -> np.ndarray:
    """[N] updates made by each lane."""

  def final(self, state: Any, lane: int) -> tuple[Any, Any]:
    """(agent state, transformer state) of a lane."""

  def close(self) -> None:
    """Releases the environments and threads (the state stays usable)."""


class BestKeeper(Protocol):
  """Where `drive` keeps each lane's best-scoring parameters (`training.BestFiles` writes
  them into the run directories)."""

  def keep(self, lane: int, params: Any, transform_state: Any, env_steps: int,
           checkpointed: Optional[int]) -> None:  # fmt: skip
    """Lane `lane`'s parameters (host arrays) scored higher than any before, after
    `env_steps`; `checkpointed`: the env steps of the newest checkpoint (None: none yet),
    whose best parameters a resume may need back."""

  def rewind(self, lane: int, best_env_steps: Optional[int]) -> bool:
    """On resume: makes lane `lane`'s kept parameters those the restored checkpoint counts
    as its best, scored after `best_env_steps` (None: no evaluation before it, or no
    checkpoint: nothing is kept). False when they are lost: the lane's best then starts
    over."""


class Outcome(NamedTuple):
  """What `drive` returns: the final state and one RunResult per lane."""

  state: Any
  results: list[RunResult]


def drive(program: Program, config: TrainConfig, loggers: Sequence[Logger], *,
          checkpointer: Any = None, resume: bool = False,
          should_stop: Callable[[], bool] = lambda: False,
          keep_best: Optional[BestKeeper] = None,
          announce: Callable[[str], None] = lambda message: None) -> Outcome:  # fmt: skip
  """Trains `program` to the config's budget (see the module docstring).

  Args:
    program: the lanes to train.
    config: the run's settings (budget, schedule, evaluation, checkpoints).
    loggers: one per lane.
    checkpointer: a `checkpoint.Checkpointer` (None: no checkpoints).
    resume: continue from the newest readable checkpoint (none: start over, with a
      warning).
    should_stop: polled between iterations (and within an evaluation, and while the first
      update waits for its compilation); True returns with `interrupted=True` (and a
      checkpoint where `program.checkpoint_at_stop`).
    keep_best: a `BestKeeper`, given a lane's parameters whenever an evaluation scores
      higher than any before, and rewound on resume to the checkpoint's best.
    announce: told, in a sentence, where a resumed run continues.
  """
  if len(loggers) != program.num_lanes:
    raise ValueError(f"need one logger per learner ({program.num_lanes}), got {len(loggers)}")
  check_loggers(loggers, resume)
  run = _Driver(program, config, loggers, checkpointer, keep_best)
  state = run.restore() if resume else program.init()
  if resume:
    where = getattr(checkpointer, "directory", "")
    announce(f"resuming from the checkpoint at env step {run.saved:,} ({where})"
             if run.saved is not None else "no checkpoint to resume from: starting over")  # fmt: skip
    for lane in run.rewind_best():
      announce(f"the best parameters of the checkpoint{program.lane_names[lane]} were not kept "
               "(a damaged checkpoint passed over, a kill as they were written, or the run "
               "copied without its best* files): the best is counted again from here")  # fmt: skip
    total = config.budget.total_env_steps
    if run.saved is not None and all(a.reached for a in run.accs):
      announce(f"the run reached its target return ({config.eval.target_return:g}) at "
               f"{max(a.reached_at for a in run.accs):,} env steps and ended there: nothing "
               "is left to train, whatever the budget (--target-return may not change on "
               "--resume; a new run trains on)")  # fmt: skip
    elif run.saved is not None and run.schedule.env_steps >= total:
      announce(f"the run has already used its budget of {total:,} env steps: nothing is "
               "left to train (a larger --total-env-steps goes on from here)")  # fmt: skip
  return run.loop(state, should_stop)


class _Driver:
  """The driver's state between advances: the schedule, each lane's accumulators, the
  clock."""

  def __init__(self, program: Program, config: TrainConfig, loggers: Sequence[Logger],
               checkpointer: Any, keep_best: Optional[BestKeeper]):  # fmt: skip
    self.program, self.config, self.loggers = program, config, loggers
    self.checkpointer, self.keep_best = checkpointer, keep_best
    self.schedule = records.Schedule.start(
        config.budget.log_every, config.eval_interval, config.checkpoint.checkpoint_every
    )
    self.accs = [records.Accumulators() for _ in loggers]
    self.wall_offset, self.last_log, self.advanced_at = 0.0, (0.0, 0), 0.0
    self.should_stop: Callable[[], bool] = lambda: False  # the loop's
    self.saved: Optional[int] = None  # env steps of the newest checkpoint

  def restore(self) -> Any:
    """The newest checkpoint's state and records, the logs cut back to it; a fresh state
    where there is none. The fresh state, which gives the checkpoint's shapes, is let go
    before the checkpoint is read: a state is held once (a replay buffer included)."""
    program, where = self.program, str(getattr(self.checkpointer, "directory", ""))
    check = lambda record: records.from_record(record, program.kind, program.num_lanes, where)
    fresh = program.init()
    shapes = abstract_arrays(fresh)
    template = abstract_arrays(program.checkpoint_arrays(fresh))
    del fresh
    try:
      restored = restore_newest(self.checkpointer, template, check, records.is_first_checkpoint)
    except (ValueError, CheckpointAccessError) as e:
      raise ResumeError(str(e)) from e
    program.agree_on_restore(-1 if restored is None else restored[1]["schedule"]["env_steps"])
    if restored is None:
      state = program.init()
    else:
      arrays, record = restored
      state = program.from_checkpoint(shapes, arrays)
      self.schedule, self.accs = check(record)
      self.saved = self.schedule.env_steps
    for logger in self.loggers:
      try:
        logger.truncate(self.schedule.log_lines)
      except ValueError as e:  # metrics.jsonl lost lines the checkpoint counts
        raise ResumeError(f"{e} (it was cut or edited after the checkpoint): restore it, or "
                          "start the run over in another --run-dir") from e  # fmt: skip
    return state

  def rewind_best(self) -> list[int]:
    """Rewinds the kept best parameters to the restored checkpoint's (those written by
    the stretch after it, which the resume repeats, are not its); returns the lanes whose
    best starts over."""
    lost = []
    for lane, acc in enumerate(self.accs if self.keep_best else ()):
      if not self.keep_best.rewind(lane, acc.best_env_steps):
        acc.best_eval, acc.best_env_steps = None, None
        lost.append(lane)
    return lost

  def wall_time(self) -> float:
    return self.wall_offset + seconds_since_launch()

  def save(self, state: Any) -> None:
    if self.checkpointer is not None:
      self.schedule.wall_time_s = self.wall_time()
      self.checkpointer.save(
          self.schedule.env_steps,
          self.program.checkpoint_arrays(state),
          records.to_record(self.program.kind, self.schedule, self.accs),
      )
      self.saved = self.schedule.env_steps

  def accumulate(self, progress: Progress) -> None:
    """Adds an advance's episodes and statistics to the lanes' accumulators; raises
    `NonFiniteError` on a non-finite statistic, naming the lane and the iteration."""
    names = self.program.lane_names
    for k, acc in enumerate(self.accs):
      acc.add_episodes(*progress.episodes[k])
      for update in progress.updates:
        values = update.metrics[k]
        if values is None:
          continue
        for metric, value in values.items():
          if not np.all(np.isfinite(value)):
            kept = ("No checkpoint was written before it." if self.saved is None else
                    f"The last good checkpoint, at env step {self.saved:,}, is kept in "
                    f"{self.checkpointer.directory}.")  # fmt: skip
            raise NonFiniteError(
                f"non-finite {metric} = {value}{names[k]} at env step {update.env_steps} "
                f"(update {int(update.num_updates[k])}); stopping. {kept} A learning_rate "
                "or reward_scale too large makes the updates diverge (so does a loss with "
                "a bug).")  # fmt: skip
        acc.add_metrics(values)
      if progress.discarded:
        acc.discarded += progress.discarded[k]
      for lag in progress.lags[k] if progress.lags else ():
        acc.add_lag(lag)

  def log(self, state: Any, evaluate: bool, final: bool = False) -> bool:
    """One metrics line per lane; with `evaluate`, the greedy policies' returns (which
    decide whether a lane reached the target return). False where a stop request ended the
    evaluation: an exact program logs nothing (its run goes back to the last checkpoint),
    one checkpointed at a stop logs the line without the evaluation."""
    schedule = self.schedule
    wall, rate = schedule.final_clock if final and schedule.final_clock else self.line_clock()
    versions = self.program.num_updates(state)
    completed = True
    try:
      evaluations = self.program.evaluate(state, self.should_stop) if evaluate else None
    except EvaluationStopped:
      if not self.program.checkpoint_at_stop:
        return False
      evaluations, completed = None, False
    for k, (acc, logger) in enumerate(zip(self.accs, self.loggers)):
      line = acc.flush(schedule.env_steps, wall, rate, int(versions[k]))
      if evaluations is not None:
        mean, low = evaluations[k]
        line.update(eval_return=float(mean), eval_return_min=float(low))
        self.scored(state, k, float(mean))
      logger.log({**line, "final": True} if final else line)
    self.last_log = (seconds_since_launch(), schedule.env_steps)
    return completed

  def line_clock(self) -> list[float]:
    """A metrics line's wall-clock fields: the run's wall time when the last advance ended,
    and the env steps per second trained since the last line (an evaluation or checkpoint
    after the advance counts in neither)."""
    since, steps = self.last_log
    rate = (self.schedule.env_steps - steps) / max(self.advanced_at - since, 1e-9)
    return [self.wall_offset + self.advanced_at, rate]

  def keep_final_clock(self) -> None:
    """Before the checkpoint at the end: the final partial line, logged after it, times the
    training alone, and a resume with nothing left to train writes it again as it was."""
    if any(a.pending for a in self.accs):
      self.schedule.final_clock = self.line_clock()

  def score_final(self, state: Any) -> bool:
    """Scores the final policy (no metrics line; it counts as an evaluation: the best
    parameters, the target); False where a stop request ended the evaluation."""
    try:
      evaluations = self.program.evaluate(state, self.should_stop)
    except EvaluationStopped:
      return False
    for k, (mean, _) in enumerate(evaluations):
      self.scored(state, k, float(mean))
    return True

  def save_at_stop(self, state: Any, at_checkpoint_point: bool, end: bool) -> None:
    """The checkpoint of a program checkpointed at a stop, where a stop request ended the
    run: at a checkpoint point (or the end) as there, elsewhere a segment of its own. At
    the `end` of the budget, the final policy is left to score (`unscored_end`: a resume
    has nothing to train, and scores it) and the final line's clock is kept."""
    if end:
      self.schedule.unscored_end = bool(self.config.eval_interval)
      self.keep_final_clock()
    if at_checkpoint_point:
      self.schedule.cut(self.config.checkpoint.checkpoint_every)
    else:
      self.schedule.segment += 1
    self.save(state)

  def scored(self, state: Any, lane: int, mean: float) -> None:
    """Records lane `lane`'s evaluation; keeps its parameters when they scored best."""
    target = self.config.eval.target_return
    if self.accs[lane].evaluated(mean, self.schedule.env_steps, target) and self.keep_best:
      agent_state, transform = self.program.final(state, lane)
      self.keep_best.keep(lane, jax.device_get(agent_state.params), jax.device_get(transform),
                          self.schedule.env_steps, self.saved)  # fmt: skip

  def loop(self, state: Any, should_stop: Callable[[], bool]) -> Outcome:
    program, config, schedule = self.program, self.config, self.schedule
    total = config.budget.total_env_steps
    self.should_stop = should_stop
    self.wall_offset = schedule.wall_time_s - seconds_since_launch()
    self.last_log = (seconds_since_launch(), schedule.env_steps)
    self.advanced_at = self.last_log[0]
    interrupted, advanced = False, False
    program.open(state, schedule.segment)
    try:
      while schedule.env_steps < total and not all(a.reached for a in self.accs):
        points = (schedule.next_log, schedule.next_eval, schedule.next_checkpoint, total)
        until = min(p for p in points if p is not None)
        cut_at = min(schedule.next_checkpoint or total, total)
        state, progress = program.advance(state, schedule.env_steps, until, cut_at, should_stop)
        self.advanced_at = seconds_since_launch()
        schedule.env_steps, advanced = schedule.env_steps + progress.env_steps, True
        schedule.final_clock, schedule.unscored_end = None, False
        self.accumulate(progress)
        end = schedule.env_steps >= total
        if progress.stopped:
          interrupted = True
          # Nothing new since the newest checkpoint: it stays as it is (not written again).
          if program.checkpoint_at_stop and self.saved != schedule.env_steps:
            self.save_at_stop(state, at_checkpoint_point=end, end=end)
          break
        evaluate_end = end and bool(config.eval_interval)  # the final policy is scored
        due = schedule.checkpoint_due()
        logged, evaluated = schedule.log_due(), schedule.eval_due()
        stopped = False
        if logged:
          stopped = not self.log(state, evaluate=evaluated)
          if not stopped or program.checkpoint_at_stop:  # a line was written
            schedule.logged(config.budget.log_every, config.eval_interval)
        if evaluate_end and not evaluated and not stopped:
          # The final policy is scored (no metrics line): its score counts as an
          # evaluation (best parameters, target), and the last checkpoint records it.
          stopped = not self.score_final(state)
        if stopped:  # a stop request ended an evaluation
          interrupted = True
          # An exact program goes back to its last checkpoint, and the resumed run redoes
          # the evaluation as the uninterrupted run does it. One that checkpoints at a stop
          # keeps what it did (the line without the evaluation) and a checkpoint here.
          if program.checkpoint_at_stop and self.saved != schedule.env_steps:
            self.save_at_stop(state, at_checkpoint_point=due or end, end=end)
          break
        end = end or all(a.reached for a in self.accs)
        if due or end:
          if end:
            self.keep_final_clock()
          schedule.cut(config.checkpoint.checkpoint_every)
          self.save(state)
          if not end:
            program.open(state, schedule.segment)
      if not interrupted and schedule.unscored_end:
        # Resumed at the end of a run stopped before it scored the final policy: scored
        # here (the checkpoint keeps the mark, not written again: a later resume scores it
        # again).
        interrupted = not self.score_final(state)
        schedule.unscored_end = interrupted
      if not interrupted and any(a.pending for a in self.accs):
        # A final line for the partial interval at the end, after the last checkpoint:
        # resuming that checkpoint writes it again, or, with a larger budget, drops it (it
        # is after the checkpoint's log_lines) and logs the interval in full.
        self.log(state, evaluate=False, final=True)
      # A run resumed with nothing left to do keeps the time its checkpoint recorded.
      wall = self.wall_time() if advanced or self.saved is None else schedule.wall_time_s
    finally:
      program.close()
    versions = program.num_updates(state)
    results = []
    for k, acc in enumerate(self.accs):
      agent_state, transform_state = program.final(state, k)
      results.append(RunResult(
          env_steps=schedule.env_steps, num_updates=int(versions[k]), wall_time_s=wall,
          target_reached_at=acc.reached_at, last_eval_return=acc.last_eval,
          best_eval_return=acc.best_eval, best_env_steps=acc.best_env_steps,
          interrupted=interrupted, agent_state=agent_state, transform_state=transform_state,
          checkpoint_env_steps=self.saved if self.checkpointer is not None else None,
      ))  # fmt: skip
    return Outcome(state, results)
