"""The host driver's schedule around stops and checkpoints, on a program with no learner:
each iteration takes 10 env steps, and its state is the env steps taken; and a run trained
from Python with `train` and the public `Checkpointer`, stopped and resumed."""

import dataclasses
import json
import pathlib
import shutil
import sys

import jax
import numpy as np
import pytest

from offpolicy_ac import agents
from offpolicy_ac.training import BestFiles
from offpolicy_ac.training import Checkpointer
from offpolicy_ac.training import Progress
from offpolicy_ac.training import TrainConfig
from offpolicy_ac.training import Update
from offpolicy_ac.training import drive
from offpolicy_ac.training import load_params
from offpolicy_ac.training import save_params
from offpolicy_ac.training import train
from offpolicy_ac.training.evaluation import EvaluationStopped

STEPS = 10  # per iteration


@dataclasses.dataclass
class CountingProgram:
  """A compiled-like program (checkpointed anywhere, so a stop writes a checkpoint) that
  asks to stop when its env steps reach `stop_at`."""

  stop_at: int = -1
  kind: str = "compiled"
  num_lanes: int = 1
  lane_names: tuple = ("",)
  checkpoint_at_stop: bool = True

  def init(self):
    return np.zeros((), np.int64)

  def checkpoint_arrays(self, state):
    return {"steps": state}

  def from_checkpoint(self, state, arrays):
    return np.asarray(arrays["steps"])

  def agree_on_restore(self, env_steps):
    pass

  def open(self, state, segment):
    pass

  def advance(self, state, env_steps, until, cut_at, should_stop):
    taken, updates = 0, []
    while env_steps + taken < until:
      if env_steps + taken == self.stop_at:
        return state + taken, Progress(taken, True, [(0, 0.0, 0.0)], updates)
      taken += STEPS
      updates.append(Update(env_steps + taken, [int(state) + taken], [{"loss": 1.0}]))
    return state + taken, Progress(taken, False, [(1, 5.0, float(taken))], updates)

  def evaluate(self, state, should_stop):
    return [(0.0, 0.0)]

  def num_updates(self, state):
    return np.array([int(state)])

  def final(self, state, lane):
    return None, None

  def close(self):
    pass


class MemoryCheckpointer:
  """Keeps every save in memory, as `checkpoint.Checkpointer` keeps them on disk."""

  directory = pathlib.Path("memory")

  def __init__(self):
    self.saves = {}
    self.writes = []

  def save(self, step, arrays, record):
    self.saves[step] = (arrays, record)
    self.writes.append(step)

  def restore_latest(self, template, check_record=None):
    if not self.saves:
      return None
    step = max(self.saves)
    arrays, record = self.saves[step]
    check_record(record)
    return step, arrays, record


class ListLogger:

  def __init__(self):
    self.lines = []

  def log(self, record):
    self.lines.append(record)

  def truncate(self, num_lines):
    del self.lines[num_lines:]

  def close(self):
    pass


CONFIG = TrainConfig.of(total_env_steps=95, log_every=30, checkpoint_every=40, eval_every=0)


def _lines(logger):
  return [{k: v for k, v in line.items() if k not in ("wall_time_s", "env_steps_per_s")}
          for line in logger.lines]  # fmt: skip


def test_a_stop_right_after_a_checkpoint_leaves_it_as_it_is():
  checkpointer, logger = MemoryCheckpointer(), ListLogger()
  outcome = drive(CountingProgram(stop_at=40), CONFIG, [logger], checkpointer=checkpointer)
  assert outcome.results[0].interrupted and outcome.results[0].env_steps == 40
  assert checkpointer.writes == [40]  # not written a second time, which deletes it first


def test_a_stop_between_checkpoints_writes_one_there():
  checkpointer, logger = MemoryCheckpointer(), ListLogger()
  drive(CountingProgram(stop_at=50), CONFIG, [logger], checkpointer=checkpointer)
  assert checkpointer.writes == [40, 50]


def test_resuming_a_finished_run_logs_its_final_partial_line_again():
  checkpointer, straight = MemoryCheckpointer(), ListLogger()
  drive(CountingProgram(), CONFIG, [straight], checkpointer=checkpointer)
  assert [line["env_steps"] for line in straight.lines] == [30, 60, 90, 100]
  assert straight.lines[-1]["final"] and checkpointer.writes == [40, 80, 100]
  resumed = ListLogger()
  resumed.lines = list(straight.lines)
  said = []
  outcome = drive(CountingProgram(), CONFIG, [resumed], checkpointer=checkpointer, resume=True,
                  announce=said.append)  # fmt: skip
  assert _lines(resumed) == _lines(straight)
  assert outcome.results[0].env_steps == 100 and checkpointer.writes == [40, 80, 100]
  assert said[-1] == ("the run has already used its budget of 95 env steps: nothing is left "
                      "to train (a larger --total-env-steps goes on from here)")  # fmt: skip


class Clock:
  """A wall clock that runs only when a `TimedProgram` or a `TimedCheckpointer` works."""

  now = 0.0

  def __call__(self):
    return self.now


@dataclasses.dataclass
class TimedProgram(CountingProgram):
  """Trains at 10 env steps a second; an evaluation takes 100 s."""

  clock: Clock = None

  def advance(self, state, env_steps, until, cut_at, should_stop):
    state, progress = super().advance(state, env_steps, until, cut_at, should_stop)
    self.clock.now += progress.env_steps / 10
    return state, progress

  def evaluate(self, state, should_stop):
    self.clock.now += 100.0
    return super().evaluate(state, should_stop)


class TimedCheckpointer(MemoryCheckpointer):
  """A checkpoint takes 50 s to write."""

  def __init__(self, clock):
    super().__init__()
    self.clock = clock

  def save(self, step, arrays, record):
    self.clock.now += 50.0
    super().save(step, arrays, record)


def test_a_lines_wall_clock_fields_time_its_training_and_a_resume_keeps_the_final_ones(
    monkeypatch,
):
  """The final partial line follows the final policy's evaluation and the last checkpoint,
  which its rate and wall time do not count; a resume with nothing left to train writes it
  again as it was (not at 0 env steps a second)."""
  from offpolicy_ac.training import driver

  clock = Clock()
  monkeypatch.setattr(driver, "seconds_since_launch", clock)
  config = CONFIG.replace(eval_every=30)
  checkpointer, straight = TimedCheckpointer(clock), ListLogger()
  (result,) = drive(TimedProgram(clock=clock), config, [straight],
                    checkpointer=checkpointer).results  # fmt: skip
  assert [line["env_steps"] for line in straight.lines] == [30, 60, 90, 100]
  # a checkpoint within an interval (at 40 and 80) counts in its rate, an evaluation in none
  assert [line["env_steps_per_s"] for line in straight.lines] == [10.0, 30 / 53, 30 / 53, 10.0]
  # 10 s of training, 4 evaluations and 3 checkpoints, the last of each after the final line
  assert straight.lines[-1]["wall_time_s"] == 10 + 3 * 100 + 2 * 50
  assert result.wall_time_s == 10 + 4 * 100 + 3 * 50
  resumed = ListLogger()
  resumed.lines = list(straight.lines)
  clock.now += 1000.0  # the run resumed later
  drive(TimedProgram(clock=clock), config, [resumed], checkpointer=checkpointer, resume=True)
  assert resumed.lines == straight.lines


def test_resuming_a_run_that_reached_its_target_says_nothing_is_left_to_train():
  """With a larger budget it announced nothing: the budget grew, and the run ended where
  it was (a reached target ends it, and --target-return may not change on resume)."""
  config = CONFIG.replace(eval_every=30, target_return=0.0)  # the evaluations score 0.0
  checkpointer = MemoryCheckpointer()
  (result,) = drive(CountingProgram(), config, [ListLogger()], checkpointer=checkpointer).results
  assert result.target_reached_at == result.env_steps == 30 and checkpointer.writes == [30]
  said = []
  outcome = drive(CountingProgram(), config.replace(total_env_steps=200), [ListLogger()],
                  checkpointer=checkpointer, resume=True, announce=said.append)  # fmt: skip
  assert outcome.results[0].env_steps == 30 and checkpointer.writes == [30]
  assert said[-1] == (
      "the run reached its target return (0) at 30 env steps and ended there: nothing is left "
      "to train, whatever the budget (--target-return may not change on --resume; a new run "
      "trains on)"
  )


def test_train_stopped_and_resumed_with_the_public_checkpointer_ends_as_the_straight_run(tmp_path):
  config = TrainConfig.of(env_id="CartPole-v1", num_envs=4, unroll_length=8, seed=3,
                          total_env_steps=640, log_every=128, checkpoint_every=256, eval_every=0)  # fmt: skip
  factory = lambda spec: agents.make_impala(spec, agents.ImpalaConfig())  # noqa: E731
  straight = ListLogger()
  (expected,) = train(factory, config, [straight])
  polls = iter(range(1000))
  # The 13th poll between iterations (12 iterations: 384 env steps); the first update polls
  # more while it waits for its compilation.
  between = lambda: sys._getframe(2).f_code.co_name == "advance"  # noqa: E731
  stop_soon = lambda: between() and next(polls) == 12  # noqa: E731
  stopped = ListLogger()
  (first,) = train(factory, config, [stopped], checkpointer=Checkpointer(tmp_path),
                   should_stop=stop_soon)  # fmt: skip
  # The inline workflow re-creates its environments at each checkpoint, so a stop between
  # two goes back to the last one (docs/concepts/resume.md).
  assert first.interrupted and first.env_steps == 384 and first.checkpoint_env_steps == 256
  assert Checkpointer(tmp_path).steps() == [256]
  (resumed,) = train(factory, config, [stopped], checkpointer=Checkpointer(tmp_path), resume=True)
  assert not resumed.interrupted and resumed.env_steps == 640
  assert _lines(stopped) == _lines(straight)
  jax.tree.map(np.testing.assert_array_equal, resumed.agent_state.params,
               expected.agent_state.params)  # fmt: skip


def test_checkpoints_that_cut_every_episode_short_of_the_time_limit_are_warned():
  """Each checkpoint of an exact envpool run starts new environments: a CartPole run (time
  limit 500) of 8 environments x 16-step unrolls (128 env steps an iteration) must put 32
  iterations (4,096 env steps) between checkpoints for an episode to run whole."""
  import warnings

  from offpolicy_ac.training.envpool_program import warn_if_checkpoints_cut_episodes

  def warned(**fields):
    config = TrainConfig.of(**{"env_id": "CartPole-v1", "num_envs": 8, "unroll_length": 16,
                               **fields})  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
      warnings.simplefilter("always")
      warn_if_checkpoints_cut_episodes(config)
    return [str(w.message) for w in caught]

  (message,) = warned(checkpoint_every=3_968)  # 31 iterations: 496 steps per environment
  assert message.startswith(
      "checkpoint_every 3,968 cuts every training episode after at most 496 steps of its "
      "environment, short of CartPole-v1's time limit of 500"
  )
  assert message.endswith("with checkpoint_every 4,096 or more, they can")
  # The cut falls on the iteration at or after each multiple: 24 iterations, 384 steps.
  assert "after at most 384 steps" in warned(checkpoint_every=3_000)[0]
  assert not warned(checkpoint_every=3_969)  # every other segment 32 iterations: 512 steps
  assert not warned(checkpoint_every=4_096)
  assert warned(checkpoint_every=1_000, max_episode_steps=100) == []  # its own time limit
  assert warned(checkpoint_every=0) == []  # no checkpoints, no cuts
  assert warned(checkpoint_every=1_000, total_env_steps=1_000) == []  # only at the end
  assert warned(env_id="Pong-v5", atari=True, checkpoint_every=1_000) == []  # games end first


@dataclasses.dataclass
class ScoredProgram(CountingProgram):
  """Scores its greedy policy `score(env steps)`; its parameters are its env steps; it
  crashes (a kill: no checkpoint) when its env steps reach `crash_at`."""

  score: object = None
  crash_at: int = -1
  checkpoint_at_stop: bool = False

  def advance(self, state, env_steps, until, cut_at, should_stop):
    if env_steps == self.crash_at:
      raise KeyboardInterrupt("killed")
    return super().advance(state, env_steps, until, cut_at, should_stop)

  def evaluate(self, state, should_stop):
    return [(self.score(int(state)), 0.0)]

  def final(self, state, lane):
    return agents.AgentState(params={"steps": np.asarray(state)}, target_params=(),
                             opt_state=(), key=(), num_updates=0), ()  # fmt: skip


SCORED = TrainConfig.of(total_env_steps=95, log_every=10, checkpoint_every=40, eval_every=10)


def _best(run_dir):
  if not (run_dir / "best_params.msgpack").exists():
    return None
  record = json.loads((run_dir / "best.json").read_text())
  params = load_params(run_dir / "best_params.msgpack", {"steps": np.zeros((), np.int64)})
  assert int(params["steps"]) == record["env_steps"]  # the pair best.json records
  return record["env_steps"]


def _killed_and_resumed(tmp_path, crash_at, resumed_score):
  """A run scored by its env steps, killed at `crash_at`, then resumed by a run whose
  evaluations after the checkpoint score `resumed_score` (a run that does not repeat
  itself, as one with actor threads); returns the best files' steps after each, the
  resumed run's result and what it announced."""
  keeper, checkpointer = BestFiles([tmp_path]), MemoryCheckpointer()
  with pytest.raises(KeyboardInterrupt):
    drive(ScoredProgram(score=float, crash_at=crash_at), SCORED, [ListLogger()],
          checkpointer=checkpointer, keep_best=keeper)  # fmt: skip
  killed, said = _best(tmp_path), []
  outcome = drive(ScoredProgram(score=resumed_score), SCORED, [ListLogger()],
                  checkpointer=checkpointer, resume=True, keep_best=keeper,
                  announce=said.append)  # fmt: skip
  return killed, _best(tmp_path), outcome.results[0], said


def test_a_resume_puts_back_the_best_parameters_of_its_checkpoint(tmp_path):
  """Killed at 70 env steps, the run had kept its parameters of 70; the checkpoint at 40
  counts those of 40 as its best. The resumed run scores lower after 40: its best files
  are those of 40, the ones its summary names, not those of the lost stretch."""
  killed, best, result, said = _killed_and_resumed(tmp_path, 70, lambda steps: 40 - steps)
  assert killed == 70 and said == ["resuming from the checkpoint at env step 40 (memory)"]
  assert (result.best_env_steps, result.best_eval_return, best) == (40, 40.0, 40)
  # Scored higher again after the resume, it keeps its own.
  again = tmp_path / "again"
  again.mkdir()
  assert _killed_and_resumed(again, 70, lambda steps: steps + 1)[1] == 100


def test_a_resume_with_no_best_at_its_checkpoint_keeps_none_of_the_lost_stretch(tmp_path):
  """Killed before its first checkpoint, the run starts over: the best files it kept are
  removed, and a run that never scores (NaN) has none."""
  killed, best, result, _ = _killed_and_resumed(tmp_path, 30, lambda steps: float("nan"))
  assert killed == 30 and best is None and result.best_env_steps is None


def test_best_parameters_the_checkpoint_counts_but_that_are_lost_start_the_best_over(tmp_path):
  """The checkpoint's best files are gone (deleted by hand here: a damaged newest
  checkpoint passed over, or a kill as they were linked): the resume says so, and the
  best is counted again from the resumed run's evaluations."""
  keeper, checkpointer = BestFiles([tmp_path]), MemoryCheckpointer()
  with pytest.raises(KeyboardInterrupt):
    drive(ScoredProgram(score=float, crash_at=70), SCORED, [ListLogger()],
          checkpointer=checkpointer, keep_best=keeper)  # fmt: skip
  shutil.rmtree(tmp_path / "best_at_checkpoint")
  said = []
  outcome = drive(ScoredProgram(score=lambda steps: -steps), SCORED, [ListLogger()],
                  checkpointer=checkpointer, resume=True, keep_best=keeper,
                  announce=said.append)  # fmt: skip
  assert said[1].startswith("the best parameters of the checkpoint were not kept")
  # The resumed run's first evaluation (at 50) is its best.
  assert outcome.results[0].best_env_steps == 50 == _best(tmp_path)


def test_best_files_linked_back_and_forth_leave_no_stray_files(tmp_path):
  """Files put back by a resume are the links in best_at_checkpoint/ themselves; linking
  them there again (the resumed run's next best) leaves the folder as it was."""
  keeper = BestFiles([tmp_path])
  params = lambda steps: {"steps": np.asarray(steps)}  # noqa: E731
  keeper.keep(0, params(10), (), 10, None)
  keeper.keep(0, params(20), (), 20, 10)  # the checkpoint at 10 counts 10 as its best
  assert keeper.rewind(0, 10) and _best(tmp_path) == 10
  keeper.keep(0, params(30), (), 30, 10)
  aside = tmp_path / "best_at_checkpoint"
  assert (_best(tmp_path), _best(aside)) == (30, 10)
  assert sorted(p.name for p in aside.iterdir()) == [
      "best.json", "best_params.msgpack", "best_params.msgpack.crc32"]  # fmt: skip
  assert not keeper.rewind(0, 20) and _best(tmp_path) is None  # the checkpoint's are gone


@dataclasses.dataclass
class StoppedInEvaluation(CountingProgram):
  """Its evaluation at `evaluation_stop_at` env steps ends on a stop request
  (`EvaluationStopped`, as an envpool program's evaluation of one process does)."""

  evaluation_stop_at: int = -1
  at: int = 0

  def advance(self, state, env_steps, until, cut_at, should_stop):
    state, progress = super().advance(state, env_steps, until, cut_at, should_stop)
    self.at = int(state)
    return state, progress

  def evaluate(self, state, should_stop):
    if self.at == self.evaluation_stop_at:
      raise EvaluationStopped("stopped")
    return [(0.0, 0.0)]


@pytest.mark.parametrize("exact, stop_at, eval_every, log_every, writes, lines", [
    # a program checkpointed at a stop keeps the line, without the evaluation, and writes a
    # checkpoint there
    (False, 30, 30, 30, [30], [30]),
    (False, 100, 1000, 30, [40, 80, 100], [30, 60, 90]),  # the final policy's evaluation
    # an exact program goes back to its last checkpoint, where the resume redoes the
    # evaluation: nothing of the stop's point is written, a checkpoint due there included
    (True, 30, 30, 30, [], []),
    (True, 40, 20, 10, [], [10, 20, 30]),
    (True, 100, 1000, 30, [40, 80], [30, 60, 90]),
])  # fmt: skip
def test_a_stop_during_an_evaluation_stops_the_run_there(exact, stop_at, eval_every, log_every,
                                                         writes, lines):  # fmt: skip
  """An Atari evaluation can outlast a scheduler's grace period: a stop request during it
  ends it, and the run stops there (it played the evaluation to its end)."""
  config = CONFIG.replace(eval_every=eval_every, log_every=log_every)
  checkpointer, logger = MemoryCheckpointer(), ListLogger()
  program = StoppedInEvaluation(checkpoint_at_stop=not exact, evaluation_stop_at=stop_at)
  (result,) = drive(program, config, [logger], checkpointer=checkpointer).results
  assert result.interrupted and result.env_steps == stop_at
  assert checkpointer.writes == writes
  assert [line["env_steps"] for line in logger.lines] == lines
  evaluated = [line["env_steps"] for line in logger.lines if "eval_return" in line]
  assert evaluated == [s for s in lines if s % eval_every == 0 and s != stop_at]


@pytest.mark.parametrize("eval_every", [50, 1000])  # the end's line scores it, or no line
def test_a_run_stopped_as_it_scored_its_final_policy_scores_it_on_resume(eval_every):
  """Its checkpoint is at the end, so the resume has nothing left to train: it scores the
  final policy, as the uninterrupted run did (it ended with the score of 18,432 env steps
  when 20,480 were trained)."""
  config = CONFIG.replace(eval_every=eval_every)
  checkpointer, straight, stopped = MemoryCheckpointer(), ListLogger(), ListLogger()
  (expected,) = drive(StoppedInEvaluation(), config, [straight]).results
  program = StoppedInEvaluation(evaluation_stop_at=100)
  (first,) = drive(program, config, [stopped], checkpointer=checkpointer).results
  assert first.interrupted and checkpointer.writes == [40, 80, 100]
  assert first.best_env_steps == (50 if eval_every == 50 else None)
  (resumed,) = drive(StoppedInEvaluation(), config, [stopped], checkpointer=checkpointer,
                     resume=True).results  # fmt: skip
  assert not resumed.interrupted and resumed.last_eval_return == expected.last_eval_return == 0.0
  assert resumed.best_env_steps == expected.best_env_steps == 100
  # The end's line was written without its evaluation (checkpointed at the stop).
  lines = [30, 50, 60, 90, 100] if eval_every == 50 else [30, 60, 90, 100]
  assert [line["env_steps"] for line in stopped.lines] == lines
  evaluated = lambda logger: [l["env_steps"] for l in logger.lines if "eval_return" in l]  # noqa: E731
  assert evaluated(straight) == ([50, 100] if eval_every == 50 else [])
  assert evaluated(stopped) == ([50] if eval_every == 50 else [])


@dataclasses.dataclass
class StoppedAtTheEnd(CountingProgram):
  """Asked to stop in its last advance, which still reaches the end of the budget (actor
  pools count the late trajectories of a stopped round)."""

  def advance(self, state, env_steps, until, cut_at, should_stop):
    state, progress = super().advance(state, env_steps, until, cut_at, should_stop)
    if env_steps + progress.env_steps >= 95:
      progress = progress._replace(stopped=True)
    return state, progress


def test_a_run_stopped_in_the_advance_that_ends_its_budget_scores_its_policy_on_resume():
  config = CONFIG.replace(eval_every=1000)  # the final policy's evaluation alone
  checkpointer, logger = MemoryCheckpointer(), ListLogger()
  (first,) = drive(StoppedAtTheEnd(), config, [logger], checkpointer=checkpointer).results
  assert first.interrupted and first.env_steps == 100 and checkpointer.writes == [40, 80, 100]
  assert first.last_eval_return is None
  (resumed,) = drive(CountingProgram(), config, [logger], checkpointer=checkpointer,
                     resume=True).results  # fmt: skip
  assert not resumed.interrupted and resumed.last_eval_return == 0.0
  assert [line["env_steps"] for line in logger.lines] == [30, 60, 90, 100]
  assert logger.lines[-1]["final"] and logger.lines[-1]["env_steps_per_s"] > 0


class PollingEvaluation(CountingProgram):
  """Its evaluation polls the stop request, as an envpool program's of one process does."""

  def evaluate(self, state, should_stop):
    if should_stop():
      raise EvaluationStopped("stopped")
    return super().evaluate(state, should_stop)


def test_a_resume_that_scores_the_final_policy_stops_on_a_stop_request():
  """That evaluation was given no stop request (an Atari one ran minutes past a SIGTERM)."""
  config = CONFIG.replace(eval_every=1000)
  checkpointer = MemoryCheckpointer()
  drive(StoppedAtTheEnd(), config, [ListLogger()], checkpointer=checkpointer)
  (stopped,) = drive(PollingEvaluation(), config, [ListLogger()], checkpointer=checkpointer,
                     resume=True, should_stop=lambda: True).results  # fmt: skip
  assert stopped.interrupted and stopped.last_eval_return is None
  (scored,) = drive(PollingEvaluation(), config, [ListLogger()], checkpointer=checkpointer,
                    resume=True).results  # fmt: skip
  assert not scored.interrupted and scored.last_eval_return == 0.0


def test_an_envpool_runs_evaluation_stops_on_a_stop_request_and_the_run_resumes(tmp_path):
  """The request is polled within the evaluation's steps, not only between iterations: the
  run stops at once, without the line or the checkpoint due there (an inline run goes back
  to its last checkpoint); resumed, it logs what the straight run logs."""
  import sys

  config = TrainConfig.of(env_id="CartPole-v1", num_envs=4, unroll_length=8, seed=3,
                          total_env_steps=640, log_every=128, checkpoint_every=256,
                          eval_every=256, eval_episodes=2)  # fmt: skip
  factory = lambda spec: agents.make_impala(spec, agents.ImpalaConfig())  # noqa: E731
  straight = ListLogger()
  (expected,) = train(factory, config, [straight])
  in_evaluation = lambda: sys._getframe(1).f_code.co_name == "evaluate"  # noqa: E731
  stopped = ListLogger()
  (first,) = train(factory, config, [stopped], checkpointer=Checkpointer(tmp_path),
                   should_stop=in_evaluation)  # fmt: skip
  assert first.interrupted and first.env_steps == 256 and first.checkpoint_env_steps is None
  assert [line["env_steps"] for line in stopped.lines] == [128]
  (resumed,) = train(factory, config, [stopped], checkpointer=Checkpointer(tmp_path), resume=True)
  assert not resumed.interrupted and resumed.env_steps == 640
  assert _lines(stopped) == _lines(straight) and "eval_return" in stopped.lines[1]
  jax.tree.map(np.testing.assert_array_equal, resumed.agent_state.params,
               expected.agent_state.params)  # fmt: skip


@pytest.mark.parametrize("stop_in", ["advance", "finished"])
def test_a_stop_while_the_first_update_compiles_does_not_wait_for_the_compilation(
    monkeypatch, stop_in
):
  """XLA's compilation cannot be interrupted: a stop request before the first update (at
  the first poll, or while the first unroll waited for the warm-up) waited for it (minutes
  for a large network) as the run closed, and a Ctrl-C then took that long."""
  import threading

  from offpolicy_ac.training.learner import Learner

  release, warm_ups = threading.Event(), []

  def slow_warm_up(self, state, batch, acting):  # a compilation of 60 s
    warm_ups.append(threading.Thread(target=release.wait, args=(60,), daemon=True))
    warm_ups[-1].start()
    return warm_ups[-1]

  monkeypatch.setattr(Learner, "warm_up", slow_warm_up)
  config = TrainConfig.of(env_id="CartPole-v1", num_envs=4, unroll_length=8,
                          total_env_steps=640, eval_every=0)  # fmt: skip
  factory = lambda spec: agents.make_impala(spec, agents.ImpalaConfig())  # noqa: E731
  polled_in = lambda: sys._getframe(1).f_code.co_name == stop_in  # noqa: E731
  try:
    (result,) = train(factory, config, [ListLogger()], should_stop=polled_in)
    assert result.interrupted and result.num_updates == 0
    assert result.env_steps == (32 if stop_in == "finished" else 0)
    assert warm_ups[0].is_alive()
  finally:
    release.set()


def test_parameters_of_another_template_are_named_against_the_template(tmp_path):
  """A direct `load_params` call blamed config.json, which it never read."""
  save_params(tmp_path / "p.msgpack", {"w": np.zeros((64, 2), np.float32)})
  with pytest.raises(ValueError, match=r"p.msgpack holds parameters of other shapes than the "
                                       r"template's \(\['w'\]: \(64, 2\), the template's "
                                       r"\(128, 2\); a run's template is the agent its "
                                       r"config.json describes\)"):  # fmt: skip
    load_params(tmp_path / "p.msgpack", {"w": np.zeros((128, 2), np.float32)})
