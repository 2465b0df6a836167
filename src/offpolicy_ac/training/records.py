"""The driver's host-side bookkeeping as typed records, and their checkpoint form.

`Schedule` is shared by every lane of a run (seeds and sweep settings advance in
lockstep): env steps, the segment, log lines written, and the next log / evaluation /
checkpoint points. `Accumulators` are per lane: episodes finished and update metrics
since the last log line, trajectories dropped and policy lag (actor threads), the last
evaluation.

Both go into every checkpoint's JSON record (`to_record` / `from_record`), tagged with
`RECORD_FORMAT` and the kind of program that wrote it ("envpool" or "compiled"); a
record of another format or kind is refused with a message naming it.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

RECORD_FORMAT = 3
"""Version of the checkpoint record. Format 2 (per-seed lists of episode returns; compiled
runs with a record of their own) was written by offpolicy_ac 0.2, format 1 (flat
`counters`, no seed axis) by offpolicy_ac 0.1."""

_READ_BY = {1: "offpolicy_ac 0.1", 2: "offpolicy_ac 0.2"}


def next_point(point: int, every: int, env_steps: int) -> int:
  """A schedule point (log, eval, checkpoint) moved past `env_steps` in `every` steps."""
  while point <= env_steps:
    point += every
  return point


@dataclasses.dataclass
class Schedule:
  """Where the run is, and when it next logs, evaluates and checkpoints (env steps)."""

  next_log: int
  next_eval: Optional[int]
  next_checkpoint: Optional[int]
  env_steps: int = 0
  segment: int = 0
  log_lines: int = 0
  wall_time_s: float = 0.0
  # The wall-clock fields of the run's final partial line, logged after its last checkpoint.
  final_clock: Optional[list] = None
  # A stop request came at the end of the budget before the final policy was scored (a
  # program checkpointed at a stop): a resume scores it.
  unscored_end: bool = False

  @classmethod
  def start(cls, log_every: int, eval_every: int, checkpoint_every: int) -> "Schedule":
    return cls(log_every, eval_every or None, checkpoint_every or None)

  def eval_due(self) -> bool:
    return self.next_eval is not None and self.env_steps >= self.next_eval

  def checkpoint_due(self) -> bool:
    return self.next_checkpoint is not None and self.env_steps >= self.next_checkpoint

  def log_due(self) -> bool:
    return self.env_steps >= self.next_log or self.eval_due()

  def logged(self, log_every: int, eval_every: int) -> None:
    """Moves the log (and, if it was due, the evaluation) point past now."""
    if self.eval_due():
      self.next_eval = next_point(self.next_eval, eval_every, self.env_steps)
    self.next_log = next_point(self.next_log, log_every, self.env_steps)
    self.log_lines += 1

  def cut(self, checkpoint_every: int) -> None:
    """A checkpoint point (or the end): the next segment begins."""
    self.segment += 1
    if self.next_checkpoint is not None:
      self.next_checkpoint = next_point(self.next_checkpoint, checkpoint_every, self.env_steps)


@dataclasses.dataclass
class Accumulators:
  """One lane's numbers since its last log line, and its evaluation state."""

  episodes: int = 0
  return_sum: float = 0.0
  length_sum: float = 0.0
  metric_sums: dict = dataclasses.field(default_factory=dict)
  metric_count: int = 0
  discarded: int = 0
  lag_sum: float = 0.0
  lag_count: int = 0
  last_eval: Optional[float] = None
  best_eval: Optional[float] = None
  best_env_steps: Optional[int] = None
  reached_at: Optional[int] = None

  @property
  def reached(self) -> bool:
    return self.reached_at is not None

  def evaluated(self, mean: float, env_steps: int, target: Optional[float]) -> bool:
    """Records an evaluation's mean return; returns whether it is the best so far.

    Of equal means the latest is the best: at a return cap (CartPole's 500) many evaluations
    tie, and the latest of them is the policy that has held the cap longest. A NaN mean (a
    diverged policy) is never the best.
    """
    self.last_eval = mean
    if target is not None and mean >= target and self.reached_at is None:
      self.reached_at = env_steps
    if mean != mean or (self.best_eval is not None and mean < self.best_eval):
      return False
    self.best_eval, self.best_env_steps = mean, env_steps
    return True

  def add_episodes(self, count: int, return_sum: float, length_sum: float) -> None:
    self.episodes += int(count)
    self.return_sum += float(return_sum)
    self.length_sum += float(length_sum)

  def add_metrics(self, metrics: dict) -> None:
    for name, value in metrics.items():
      self.metric_sums[name] = self.metric_sums.get(name, 0.0) + float(value)
    self.metric_count += 1

  def add_lag(self, lag: float) -> None:
    self.lag_sum += lag
    self.lag_count += 1

  @property
  def pending(self) -> bool:
    """Whether anything was accumulated since the last line."""
    return bool(self.episodes or self.metric_count)

  def flush(self, env_steps: int, wall_time_s: float, steps_per_s: float, num_updates: int) -> dict:
    """A metrics line from the accumulators, which it then empties."""
    episodes = self.episodes
    record = {
        "env_steps": env_steps,
        "wall_time_s": wall_time_s,
        "episode_return": self.return_sum / episodes if episodes else None,
        "episode_length": self.length_sum / episodes if episodes else None,
        "episodes": episodes,
        "num_updates": num_updates,
        "env_steps_per_s": steps_per_s,
    }
    if self.metric_count:
      record.update({k: v / self.metric_count for k, v in self.metric_sums.items()})
    if self.lag_count or self.discarded:  # actor threads: trajectories dropped, and the
      record["dropped_trajectories"] = self.discarded  # lag of those used, if any were
    if self.lag_count:
      record["policy_lag"] = self.lag_sum / self.lag_count
    self.episodes, self.return_sum, self.length_sum = 0, 0.0, 0.0
    self.metric_sums, self.metric_count = {}, 0
    self.discarded, self.lag_sum, self.lag_count = 0, 0.0, 0
    return record


def to_record(kind: str, schedule: Schedule, lanes: list[Accumulators]) -> dict:
  """The JSON record of a checkpoint written by a `kind` program ("envpool", "compiled")."""
  return {
      "format": RECORD_FORMAT,
      "program": kind,
      "schedule": dataclasses.asdict(schedule),
      "lanes": [dataclasses.asdict(a) for a in lanes],
  }


def check_format(record: dict, where: str, kind: Optional[str] = None) -> None:
  """Refuses a checkpoint record of another format than `RECORD_FORMAT`, or (given
  `kind`) one written by another kind of program."""
  found = record.get("format", 1)
  if found != RECORD_FORMAT:
    raise ValueError(
        f"the checkpoint in {where} has record format {found}; this version of offpolicy_ac "
        f"reads format {RECORD_FORMAT} (format {found} runs resume with "
        f"{_READ_BY.get(found, 'another version')})"
    )
  if kind is not None and record.get("program") != kind:
    raise ValueError(
        f"the checkpoint in {where} is of {_KINDS.get(record.get('program'), 'another')} run, "
        f"not of {_KINDS[kind]} run"
    )


_KINDS = {"envpool": "an envpool", "compiled": "a compiled (JAX environment)"}


def from_record(record: dict, kind: str, num_lanes: int,
                where: str) -> tuple[Schedule, list[Accumulators]]:  # fmt: skip
  """The records of a checkpoint; refuses another format, another kind of program or
  another number of lanes."""
  check_format(record, where, kind)
  if len(record["lanes"]) != num_lanes:
    raise ValueError(
        f"the checkpoint in {where} holds {len(record['lanes'])} learners, the run {num_lanes}"
    )
  return Schedule(**record["schedule"]), [Accumulators(**a) for a in record["lanes"]]


def is_first_checkpoint(record: dict) -> bool:
  """Whether `record` is that of a run's first checkpoint (each checkpoint starts a new
  segment, and the run's first segment is 0)."""
  schedule = record.get("schedule")
  return isinstance(schedule, dict) and schedule.get("segment") == 1
