"""The host driver's schedule around stops and checkpoints, on a program with no learner:
each iteration takes 10 env steps, and its state is the env steps taken; and a run trained
from Python with `train` and the public `Checkpointer`, stopped and resumed."""

import dataclasses
import pathlib

import jax
import numpy as np

from offpolicy_ac import agents
from offpolicy_ac.training import Checkpointer
from offpolicy_ac.training import Progress
from offpolicy_ac.training import TrainConfig
from offpolicy_ac.training import Update
from offpolicy_ac.training import drive
from offpolicy_ac.training import train

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

  def evaluate(self, state):
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


def test_train_stopped_and_resumed_with_the_public_checkpointer_ends_as_the_straight_run(tmp_path):
  config = TrainConfig.of(env_id="CartPole-v1", num_envs=4, unroll_length=8, seed=3,
                          total_env_steps=640, log_every=128, checkpoint_every=256, eval_every=0)  # fmt: skip
  factory = lambda spec: agents.make_impala(spec, agents.ImpalaConfig())  # noqa: E731
  straight = ListLogger()
  (expected,) = train(factory, config, [straight])
  polls = iter(range(1000))
  stop_soon = lambda: next(polls) == 12  # noqa: E731  (12 iterations: 384 env steps)
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
