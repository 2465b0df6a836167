"""The compiled program: every lane of a run on a JAX environment (gymnax, brax) as one
vmapped program (`training.make_train`), for `training/driver.py` to drive.

The lanes (seeds, or a sweep's settings x seeds) are one `jax.vmap` over
`CompiledTrain.run`, whose state holds the environments too: a checkpoint is the whole
run, so a resumed run computes exactly what the uninterrupted run computes, with no
segments. The host steps the program chunk by chunk (at most `iterations_per_chunk`
iterations a call) up to the driver's next point, and evaluates with
`CompiledTrain.evaluate` between chunks.

Both programs (the chunk and the evaluation) are traced at once and compiled on a
background thread while the host runs `init` and creates the checkpointer and the
loggers. `--compile-for startup` compiles them with `startup_compile_options()`
(options on a CPU only).
"""

from __future__ import annotations

import threading
from typing import Any
from typing import Callable
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from offpolicy_ac import _memory
from offpolicy_ac.training.compiled_train import CompiledTrain
from offpolicy_ac.training.driver import NonFiniteError
from offpolicy_ac.training.driver import Progress
from offpolicy_ac.training.driver import Update
from offpolicy_ac.training.learner import Learner
from offpolicy_ac.training.learner import add_lane_axis
from offpolicy_ac.training.learner import check_replay_fits
from offpolicy_ac.training.learner import run_once
from offpolicy_ac.training.learner import startup_compile_options
from offpolicy_ac.training.learner import take_lane
from offpolicy_ac.training.learner import trace_init_lanes
from offpolicy_ac.training.sweeps import lane_names
from offpolicy_ac.training.sweeps import stack_hyperparams

# Keys of a chunk's metrics that are bookkeeping, not learner statistics.
BOOKKEEPING = ("active", "env_steps", "episodes", "episode_return_sum", "episode_length_sum",
               "updated", "num_updates", "data_finite", "actions_valid")  # fmt: skip


def _one_lane(fn: Callable) -> Callable:
  """`fn(state, hp, *rest)` of one lane as a function of states with a lane axis of 1."""
  return lambda state, hp, *rest: add_lane_axis(fn(take_lane(state, 0), take_lane(hp, 0), *rest))


class CompiledProgram:
  """The lanes of a compiled run (see the module docstring); a `driver.Program`."""

  kind = "compiled"
  checkpoint_at_stop = True  # the state is the whole run

  def __init__(self, compiled: CompiledTrain, seeds: list[int], settings: list[dict]):
    """Traces the programs and starts compiling them in the background.

    Args:
      compiled: `make_train`'s functions for the run's config.
      seeds: each lane's seed.
      settings: each lane's hyper-parameters over the defaults ({}: the defaults).
    """
    self.compiled, self.num_lanes = compiled, len(seeds)
    self.lane_names = lane_names(list(zip(settings, seeds)))
    self._hps = stack_hyperparams(compiled.hyperparams, settings)
    self._keys = jnp.stack([jax.random.PRNGKey(seed) for seed in seeds])
    startup = compiled.config.budget.compile_for == "startup"
    self._options = startup_compile_options() if startup else {}
    self._init = trace_init_lanes(compiled.init, self._keys, self._hps)
    # A chunk's state is donated: its buffers (a replay buffer's too) become the new
    # state's, instead of the run holding two copies while a chunk runs.
    if self.num_lanes == 1:
      run = jax.jit(_one_lane(compiled.run), donate_argnums=0)
      evaluate = jax.jit(_one_lane(compiled.evaluate))
    else:
      run = jax.jit(jax.vmap(compiled.run, in_axes=(0, 0, None)), donate_argnums=0)
      evaluate = jax.jit(jax.vmap(compiled.evaluate))
    states = self._init.out_info
    self._replays = states.learner.replay is not None
    if self._replays:  # each lane's buffer, then the lanes'
      data = states.learner.replay.data
      one = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype), data)
      check_replay_fits(one, self.num_lanes, compiled.config.replay)
    self._check_fits(_nbytes(states), "the run's state needs", "")
    active = jax.ShapeDtypeStruct((), jnp.int32)
    lowered = [run.trace(states, self._hps, active).lower()]
    if compiled.config.eval_interval:  # (--eval-every 0: no evaluation to compile)
      lowered.append(evaluate.trace(states, self._hps).lower())
    self._programs, self._error, self._checked = None, None, False
    # Not a daemon: a run that fails before it waits for the programs (a refused run
    # directory) leaves the compilation running, and a daemon thread still in XLA when the
    # interpreter exits aborts the process (SIGABRT); the exit waits for it instead.
    self._thread = threading.Thread(target=self._compile, args=(lowered,), daemon=False,
                                    name="compile-chunk")  # fmt: skip
    self._thread.start()

  def _compile(self, lowered: list) -> None:
    try:
      self._programs = [program.compile(self._options) for program in lowered]
    except BaseException as e:  # raised on the main thread by `_compiled`
      self._error = e

  def _compiled(self, should_stop: Callable[[], bool] = lambda: False) -> Optional[list]:
    """[run, evaluate] ([run] without evaluations), once compiled (an error compiling them
    is raised here), each refused (`_memory.DoesNotFit`) where the memory it allocates as
    it runs (its outputs and temporaries, by XLA's analysis) is more than is free; None
    where `should_stop` said so before they were compiled."""
    if not Learner.finished(self._thread, should_stop):
      return None
    if self._error is not None:
      raise self._error
    for program, what in zip(self._programs, ("a chunk of training", "an evaluation")):
      need = None if self._checked else _memory.program_bytes(program)
      if need is not None:  # (backends without the analysis: not checked)
        self._check_fits(need, f"{what} needs", "besides the run's state: ")
    self._checked = True
    return self._programs

  def _check_fits(self, need: int, what: str, besides: str) -> None:
    """Refuses `need` bytes where the default device has less free, naming the settings
    that size it: the environments' steps, replayed mini-batches and the networks."""
    config, lanes = self.compiled.config, self.num_lanes
    replay = config.replay
    batches = (f"; mini-batches of mini_batch_size {replay.mini_batch_size:,} x "
               f"mini_batch_length {replay.mini_batch_length} steps") * self._replays  # fmt: skip
    _memory.check_device_fits(
        need, what=what,
        details=f"{besides}num_envs {config.env.num_envs:,} environments x unroll_length "
                f"{config.env.unroll_length} steps{batches}; the networks"
                + f"; x {lanes} lanes" * (lanes > 1),
        hint="lower num_envs or unroll_length" + ", mini_batch_size" * self._replays
             + ", or the networks' hidden_sizes" + "; or train fewer seeds or sweep settings "
             "in one run" * (lanes > 1),
    )  # fmt: skip

  # -- state and checkpoints ---------------------------------------------------

  def init(self) -> Any:
    return run_once(self._init, self._keys, self._hps)

  def checkpoint_arrays(self, state: Any) -> dict:
    return {"state": state}

  def from_checkpoint(self, state: Any, arrays: dict) -> Any:
    return jax.tree.map(lambda like, x: jnp.asarray(x, like.dtype), state, arrays["state"])

  def agree_on_restore(self, env_steps: int) -> None:
    del env_steps  # one process

  def num_updates(self, state: Any) -> np.ndarray:
    return np.asarray(jax.device_get(state.learner.agent.num_updates))

  def final(self, state: Any, lane: int) -> tuple[Any, Any]:
    # Only these two: taking the lane of the whole learner state copied its replay buffer
    # (twice the run's memory at the end, and at each best evaluation).
    return take_lane((state.learner.agent, state.learner.transform), lane)

  def open(self, state: Any, segment: int) -> None:
    del state, segment  # the environments are part of the state

  def close(self) -> None:
    pass

  # -- training ----------------------------------------------------------------

  def advance(self, state: Any, env_steps: int, until: int, cut_at: int,
              should_stop: Callable[[], bool]) -> tuple[Any, Progress]:  # fmt: skip
    del cut_at  # no segments
    programs = self._compiled(should_stop)  # None: stopped while compiling
    per_chunk, spi = self.compiled.iterations_per_chunk, self.compiled.steps_per_iteration
    needed = -(-(until - env_steps) // spi) if programs else 0
    episodes = np.zeros((self.num_lanes, 3), np.float64)
    updates, taken, stopped = [], 0, programs is None
    while needed > 0:
      if should_stop():
        stopped = True
        break
      active = min(per_chunk, needed)
      state, metrics = programs[0](state, self._hps, jnp.asarray(active, jnp.int32))
      m = {name: np.asarray(v)[:, :active] for name, v in jax.device_get(metrics).items()}
      if not m["data_finite"].all():
        k, i = np.argwhere(~m["data_finite"])[0]
        raise NonFiniteError(
            f"non-finite rewards or observations from {self.compiled.config.env.env_id}"
            f"{self.lane_names[k]} at env step {env_steps + taken + (i + 1) * spi}; stopping. "
            "The last checkpoint is kept."
        )
      if not m["actions_valid"].all():
        k, i = np.argwhere(~m["actions_valid"])[0]
        spec, name = self.compiled.env.spec, self.compiled.agent_at(self.compiled.hyperparams).name
        expected = f"in [0, {spec.num_actions})" if spec.is_discrete else "finite"
        raise ValueError(
            f"{name}'s policy produced an action that is not {expected} on "
            f"{spec.task_id}{self.lane_names[k]} before env step "
            f"{env_steps + taken + (i + 1) * spi} (the environment clips it; the trajectory "
            "keeps it as produced): does its network have the task's number of actions? "
            "Stopping; the last checkpoint is kept."
        )
      episodes += np.stack([m["episodes"].sum(1), m["episode_return_sum"].sum(1, np.float64),
                            m["episode_length_sum"].sum(1, np.float64)], axis=1)  # fmt: skip
      stats = [name for name in m if name not in BOOKKEEPING]
      for i in range(active):
        lanes = [
            {name: m[name][k, i] for name in stats} if m["updated"][k, i] else None
            for k in range(self.num_lanes)
        ]  # fmt: skip
        updates.append(Update(env_steps + taken + (i + 1) * spi, m["num_updates"][:, i], lanes))
      taken += active * spi
      needed -= active
    lanes = [(int(e[0]), float(e[1]), float(e[2])) for e in episodes]
    return state, Progress(taken, stopped, lanes, updates)

  def evaluate(self, state: Any, should_stop: Callable[[], bool]) -> list[tuple[float, float]]:
    """Each lane's (mean, min) greedy return, computed in float32 in the program, as the
    decimals float32 held (`_float32_mean`); one call, which `should_stop` does not cut."""
    del should_stop
    programs = self._compiled()
    if len(programs) < 2:
      raise ValueError("this run evaluates nothing (eval_every 0): no evaluation program")
    means, lows = jax.device_get(programs[1](state, self._hps))
    n = self.compiled.config.eval.eval_episodes
    return [(_float32_mean(a, n), float(str(np.float32(b))))
            for a, b in zip(np.ravel(means), np.ravel(lows))]  # fmt: skip


def _nbytes(tree: Any) -> int:
  """Bytes of a tree of arrays or `jax.ShapeDtypeStruct`s."""
  return sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))


def _float32_mean(mean: np.float32, n: int) -> float:
  """A float32 mean of `n` returns as the decimal it stands for: k / n where it lies within
  a float32 step of that fraction (a mean of integer returns, 47 / 5 = 9.4, which XLA's
  float32 division gives as 9.400001), else its shortest decimal (425.2, not
  425.20001220703125). Neither moves it by more than float32's own rounding."""
  mean = np.float32(mean)
  if not np.isfinite(mean):
    return float(mean)
  fraction = round(float(mean) * n) / n
  if abs(float(mean) - fraction) <= float(np.spacing(np.abs(mean))):
    return fraction
  return float(str(mean))
