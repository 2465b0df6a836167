"""Shared plumbing of the experiment scripts (one piece of library code, not copied).

`run_experiment(name, args, agent_factory)` takes a script's frozen args
(fields `loop: LoopConfig`, `agent: <agent config>`, `run_dir`, `resume`) and:

* creates the run directory (refusing to overwrite a run unless `resume`),
  writes config.json (full config, git revision, package versions);
* on `resume`, refuses a config that differs from the run's in anything but the
  step budget, and continues from the newest readable checkpoint;
* installs SIGTERM/SIGINT handlers that save a checkpoint and stop cleanly;
* trains, logging to metrics.jsonl / TensorBoard / a PNG, checkpointing with
  orbax every `checkpoint_every` env steps and at the end;
* writes final_params.msgpack and summary.json;
* `--num-seeds N`: N seeds with one vmapped learner (or one after the other);
* multi-host (`--num-processes`): joins the jax.distributed job first.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pathlib
import signal
import sys
import threading
import time
from typing import Any
from typing import Callable
from typing import Optional
from typing import Sequence

import flax.serialization
import jax

from offpolicy_ac.training.logger import RunLogger
from offpolicy_ac.training.logger import _jsonable
from offpolicy_ac.training.logger import write_config
from offpolicy_ac.training.loop import LoopConfig
from offpolicy_ac.training.loop import RunResult
from offpolicy_ac.training.loop import train
from offpolicy_ac.training.parallel import ensure_cpu_devices
from offpolicy_ac.training.parallel import initialize_distributed

# Config fields that may change when a run is resumed.
RESUMABLE_CHANGES = ("loop.total_env_steps", "loop.coordinator_address", "resume", "run_dir")


def save_params(path: pathlib.Path, params: Any) -> None:
  """Writes parameters (flax msgpack) atomically."""
  tmp = path.with_suffix(".tmp")
  tmp.write_bytes(flax.serialization.to_bytes(jax.device_get(params)))
  os.replace(tmp, path)


def load_params(path: str | os.PathLike, template: Any) -> Any:
  """Reads parameters written by `save_params` into the structure of `template`."""
  return flax.serialization.from_bytes(template, pathlib.Path(path).read_bytes())


def default_run_dir(name: str, loop: LoopConfig) -> str:
  stamp = time.strftime("%Y%m%d-%H%M%S")
  return os.path.join("runs", f"{name}-{loop.env_id}-seed{loop.seed}-{stamp}")


def _flatten(d: Any, prefix: str = "") -> dict:
  if isinstance(d, dict):
    out = {}
    for k, v in d.items():
      out.update(_flatten(v, f"{prefix}{k}."))
    return out
  return {prefix[:-1]: d}


def config_differences(old: dict, new: dict) -> list[str]:
  """Fields (dotted) whose values differ, ignoring RESUMABLE_CHANGES."""
  a, b = _flatten(old), _flatten(new)
  return sorted(k for k in set(a) | set(b) if k not in RESUMABLE_CHANGES and a.get(k) != b.get(k))


class _StopFlag:
  """Set by SIGTERM/SIGINT; the loop saves a checkpoint and returns."""

  def __init__(self):
    self.signal_name: Optional[str] = None

  def __call__(self) -> bool:
    return self.signal_name is not None


@contextlib.contextmanager
def _stop_on_signals(flag: _StopFlag):
  if threading.current_thread() is not threading.main_thread():
    yield
    return
  previous = {}

  def handler(signum, frame):
    if flag.signal_name is not None:  # a second signal: stop now
      raise KeyboardInterrupt
    flag.signal_name = signal.Signals(signum).name
    print(f"received {flag.signal_name}: saving a checkpoint and stopping", flush=True)

  for sig in (signal.SIGTERM, signal.SIGINT):
    previous[sig] = signal.signal(sig, handler)
  try:
    yield
  finally:
    for sig, old in previous.items():
      signal.signal(sig, old)


def _run_seeds(name: str, args: Any, agent_factory: Callable, **kwargs) -> list[RunResult]:
  """`--num-seeds N` where a vmapped learner cannot serve (or `--no-vmap-seeds`):
  seeds seed..seed+N-1 one after the other, each a complete run
  (own env pools, checkpoints, logs) in <run_dir>/seed<k>; then a plot of their mean
  and spread in <run_dir>/learning_curves.png. `--resume` resumes each."""
  from offpolicy_ac.training.plotting import plot_runs

  loop = args.loop
  root = pathlib.Path(args.run_dir or default_run_dir(name, loop))
  results, dirs = [], []
  for k in range(loop.num_seeds):
    seed = loop.seed + k
    run_dir = root / f"seed{seed}"
    seed_args = dataclasses.replace(
        args, loop=dataclasses.replace(loop, seed=seed, num_seeds=1), run_dir=str(run_dir)
    )
    results.append(run_experiment(name, seed_args, agent_factory, **kwargs))
    dirs.append(run_dir)
  plot_runs(
      dirs,
      root / "learning_curves.png",
      group=True,
      title=f"{name} {loop.env_id}, {loop.num_seeds} seeds",
  )
  return results


def _holds_run(run_dir: pathlib.Path) -> bool:
  """Whether a run logged or checkpointed anything there (a run refused before its
  first step leaves only config.json and an empty metrics.jsonl: not a run)."""
  metrics = run_dir / "metrics.jsonl"
  checkpoints = run_dir / "checkpoints"
  return (metrics.exists() and metrics.stat().st_size > 0) or (
      checkpoints.exists() and any(checkpoints.iterdir())
  )


def _check_or_write_config(
    name: str, args: Any, run_dir: pathlib.Path, resume: bool, others: Sequence[pathlib.Path] = ()
) -> None:
  """On resume, refuses a changed config; otherwise refuses to overwrite a run (in
  `run_dir` or any of `others`). Then writes config.json."""
  config_path = run_dir / "config.json"
  if resume:
    if not config_path.exists():
      raise FileNotFoundError(f"--resume: {run_dir} holds no run (no config.json)")
    old = json.loads(config_path.read_text())
    diffs = config_differences(old["config"], _jsonable(args))
    if old.get("algorithm") != name:
      diffs.insert(0, f"algorithm ({old.get('algorithm')} -> {name})")
    if diffs:
      raise ValueError(
          f"--resume: the config differs from the run's in {diffs}; only the "
          "step budget (--total-env-steps) may change"
      )
  else:
    for d in (run_dir, *others):
      if _holds_run(d):
        raise FileExistsError(
            f"{d} already holds a run: pass --resume to continue it, " "or choose another --run-dir"
        )
  run_dir.mkdir(parents=True, exist_ok=True)
  write_config(run_dir, args, extra={"algorithm": name})


def _prepare_process(loop: LoopConfig) -> None:
  """Process-wide settings, before any JAX computation."""
  # Join the multi-host job, and on CPU create the host devices the learner needs.
  initialize_distributed(loop.num_processes, loop.process_id, loop.coordinator_address)
  ensure_cpu_devices(loop.learner_devices)


def _after_backend_start(loop: LoopConfig) -> None:
  if jax.default_backend() == "cpu":
    # The actors call a tiny jitted policy once per step; synchronous CPU dispatch
    # cuts that call from ~90 us to ~15 us (docs/envs_notes.md). The loop syncs on
    # every update anyway, so nothing is lost. Process-wide: set by the script's
    # runner, never by the library's modules.
    jax.config.update("jax_cpu_enable_async_dispatch", False)
  # Nothing is imported in a background thread: matplotlib's ft2font runs Python code in
  # its C++ static initializer, i.e. inside dlopen, holding the dynamic loader's lock; if
  # that code gives up the GIL while the main thread imports another extension module
  # (envpool's optree), the two threads deadlock. A run once hung that way (py-spy/gdb).


def _make_checkpointer(loop: LoopConfig, root: pathlib.Path) -> Any:
  """<root>/checkpoints (None without checkpoints); multi-host: only process 0 writes."""
  if not loop.checkpoint_every:
    return None
  from offpolicy_ac.training.checkpoint import Checkpointer

  return Checkpointer(
      root / "checkpoints", max_to_keep=loop.keep_checkpoints, read_only=loop.process_id > 0
  )


def exit_process(code: int = 0) -> None:
  """Ends a finished script's process at once: flushes stdout and stderr, runs the
  `atexit` handlers, then `os._exit(code)`.

  For the `__main__` block of a script whose `main` has returned: every file is closed
  and every checkpoint written by then. What it skips is the interpreter's own
  finalization (module teardown, the C++ destructors of envpool's and XLA's libraries),
  which took 0.6-0.9 s of a CartPole run's launch-to-stop time on this 2-core machine
  and does nothing a finished run needs. Never call it from library code or tests: it
  ends the calling process.
  """
  import atexit

  try:
    sys.stdout.flush()
    sys.stderr.flush()
    atexit._run_exitfuncs()  # pylint: disable=protected-access
    sys.stdout.flush()
    sys.stderr.flush()
  finally:
    os._exit(code)


def _finish(name: str, run_dir: pathlib.Path, result: RunResult, flag: "_StopFlag") -> None:
  save_params(run_dir / "final_params.msgpack", result.agent_state.params)
  summary = {k: v for k, v in dataclasses.asdict(result).items() if k != "agent_state"}
  summary["run_dir"] = str(run_dir)
  if flag.signal_name:
    summary["stopped_by"] = flag.signal_name
  (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
  print(f"[{name}] done: {summary}", flush=True)


def _run_seeds_vmapped(
    name: str,
    args: Any,
    agent_factory: Callable,
    *,
    batch_fn: Optional[Callable],
    progress: Optional[bool],
) -> list[RunResult]:
  """`--num-seeds N` with one vmapped learner (training/multi_seed.py): seed k logs
  in <run_dir>/seed<k> as a single run would; <run_dir> holds the whole config and
  the checkpoints of all seeds together."""
  from offpolicy_ac.training.multi_seed import train_seeds
  from offpolicy_ac.training.plotting import plot_runs

  loop = args.loop
  resume = bool(getattr(args, "resume", False))
  root = pathlib.Path(args.run_dir or default_run_dir(name, loop))
  seeds = [loop.seed + k for k in range(loop.num_seeds)]
  dirs = [root / f"seed{s}" for s in seeds]
  _prepare_process(loop)
  _check_or_write_config(name, args, root, resume, others=dirs)
  for s, d in zip(seeds, dirs):
    d.mkdir(parents=True, exist_ok=True)
    seed_args = dataclasses.replace(
        args, loop=dataclasses.replace(loop, seed=s, num_seeds=1), run_dir=str(d)
    )
    write_config(d, seed_args, extra={"algorithm": name, "vmapped_seeds_of": str(root)})
  _after_backend_start(loop)
  checkpointer = _make_checkpointer(loop, root)
  loggers = [
      RunLogger(
          d,
          total_env_steps=loop.total_env_steps,
          title=f"{name} {loop.env_id} seed {s}",
          progress=progress if k == 0 else False,
      )
      for k, (s, d) in enumerate(zip(seeds, dirs))
  ]
  flag = _StopFlag()
  try:
    with _stop_on_signals(flag):
      results = train_seeds(
          agent_factory,
          loop,
          loggers,
          batch_fn=batch_fn,
          checkpointer=checkpointer,
          resume=resume,
          should_stop=flag,
      )
  finally:
    for logger in loggers:
      logger.close()
    if checkpointer is not None:
      checkpointer.close()
  for d, result in zip(dirs, results):
    _finish(name, d, result, flag)
  plot_runs(
      dirs,
      root / "learning_curves.png",
      group=True,
      title=f"{name} {loop.env_id}, {loop.num_seeds} seeds (vmapped)",
  )
  return results


def run_experiment(
    name: str,
    args: Any,
    agent_factory: Callable,
    *,
    batch_fn: Optional[Callable] = None,
    progress: Optional[bool] = None,
) -> RunResult | list[RunResult]:
  """Runs `train` for a script's args; see the module docstring. With
  `--num-seeds N` > 1 it returns one RunResult per seed."""
  loop: LoopConfig = args.loop
  loop.validate()
  if loop.num_seeds > 1:
    from offpolicy_ac.training.multi_seed import vmap_unsupported_reason

    if loop.vmap_seeds and vmap_unsupported_reason(loop) is None:
      return _run_seeds_vmapped(name, args, agent_factory, batch_fn=batch_fn, progress=progress)
    return _run_seeds(name, args, agent_factory, batch_fn=batch_fn, progress=progress)
  resume = bool(getattr(args, "resume", False))
  _prepare_process(loop)
  run_dir = root_dir = pathlib.Path(args.run_dir or default_run_dir(name, loop))
  if loop.num_processes > 1 and loop.process_id > 0:
    # Multi-host: process 0's directory is the run's (and holds the checkpoints of
    # the replicated learner state); every other process logs its own actors'
    # episodes in a directory nested inside it and restores from process 0's.
    run_dir = root_dir / f"process{loop.process_id}"
  _check_or_write_config(name, args, run_dir, resume)
  _after_backend_start(loop)
  checkpointer = _make_checkpointer(loop, root_dir)
  logger = RunLogger(
      run_dir,
      total_env_steps=loop.total_env_steps,
      title=f"{name} {loop.env_id} seed {loop.seed}",
      progress=progress,
  )
  flag = _StopFlag()
  try:
    try:
      with _stop_on_signals(flag):
        result = train(
            agent_factory,
            loop,
            logger,
            batch_fn=batch_fn,
            checkpointer=checkpointer,
            resume=resume,
            should_stop=flag,
        )
    finally:
      logger.close()
      if checkpointer is not None:
        checkpointer.close()  # waits for a save in flight: the checkpoint stays whole
  except Exception as error:
    if loop.num_processes > 1:
      _abandon_distributed_job(name, loop, root_dir, error)
    raise
  _finish(name, run_dir, result, flag)
  return result


def _abandon_distributed_job(
    name: str, loop: LoopConfig, root_dir: pathlib.Path, error: Exception
) -> None:
  """Ends this process of a multi-process job after an error (exit code 1).

  Usually the error is a collective that failed because another process died (gloo:
  "Connection closed by peer"). Nothing can go on after that, and exiting normally
  would not end the process either: JAX's exit handler enters the distributed
  runtime's shutdown barrier, which waits for the dead process until the heartbeat
  timeout (100 s) and then aborts. So: report the error and where to resume from, and
  leave at once. The logs and the checkpointer are closed by then, so the last
  checkpoint is whole.
  """
  import traceback

  traceback.print_exception(error)
  print(
      f"[{name}] process {loop.process_id} of {loop.num_processes} stopped: "
      f"{type(error).__name__}: {error}\n[{name}] a multi-process job cannot go on "
      "once one of its processes has failed (a collective failing with 'Connection "
      "closed by peer' means another process died: see its log). The last checkpoint "
      f"in {root_dir / 'checkpoints'} is intact: start every process again with "
      "--resume.",
      file=sys.stderr,
      flush=True,
  )
  sys.stdout.flush()
  os._exit(1)
