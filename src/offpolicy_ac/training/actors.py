"""Actor threads for the actor-learner workflows (IMPALA's; MARO's sync and async modes).

    actors = Actors(rollouts, keys, params, queue_size=4, gated=False)
    actors.publish(new_params, version)     # after each update; never blocks
    item = actors.get(timeout=0.1)          # ActorItem, or None if nothing came in time
    actors.close()                          # stops and joins every thread

Each actor owns one rollout (its own envpool pool, stepped with envpool's
send/recv) and loops: take the newest published parameters, unroll T steps with
the jitted `act`, push `ActorItem(actor_id, version, traj, stats)` into a
bounded queue. A full queue blocks the actor (back-pressure: memory stays
bounded when actors outrun the learner). Publishing swaps one reference under a
lock, so the learner never waits for the actors.

`gated=True` is the synchronous mode: an actor unrolls once per published
version (it waits for a newer version before its next unroll), so every
trajectory of an iteration comes from the same parameters.

Failure handling: an exception in an actor is kept with its traceback, and
`get` raises `ActorError` naming the actor (never a hang: `get` always returns
within its timeout). `close` sets the stop event, drains the queue so blocked
actors wake up, joins the threads (bounded wait) and closes the pools of the
actors that stopped.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
import traceback
from typing import Any
from typing import NamedTuple
from typing import Optional
from typing import Sequence
import warnings

import jax


class ActorError(RuntimeError):
  """An actor thread failed; the message names the actor and carries its traceback."""


class ActorItem(NamedTuple):
  """One unroll: `traj` [T+1, num_envs, ...] (host arrays), the parameter version
  that produced it, and the episodes that finished during it."""

  actor_id: int
  version: int
  traj: Any
  stats: Any


class ParamStore:
  """The newest parameters and their version (the learner's update count)."""

  def __init__(self, params: Any, version: int):
    self._cond = threading.Condition()
    self._params, self._version = params, version

  def publish(self, params: Any, version: int) -> None:
    with self._cond:
      self._params, self._version = params, version
      self._cond.notify_all()

  def latest(self) -> tuple[Any, int]:
    with self._cond:
      return self._params, self._version

  def wait_newer(self, version: int, stop: threading.Event) -> Optional[tuple[Any, int]]:
    """Waits for a version > `version`; None once `stop` is set."""
    with self._cond:
      while self._version <= version:
        if stop.is_set():
          return None
        self._cond.wait(0.05)
      return self._params, self._version


class Actors:
  """K actor threads over K rollouts (see the module docstring)."""

  def __init__(
      self,
      rollouts: Sequence[Any],
      keys: Sequence[jax.Array],
      params: Any,
      *,
      version: int = 0,
      queue_size: int = 2,
      gated: bool = False,
  ):
    if len(rollouts) != len(keys) or not rollouts:
      raise ValueError("one key per rollout, and at least one rollout")
    if queue_size < 1:
      raise ValueError(f"queue_size must be >= 1, got {queue_size}")
    self.rollouts = list(rollouts)
    self.num_actors = len(self.rollouts)
    self._store = ParamStore(params, version)
    self._queue: queue.Queue = queue.Queue(maxsize=queue_size)
    self._stop = threading.Event()
    self._errors: list[tuple[int, str]] = []
    self._gated = gated
    self._join_timeout_s = 60.0  # how long `close` waits for the threads
    self.unrolls = [0] * self.num_actors
    self._threads = [
        threading.Thread(target=self._run, args=(i, key), name=f"actor-{i}", daemon=True)
        for i, key in enumerate(keys)
    ]
    for t in self._threads:
      t.start()

  # -- actor side ------------------------------------------------------------

  def _run(self, actor_id: int, key: jax.Array) -> None:
    try:
      rollout = self.rollouts[actor_id]
      state = version = None
      while not self._stop.is_set():
        if self._gated:
          got = self._store.wait_newer(-1 if version is None else version, self._stop)
          if got is None:
            return
          params, version = got
        else:
          params, version = self._store.latest()
        if state is None:  # the compiled rollout takes its first action in init
          state = rollout.init(params, key)
        state, traj, stats = rollout.unroll(params, state)
        self.unrolls[actor_id] += 1
        item = ActorItem(actor_id, version, traj, stats)
        while not self._stop.is_set():
          with contextlib.suppress(queue.Full):
            self._queue.put(item, timeout=0.05)
            break
    except BaseException:  # pylint: disable=broad-except
      self._errors.append((actor_id, traceback.format_exc()))

  # -- learner side ----------------------------------------------------------

  def publish(self, params: Any, version: int) -> None:
    """Makes `params` the actors' next parameters (non-blocking)."""
    self._store.publish(params, version)

  def check(self) -> None:
    """Raises ActorError if an actor failed."""
    if self._errors:
      actor_id, tb = self._errors[0]
      raise ActorError(f"actor {actor_id} failed; the run stops. Its error:\n{tb}")

  def get(self, timeout: float = 0.1) -> Optional[ActorItem]:
    """The next trajectory, or None if none arrived within `timeout` seconds."""
    self.check()
    try:
      return self._queue.get(timeout=timeout)
    except queue.Empty:
      self.check()
      if not any(t.is_alive() for t in self._threads) and not self._stop.is_set():
        raise ActorError("every actor thread has stopped")
      return None

  def close(self) -> None:
    """Stops every actor, then closes the pools of those that stopped."""
    self._stop.set()
    deadline = time.monotonic() + self._join_timeout_s
    for t in self._threads:
      while t.is_alive() and time.monotonic() < deadline:
        with contextlib.suppress(queue.Empty):  # wake actors blocked on a full queue
          while True:
            self._queue.get_nowait()
        t.join(timeout=0.05)
    for rollout, t in zip(self.rollouts, self._threads):
      if t.is_alive():
        warnings.warn(
            f"{t.name} did not stop within {self._join_timeout_s} s; its "
            "environment pool is left open",
            RuntimeWarning,
        )
      else:
        rollout.env.close()
