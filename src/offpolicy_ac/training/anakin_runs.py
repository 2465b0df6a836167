"""Compiled (Anakin) runs from the experiment scripts: run directories, logs, checkpoints,
resume and sweeps around `training.make_train`.

`run_experiment` comes here when `--env-id` names a JAX environment ("gymnax:...",
"brax:..."). Every learner of the run, one per (setting of `--sweep`, seed), is one lane
of a single vmapped program; the host only steps it chunk by chunk (a chunk is one log
line's worth of iterations) and, between chunks, writes each learner's metrics line,
checkpoints the whole state and checks the stop signals and the target return.

Run directories: one learner logs in `--run-dir` itself; several seeds in
`<run-dir>/seed<k>`; a sweep in `<run-dir>/<field>=<value>,.../seed<k>` (the lanes and
their directories: `training/sweeps.py`, shared with envpool sweeps). Each holds what
an envpool run's directory holds (config.json with that learner's own settings,
metrics.jsonl, TensorBoard, learning_curve.png, final parameters, summary.json), so
`load_run`, `evaluate.py` and `plot.py` read them alike. `<run-dir>` holds the whole
config, the checkpoints of every learner together, and the comparison plots.

Exact resume: the state is a pytree that holds the environments, so a checkpoint is the
whole run and a resumed run computes exactly what the uninterrupted run computes.
"""

from __future__ import annotations

import dataclasses
import pathlib
import threading
from typing import Any
from typing import Callable
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from offpolicy_ac.agents.registry import AGENTS
from offpolicy_ac.training import records
from offpolicy_ac.training import sweeps
from offpolicy_ac.training.anakin import make_train
from offpolicy_ac.training.clock import seconds_since_launch
from offpolicy_ac.training.config import TrainConfig
from offpolicy_ac.training.evaluation import describe_protocol
from offpolicy_ac.training.learner import _expand
from offpolicy_ac.training.learner import _index
from offpolicy_ac.training.learner import run_once
from offpolicy_ac.training.learner import startup_compile_options
from offpolicy_ac.training.learner import trace_init_lanes
from offpolicy_ac.training.loop import RunResult
from offpolicy_ac.training.loop import raise_if_non_finite
from offpolicy_ac.training.resume import restore_newest

# Keys of a chunk's metrics that are bookkeeping, not learner statistics.
_BOOKKEEPING = ("active", "env_steps", "episodes", "episode_return_sum", "episode_length_sum",
                "updated", "num_updates", "eval_return", "eval_return_min")  # fmt: skip


def run_compiled(name: str, args: Any, root: pathlib.Path, *, batch_fn: Optional[Callable],
                 progress: Optional[bool]) -> list[RunResult]:  # fmt: skip
  """Trains every learner of `args` in one compiled program; see the module docstring."""
  from offpolicy_ac.training import experiment as ex  # the scripts' shared plumbing

  config: TrainConfig = args.train
  resume = bool(getattr(args, "resume", False))
  if name not in AGENTS:
    raise ValueError(f"a compiled run needs a known algorithm, one of {sorted(AGENTS)}; "
                     f"got {name!r}")  # fmt: skip
  lanes = sweeps.lanes_of(args, root)  # validates the sweep
  compiled = make_train(AGENTS[name][0], args.agent, config, batch_fn=batch_fn)
  ex._prepare_process(config)  # pylint: disable=protected-access
  single = len(lanes) == 1
  others = [] if single else [lane.run_dir for lane in lanes]
  ex._check_or_write_config(name, args, root, resume, others=others)  # pylint: disable=protected-access
  sweeps.write_lane_configs(name, args, root, lanes)
  # The evaluations fall on chunk ends: the interval the protocol states is theirs.
  interval = compiled.chunks_per_eval * compiled.iterations_per_chunk
  protocol = describe_protocol(config.replace(eval_every=interval * compiled.steps_per_iteration))
  print(f"[{name}] evaluation protocol: {protocol}", flush=True)
  if not single:
    print(f"[{name}] {len(lanes)} learners in one compiled program", flush=True)
  hps = sweeps.stack_hyperparams(compiled.hyperparams, [lane.setting for lane in lanes])
  keys = jnp.stack([jax.random.PRNGKey(lane.seed) for lane in lanes])
  programs = _Programs(compiled, keys, hps)  # the chunk compiles while the host sets up
  checkpointer = ex._make_checkpointer(config, root)  # pylint: disable=protected-access
  loggers = [
      ex._make_logger(name, config, lane.seed, lane.run_dir,  # pylint: disable=protected-access
                      progress=progress if k == 0 else False,
                      group=None if single else root.name, label=lane.label)
      for k, lane in enumerate(lanes)
  ]  # fmt: skip
  flag = ex._StopFlag()  # pylint: disable=protected-access
  try:
    with ex._stop_on_signals(flag):  # pylint: disable=protected-access
      state, driver = _drive(compiled, programs, hps, loggers, checkpointer, resume, flag)
  finally:
    for logger in loggers:
      logger.close()
    if checkpointer is not None:
      checkpointer.close()
  results = []
  for k, lane in enumerate(lanes):
    lane_state = jax.tree.map(lambda x: x[k], state)
    result = RunResult(
        env_steps=driver.env_steps, num_updates=int(lane_state.learner.agent.num_updates),
        wall_time_s=driver.wall_time_s, reached_target=bool(driver.reached[k]),
        last_eval_return=driver.last_eval[k], interrupted=driver.interrupted,
        agent_state=lane_state.learner.agent, transform_state=lane_state.learner.transform,
    )  # fmt: skip
    ex._finish(name, lane.run_dir, result, flag, protocol)  # pylint: disable=protected-access
    results.append(result)
  if not single:
    sweeps.plot_lanes(name, config, root, lanes, "vmapped, compiled")
  return results


@dataclasses.dataclass
class _Driver:
  """The host's bookkeeping between chunks (goes into every checkpoint's record)."""

  chunk: int = 0
  env_steps: int = 0
  log_lines: int = 0
  wall_time_s: float = 0.0
  last_eval: list = dataclasses.field(default_factory=list)
  reached: list = dataclasses.field(default_factory=list)
  interrupted: bool = False

  def record(self) -> dict:
    fields = dataclasses.asdict(self)
    fields.pop("interrupted")
    return {"format": records.RECORD_FORMAT, "compiled": fields}


class _Programs:
  """The run's two programs, traced at once; the chunk compiles on a background thread.

  Tracing `init` gives the state's shapes, so the chunk program (`compiled.run` over every
  lane: vmapped, or for one lane the plain program with a lane axis of 1 around it) is
  traced and lowered next, and XLA compiles it (without the GIL) while the host compiles
  and runs `init` and creates the checkpointer and the loggers. `--compile-for startup`
  compiles it with `startup_compile_options()` (options on a CPU only).
  """

  def __init__(self, compiled: Any, keys: jax.Array, hps: dict):
    self._keys, self._hps = keys, hps
    startup = compiled.config.budget.compile_for == "startup"
    self._options = startup_compile_options() if startup else {}
    self._init = trace_init_lanes(compiled.init, keys, hps)
    if keys.shape[0] == 1:
      run = jax.jit(lambda state, hps, *flags: _expand(
          compiled.run(_index(state, 0), _index(hps, 0), *flags)))  # fmt: skip
    else:
      run = jax.jit(jax.vmap(compiled.run, in_axes=(0, 0, None, None)))
    flags = (jax.ShapeDtypeStruct((), jnp.int32), jax.ShapeDtypeStruct((), jnp.bool_))
    lowered = run.trace(self._init.out_info, hps, *flags).lower()
    self._run, self._error = None, None
    self._thread = threading.Thread(target=self._compile, args=(lowered,), daemon=True,
                                    name="compile-chunk")  # fmt: skip
    self._thread.start()

  def _compile(self, lowered: Any) -> None:
    try:
      self._run = lowered.compile(self._options)
    except BaseException as e:  # raised on the main thread by `run`
      self._error = e

  def init(self) -> Any:
    """Every lane's initial state [N, ...]."""
    return run_once(self._init, self._keys, self._hps)

  def run(self) -> Callable:
    """The compiled chunk, `run(state, hps, num_active, evaluate_last) -> (state, metrics)`
    (waits for the compilation to finish)."""
    self._thread.join()
    if self._error is not None:
      raise self._error
    return self._run


def _drive(compiled: Any, programs: _Programs, hps: dict, loggers: list, checkpointer: Any,
           resume: bool, should_stop: Callable[[], bool]) -> tuple[Any, _Driver]:  # fmt: skip
  """Runs the chunks: log, evaluate, checkpoint, stop; returns the final state [N]."""
  config = compiled.config
  num = len(loggers)
  state = programs.init()
  driver = _Driver(last_eval=[None] * num, reached=[False] * num)
  if resume:
    state, driver = _restore(checkpointer, state, driver, loggers)
  per_chunk, total = compiled.iterations_per_chunk, compiled.iterations
  ckpt_every = config.checkpoint.checkpoint_every
  chunk_steps = per_chunk * compiled.steps_per_iteration
  chunks_per_ckpt = max(1, round(ckpt_every / chunk_steps)) if ckpt_every else 0
  target = config.eval.target_return
  wall_offset = driver.wall_time_s - seconds_since_launch()
  last = (seconds_since_launch(), driver.env_steps)
  done = int(np.max(jax.device_get(state.iteration)))  # a resumed run's iterations
  run = programs.run()
  while done < total and not all(driver.reached):
    if should_stop():
      driver.interrupted = True
      break
    active = min(per_chunk, total - done)
    done += active
    end = done == total
    evaluate = bool(compiled.chunks_per_eval) and (
        (driver.chunk + 1) % compiled.chunks_per_eval == 0 or end
    )
    state, metrics = run(state, hps, jnp.asarray(active, jnp.int32), jnp.asarray(evaluate))
    metrics = jax.device_get(metrics)
    driver.chunk += 1
    driver.env_steps = int(np.max(metrics["env_steps"][:, active - 1]))
    now = seconds_since_launch()
    rate = (driver.env_steps - last[1]) / max(now - last[0], 1e-9)
    last = (now, driver.env_steps)
    driver.wall_time_s = wall_offset + now
    for k, logger in enumerate(loggers):
      line = _line({n: v[k, :active] for n, v in metrics.items()}, driver, rate)
      if "eval_return" in line:
        driver.last_eval[k] = line["eval_return"]
        reached = target is not None and line["eval_return"] >= target
        driver.reached[k] = driver.reached[k] or reached
      logger.log(line)
    driver.log_lines += 1
    end = end or all(driver.reached)
    if checkpointer is not None and (
        end or (chunks_per_ckpt and driver.chunk % chunks_per_ckpt == 0)
    ):
      checkpointer.save(driver.env_steps, {"state": state}, driver.record())
  if driver.interrupted and checkpointer is not None:
    driver.wall_time_s = wall_offset + seconds_since_launch()
    checkpointer.save(driver.env_steps, {"state": state}, driver.record())
  return state, driver


def _line(m: dict, driver: _Driver, rate: float) -> dict:
  """One learner's metrics line from its chunk's per-iteration metrics [active]."""
  episodes = int(m["episodes"].sum())
  line = {
      "env_steps": driver.env_steps,
      "wall_time_s": driver.wall_time_s,
      "episode_return": float(m["episode_return_sum"].sum() / episodes) if episodes else None,
      "episode_length": float(m["episode_length_sum"].sum() / episodes) if episodes else None,
      "episodes": episodes,
      "num_updates": int(m["num_updates"][-1]),
      "env_steps_per_s": rate,
  }
  updated = m["updated"].astype(bool)
  if updated.any():
    stats = {n: float(np.mean(v[updated])) for n, v in m.items() if n not in _BOOKKEEPING}
    raise_if_non_finite(stats, f" at env step {driver.env_steps}; stopping. The last good "
                        "checkpoint is kept.")  # fmt: skip
    line.update(stats)
  if not np.isnan(m["eval_return"][-1]):
    line["eval_return"] = float(m["eval_return"][-1])
    line["eval_return_min"] = float(m["eval_return_min"][-1])
  return line


def _restore(checkpointer: Any, state: Any, driver: _Driver, loggers: list) -> tuple[Any, _Driver]:
  """The newest checkpoint's state and bookkeeping (the logs cut back to it), or the fresh
  ones, with a warning, when there is none."""
  where = str(getattr(checkpointer, "directory", ""))

  def check(record: dict) -> None:
    records.check_format(record, where)
    if "compiled" not in record:
      raise ValueError(f"the checkpoint in {where} is not of a compiled (JAX environment) run")

  restored = restore_newest(checkpointer, {"state": state}, check)
  if restored is not None:
    arrays, record = restored
    state = jax.tree.map(lambda like, x: jnp.asarray(x, like.dtype), state, arrays["state"])
    driver = _Driver(**record["compiled"])
  for logger in loggers:
    logger.truncate(driver.log_lines)
  return state, driver
