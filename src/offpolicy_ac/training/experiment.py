"""Shared plumbing of the experiment scripts (one piece of library code, not copied).

`run_experiment(name, args, agent_factory)` takes a script's frozen args
(fields `train: TrainConfig`, `agent: <agent config>`, `run_dir`, `resume`) and:

* creates the run directory (refusing to overwrite a run unless `resume`),
  writes config.json (full config, git revision, package versions);
* on `resume`, refuses a config that differs from the run's in anything but the
  step budget, and continues from the newest readable checkpoint;
* installs SIGTERM/SIGINT handlers that save a checkpoint and stop cleanly;
* trains, logging to metrics.jsonl / TensorBoard / a PNG (and with `--track` to
  Weights & Biases, `logger.WandbLogger`), checkpointing with
  orbax every `checkpoint_every` env steps and at the end;
* writes final_params.msgpack and summary.json;
* `--num-seeds N`: N seeds with one vmapped learner (or one after the other);
* `--sweep FIELD=V1,V2,...`: one lane of the vmapped learner per (setting, seed), each
  logging in <run_dir>/<setting>/seed<k> (`training/sweeps.py`), plus a plot and a
  table that compare the settings;
* `--env-id gymnax:...` / `brax:...` (a JAX environment): the whole run is one compiled
  program (`training.make_train`), with `--sweep` over hyper-parameters
  (`training/anakin_runs.py`);
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

from offpolicy_ac.agents.registry import AGENTS
from offpolicy_ac.analysis.plotting import plot_runs
from offpolicy_ac.training import sweeps
from offpolicy_ac.training.config import TrainConfig
from offpolicy_ac.training.evaluation import describe_protocol
from offpolicy_ac.training.logger import Logger
from offpolicy_ac.training.logger import MultiLogger
from offpolicy_ac.training.logger import RunLogger
from offpolicy_ac.training.logger import WandbLogger
from offpolicy_ac.training.logger import jsonable
from offpolicy_ac.training.logger import require_wandb
from offpolicy_ac.training.logger import write_config
from offpolicy_ac.training.loop import RunResult
from offpolicy_ac.training.loop import train
from offpolicy_ac.training.parallel import ensure_cpu_devices
from offpolicy_ac.training.parallel import initialize_distributed
from offpolicy_ac.training.sources import RolloutFactory
from offpolicy_ac.training.sources import make_training_rollout

# Config fields that may change when a run is resumed.
RESUMABLE_CHANGES = (
    "train.budget.total_env_steps",
    "train.parallel.coordinator_address",
    "train.tracking.track",
    "train.tracking.wandb_project",
    "train.tracking.wandb_entity",
    "train.tracking.wandb_mode",
    "resume",
    "run_dir",
)


def save_params(path: pathlib.Path, params: Any) -> None:
  """Writes parameters (flax msgpack) atomically."""
  tmp = path.with_suffix(".tmp")
  tmp.write_bytes(flax.serialization.to_bytes(jax.device_get(params)))
  os.replace(tmp, path)


def load_params(path: str | os.PathLike, template: Any) -> Any:
  """Reads parameters written by `save_params` into the structure of `template`."""
  return flax.serialization.from_bytes(template, pathlib.Path(path).read_bytes())


def default_run_dir(name: str, config: TrainConfig) -> str:
  stamp = time.strftime("%Y%m%d-%H%M%S")
  return os.path.join("runs", f"{name}-{config.env.env_id}-seed{config.budget.seed}-{stamp}")


def _flatten(d: Any, prefix: str = "") -> dict:
  if isinstance(d, dict):
    out = {}
    for k, v in d.items():
      out.update(_flatten(v, f"{prefix}{k}."))
    return out
  return {prefix[:-1]: d}


def config_differences(old: dict, new: dict, defaults: Optional[dict] = None) -> list[str]:
  """Fields (dotted) whose values differ, ignoring RESUMABLE_CHANGES. A field the old
  config lacks (added to the library since) counts as unchanged when the new value is
  its default in `defaults`: a new field's default keeps the old behaviour."""
  a, b = _flatten(old), _flatten(new)
  known = _flatten(defaults) if defaults is not None else {}
  for k in set(b) - set(a):
    if k in known:
      a[k] = known[k]
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


def _holds_run(run_dir: pathlib.Path) -> bool:
  """Whether a run logged or checkpointed anything there (a run refused before its
  first step leaves only config.json and an empty metrics.jsonl: not a run)."""
  metrics = run_dir / "metrics.jsonl"
  checkpoints = run_dir / "checkpoints"
  return (metrics.exists() and metrics.stat().st_size > 0) or (
      checkpoints.exists() and any(checkpoints.iterdir())
  )


def _field_defaults(args: Any) -> Optional[dict]:
  """The script's default args as JSON (None when its args class needs arguments)."""
  try:
    return jsonable(type(args)())
  except TypeError:
    return None


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
    if "loop" in old["config"]:
      raise ValueError(
          f"--resume: {run_dir} was written by offpolicy_ac 0.1 (a flat `loop` config, "
          "checkpoint record format 1); this version reads format 2 (a grouped `train` "
          "config): resume that run with offpolicy_ac 0.1"
      )
    diffs = config_differences(old["config"], jsonable(args), _field_defaults(args))
    if old.get("algorithm") != name:
      diffs.insert(0, f"algorithm ({old.get('algorithm')} -> {name})")
    if diffs:
      raise ValueError(
          f"--resume: the config differs from the run's in {diffs}; only the "
          "step budget (--total-env-steps) and the tracking flags may change"
      )
  else:
    for d in (run_dir, *others):
      if _holds_run(d):
        raise FileExistsError(
            f"{d} already holds a run: pass --resume to continue it, " "or choose another --run-dir"
        )
  run_dir.mkdir(parents=True, exist_ok=True)
  write_config(run_dir, args, extra={"algorithm": name})


def _prepare_process(config: TrainConfig) -> None:
  """Process-wide settings, before any JAX computation."""
  # Join the multi-host job, and on CPU create the host devices the learner needs.
  parallel = config.parallel
  initialize_distributed(parallel.num_processes, parallel.process_id, parallel.coordinator_address)
  ensure_cpu_devices(parallel.learner_devices)


def enable_compilation_cache() -> Optional[str]:
  """Turns on JAX's persistent compilation cache, so that a script launched again with
  the same program loads it from disk instead of compiling it (most of a short run's
  launch time). The directory is JAX's own setting when there is one
  ($JAX_COMPILATION_CACHE_DIR or `jax_compilation_cache_dir`; set and empty: no cache),
  else $XDG_CACHE_HOME/offpolicy_ac/jax (~/.cache/offpolicy_ac/jax). Programs
  that compile in under 0.2 s are not stored ($JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS
  overrides). The directory only grows (as JAX's cache does): delete it to clear it.
  Process-wide, so the scripts' runner calls it, before anything compiles; returns the
  directory (None: no cache)."""
  chosen = jax.config.jax_compilation_cache_dir
  if chosen is not None and not chosen:  # the user's choice: no cache
    jax.config.update("jax_compilation_cache_dir", None)
    return None
  if chosen is None:
    cache_home = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    chosen = os.path.join(cache_home, "offpolicy_ac", "jax")
    jax.config.update("jax_compilation_cache_dir", chosen)
  # Wherever the directory comes from (JAX's default threshold is 1 s).
  if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.2)
  return chosen


def _after_backend_start() -> None:
  if jax.default_backend() == "cpu":
    # The actors call a tiny jitted policy once per step; synchronous CPU dispatch
    # cuts that call from ~90 us to ~15 us (docs/envs_notes.md). The loop syncs on
    # every update anyway, so nothing is lost. Process-wide: set by the script's
    # runner, never by the library's modules.
    jax.config.update("jax_cpu_enable_async_dispatch", False)


def _make_checkpointer(config: TrainConfig, root: pathlib.Path) -> Any:
  """<root>/checkpoints (None without checkpoints); multi-host: only process 0 writes."""
  if not config.checkpoint.checkpoint_every:
    return None
  from offpolicy_ac.training.checkpoint import Checkpointer  # orbax: slow to import

  return Checkpointer(
      root / "checkpoints",
      max_to_keep=config.checkpoint.keep_checkpoints,
      read_only=config.parallel.process_id > 0,
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


def _finish(name: str, run_dir: pathlib.Path, result: RunResult, flag: "_StopFlag",
            protocol: str) -> None:  # fmt: skip
  save_params(run_dir / "final_params.msgpack", result.agent_state.params)
  if jax.tree.leaves(result.transform_state):  # observation statistics the policy acts with
    save_params(run_dir / "final_transform.msgpack", result.transform_state)
  summary = {
      k: v
      for k, v in dataclasses.asdict(result).items()
      if k not in ("agent_state", "transform_state")
  }
  summary["run_dir"] = str(run_dir)
  summary["evaluation_protocol"] = protocol
  if flag.signal_name:
    summary["stopped_by"] = flag.signal_name
  (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
  print(f"[{name}] done: {summary}", flush=True)


def _seed_args(args: Any, seed: int, run_dir: pathlib.Path) -> Any:
  """The args of seed `seed` alone, logging in `run_dir`."""
  return dataclasses.replace(args, train=args.train.replace(seed=seed, num_seeds=1),
                             run_dir=str(run_dir))  # fmt: skip


def run_experiment(name: str, args: Any, agent_factory: Callable, *,
                   batch_fn: Optional[Callable] = None, progress: Optional[bool] = None,
                   rollout_factory: RolloutFactory = make_training_rollout,
                   ) -> RunResult | list[RunResult]:  # fmt: skip
  """Runs `train` for a script's args; see the module docstring. With `--num-seeds N` > 1
  it returns one RunResult per seed, each logged in <run_dir>/seed<k>, and plots them."""
  config: TrainConfig = args.train
  config.validate()
  if config.tracking.track:
    require_wandb()
  enable_compilation_cache()
  root = pathlib.Path(args.run_dir or default_run_dir(name, config))
  if config.compiled:  # a JAX environment: every learner in one compiled program
    from offpolicy_ac.training.anakin_runs import run_compiled

    results = run_compiled(name, args, root, batch_fn=batch_fn, progress=progress)
    return results[0] if len(results) == 1 else results
  seeds = config.seeds
  kwargs = dict(batch_fn=batch_fn, progress=progress, rollout_factory=rollout_factory)
  if config.budget.sweep:  # every (setting, seed) a lane of the vmapped learner
    if name not in AGENTS:
      raise ValueError(f"--sweep needs a known algorithm, one of {sorted(AGENTS)}; "
                       f"got {name!r}")  # fmt: skip
    lanes = sweeps.lanes_of(args, root)  # validates the sweep before anything is written
    results = _run(name, args, root, agent_factory=agent_factory, lanes=lanes, **kwargs)
    sweeps.plot_lanes(name, config, root, lanes, "vmapped")
    return results[0] if len(results) == 1 else results
  if len(seeds) == 1:
    return _run(name, args, root, agent_factory=agent_factory, **kwargs)[0]
  if config.budget.vmap_seeds and config.vmap_unsupported_reason() is None:
    results = _run(name, args, root, agent_factory=agent_factory, **kwargs)
    how = "vmapped"
  else:  # one after the other, each a complete run through the same driver
    results = [run_experiment(name, _seed_args(args, s, root / f"seed{s}"), agent_factory,
                              **kwargs) for s in seeds]  # fmt: skip
    how = "one after the other"
  plot_runs([root / f"seed{s}" for s in seeds], root / "learning_curves.png", group=True,
            title=f"{name} {config.env.env_id}, {len(seeds)} seeds ({how})")  # fmt: skip
  return results


def _run(name: str, args: Any, root: pathlib.Path, *, agent_factory: Callable,
         batch_fn: Optional[Callable], progress: Optional[bool],
         rollout_factory: RolloutFactory,
         lanes: Optional[list[sweeps.Lane]] = None) -> list[RunResult]:  # fmt: skip
  """One learner for the config's seeds: writes the run directories, trains, finishes.

  One seed logs in `root` (a multi-host job's other processes in root/process<i>: they
  log their own actors' episodes and restore from process 0's checkpoints). Vmapped
  seeds log in root/seed<k>; root holds the whole config and every seed's checkpoints.
  A sweep's `lanes` (`sweeps.lanes_of`) log in root/<setting>/seed<k>, as a compiled
  run's.
  """
  config: TrainConfig = args.train
  resume = bool(getattr(args, "resume", False))
  seeds = config.seeds
  labels = [""] * len(seeds)
  _prepare_process(config)
  if lanes is not None:
    seeds, dirs = [lane.seed for lane in lanes], [lane.run_dir for lane in lanes]
    labels = [lane.label for lane in lanes]
    _check_or_write_config(name, args, root, resume, others=dirs)
    sweeps.write_lane_configs(name, args, root, lanes)
  elif len(seeds) == 1:
    process = config.parallel.process_id
    dirs = [root / f"process{process}" if process > 0 else root]
    _check_or_write_config(name, args, dirs[0], resume)
  else:
    dirs = [root / f"seed{s}" for s in seeds]
    _check_or_write_config(name, args, root, resume, others=dirs)
    for s, d in zip(seeds, dirs):
      d.mkdir(parents=True, exist_ok=True)
      write_config(
          d, _seed_args(args, s, d), extra={"algorithm": name, "vmapped_seeds_of": str(root)}
      )
  _after_backend_start()
  protocol = describe_protocol(config)
  if config.parallel.process_id == 0:
    print(f"[{name}] evaluation protocol: {protocol}", flush=True)
  checkpointer = _make_checkpointer(config, root)
  loggers = [
      _make_logger(name, config, s, d, progress=progress if k == 0 else False,
                   group=root.name if len(seeds) > 1 else None, label=label)
      for k, (s, d, label) in enumerate(zip(seeds, dirs, labels))
  ]  # fmt: skip
  if lanes is not None and len(lanes) > 1:
    print(f"[{name}] {len(lanes)} learners in one vmapped learner", flush=True)
  flag = _StopFlag()
  try:
    try:
      with _stop_on_signals(flag):
        results = train(agent_factory, config, loggers, batch_fn=batch_fn,
                        checkpointer=checkpointer, resume=resume, should_stop=flag,
                        rollout_factory=rollout_factory,
                        make_agent=AGENTS[name][0] if lanes is not None else None)  # fmt: skip
    finally:
      for logger in loggers:
        logger.close()
      if checkpointer is not None:
        checkpointer.close()  # waits for a save in flight: the checkpoint stays whole
  except Exception as error:
    if config.parallel.num_processes > 1:
      _abandon_distributed_job(name, config, root, error)
    raise
  for d, result in zip(dirs, results):
    _finish(name, d, result, flag, protocol)
  return results


def _make_logger(name: str, config: TrainConfig, seed: int, run_dir: pathlib.Path, *,
                 progress: Optional[bool], group: Optional[str],
                 label: str = "") -> Logger:  # fmt: skip
  """The run directory's logger, and with `--track` a W&B run beside it (its config:
  the directory's config.json)."""
  logger = RunLogger(run_dir, total_env_steps=config.budget.total_env_steps,
                     title=f"{name} {config.env.env_id} {label}seed {seed}",
                     progress=progress)  # fmt: skip
  tracking = config.tracking
  if not tracking.track:
    return logger
  try:
    tracker = WandbLogger(
        run_dir,
        project=tracking.wandb_project,
        entity=tracking.wandb_entity,
        mode=tracking.wandb_mode,
        config=json.loads((run_dir / "config.json").read_text()),
        group=group,
    )
  except BaseException:
    logger.close()
    raise
  return MultiLogger(logger, tracker)


def _abandon_distributed_job(
    name: str, config: TrainConfig, root_dir: pathlib.Path, error: Exception
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
      f"[{name}] process {config.parallel.process_id} of {config.parallel.num_processes} "
      "stopped: "
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
