"""`run_experiment`: what an experiment script runs.

`run_experiment(name, args, agent_factory)` takes a script's frozen args (fields
`train: TrainConfig`, `agent: <agent config>`, `run_dir`, `resume`) and:

* builds the run's program (`training/compiled_program.py` for a JAX environment,
  "gymnax:..." or "brax:...", else `training/envpool_program.py`), which validates
  everything before anything is written or run;
* creates the run directory (refusing to overwrite a run unless `resume`; on `resume`,
  refusing a config that differs from the run's in anything but the step budget) and
  writes config.json (`training/rundir.py`);
* holds the run directory's lock (`rundir.locked`: one process per run directory);
* installs SIGTERM/SIGINT handlers that stop the run cleanly, where `--resume` continues
  (exactly, unless the run has actor threads: `training/driver.py`);
* trains with the driver (`training/driver.py`), logging to metrics.jsonl / TensorBoard /
  a PNG (and with `--track` to Weights & Biases), checkpointing with orbax every
  `checkpoint_every` env steps and at the end;
* writes each learner's best-evaluated parameters as they come (best_params.msgpack), and
  at the end its final parameters and summary.json.

Several learners (`--num-seeds N`; `--sweep FIELD=V1,V2,...`: one per setting and seed)
are lanes of one program, each logging in `<run_dir>/seed<k>` or
`<run_dir>/<setting>/seed<k>` (`training/sweeps.py`), plus plots (and for a sweep a table)
that compare them. Seeds that cannot share a learner (actor threads, several devices or
processes, `--no-vmap-seeds`) run one after the other; a stop signal ends the run with the
seed it stopped, and `--resume` continues that seed, then starts the next. A multi-host job
(`--num-processes`) joins the jax.distributed job first.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pathlib
import signal
import sys
import threading
from typing import Any
from typing import Callable
from typing import NamedTuple
from typing import Optional
from typing import Sequence

import jax

from offpolicy_ac import _memory
from offpolicy_ac.agents.base import check_is_agent
from offpolicy_ac.agents.base import check_settings_used
from offpolicy_ac.agents.base import check_swept_settings_used
from offpolicy_ac.agents.registry import AGENTS
from offpolicy_ac.agents.registry import check_registered
from offpolicy_ac.analysis.metrics_file import METRICS_FILE
from offpolicy_ac.analysis.metrics_file import read_json
from offpolicy_ac.analysis.plotting import plot_runs
from offpolicy_ac.training import checkpoint
from offpolicy_ac.training import rundir
from offpolicy_ac.training import sweeps
from offpolicy_ac.training.compiled_program import CompiledProgram
from offpolicy_ac.training.compiled_train import make_train
from offpolicy_ac.training.config import TrainConfig
from offpolicy_ac.training.driver import ResumeError
from offpolicy_ac.training.driver import RunResult
from offpolicy_ac.training.driver import drive
from offpolicy_ac.training.envpool_program import EnvpoolProgram
from offpolicy_ac.training.evaluation import describe_protocol
from offpolicy_ac.training.logger import Logger
from offpolicy_ac.training.logger import MultiLogger
from offpolicy_ac.training.logger import RunLogger
from offpolicy_ac.training.logger import WandbLogger
from offpolicy_ac.training.logger import check_logger
from offpolicy_ac.training.logger import require_wandb
from offpolicy_ac.training.logger import write_atomic
from offpolicy_ac.training.parallel import JOIN_TIMEOUT_S
from offpolicy_ac.training.parallel import check_same_settings
from offpolicy_ac.training.parallel import ensure_cpu_devices
from offpolicy_ac.training.parallel import initialize_distributed
from offpolicy_ac.training.rundir import default_run_dir
from offpolicy_ac.training.sources import RolloutFactory
from offpolicy_ac.training.sources import make_training_rollout
from offpolicy_ac.training.sources import task_spec

REFUSED = "offpolicy_ac_refused"
"""The attribute `run_experiment` sets (True) on an error that refused the run before it
started: bad settings, a run directory in use or holding another run, a checkpoint that
cannot be resumed. `script_main` prints those as one line and exits with code 2; the
exception keeps its type for Python callers."""


@contextlib.contextmanager
def refusals():
  """Marks the errors raised inside (ValueError, TypeError, OSError, an optional package
  not installed, a run directory in use) as refusals of the run (`REFUSED`): for checks a
  script makes before its run."""
  try:
    yield
  except (ValueError, TypeError, OSError, ImportError, rundir.RunDirectoryInUse) as e:
    setattr(e, REFUSED, True)
    raise


def is_refusal(error: BaseException) -> bool:
  """Whether `error` refused a run before it started (see `REFUSED`)."""
  return bool(getattr(error, REFUSED, False))


class _StopFlag:
  """Set by SIGTERM/SIGINT; the driver stops after the current iteration."""

  def __init__(self):
    self.signal_name: Optional[str] = None
    self.finishing = False  # the run's files are being written: a second signal waits
    self.outer: Optional[_StopFlag] = None  # the enclosing context's flag, set with this one
    self.stop_now: Optional[str] = None  # a second signal's name

  def __call__(self) -> bool:
    if self.stop_now is not None and threading.current_thread() is threading.main_thread():
      # The second signal's KeyboardInterrupt was dropped: raised while Python ran a
      # weakref callback or a __del__, whose exceptions it prints as "ignored". It stops
      # now, as asked, at the first poll.
      raise KeyboardInterrupt(self.stop_now)
    return self.signal_name is not None


@contextlib.contextmanager
def _stop_on_signals(flag: _StopFlag, *, building: bool = False):
  """Sets `flag` on SIGTERM/SIGINT while the context runs. Inside other such contexts
  (seeds run one after the other), a signal sets the outer flags too, and one an outer
  context received before sets `flag` at once.

  `building`: the run is being built, outside any other context. SIGINT sets `flag` and
  interrupts at once (KeyboardInterrupt, as Python's default); should native code drop
  that, the flag stops the run at its first iteration. SIGTERM keeps its default.
  The KeyboardInterrupt of a second signal holds the signal's name (`script_main` reports
  it, and that the checkpoints are intact); the one of a run being built does not (a new
  run has none yet).
  """
  outer = getattr(signal.getsignal(signal.SIGINT), "stop_flag", None)
  if threading.current_thread() is not threading.main_thread() or (building and outer):
    yield  # (nested: the enclosing context's handler answers)
    return
  flag.outer = outer
  if outer is not None and outer.signal_name is not None:
    flag.signal_name = outer.signal_name

  def handler(signum, frame):
    name, again = signal.Signals(signum).name, flag.signal_name is not None
    flag.signal_name, up = flag.signal_name or name, flag.outer
    while up is not None:
      up.signal_name, up = up.signal_name or name, up.outer
    if building:
      raise KeyboardInterrupt
    if flag.finishing or checkpoint.SAVING.is_set():  # the files are written first
      print(f"received {name}: writing the run's files first", flush=True)
    elif again:  # a second signal: stop now
      flag.stop_now = name
      raise KeyboardInterrupt(name)
    else:
      print(f"received {name}: stopping after this iteration", flush=True)

  handler.stop_flag = flag
  signals = (signal.SIGINT,) if building else (signal.SIGTERM, signal.SIGINT)
  previous = {sig: signal.signal(sig, handler) for sig in signals}
  try:
    yield
  finally:
    for sig, old in previous.items():
      signal.signal(sig, old)


@contextlib.contextmanager
def _removed_on_error(made: Sequence[pathlib.Path], remove: Callable[[pathlib.Path], None]):
  """Directories made for this run are removed again by `remove`, deepest first, when the
  run ends with an error (a refusal): the default run directory if it holds nothing but a
  lock (`rundir.remove_if_unused`), the folders made above a new learner's directory if
  they are empty (`_rmdir_if_empty`: another process may have locked a run in one)."""
  try:
    yield
  except BaseException:
    for path in sorted(made, key=lambda p: len(p.parts), reverse=True):
      remove(path)
    raise


def _rmdir_if_empty(path: pathlib.Path) -> None:
  with contextlib.suppress(OSError):  # gone, or not empty
    os.rmdir(path)


def _folders_not_yet_made_above(paths: Sequence[pathlib.Path]) -> list[pathlib.Path]:
  """The folders above the paths that do not exist yet (not the paths: another process may
  make and lock one of them before this one does)."""
  return list(dict.fromkeys(p for path in paths for p in path.parents
                            if not p.exists() and p not in paths))  # fmt: skip


def prepare_process(config: TrainConfig) -> None:
  """The process-wide settings a run needs before any JAX computation: joins the
  multi-host job (`--num-processes`) and, on a CPU, creates the host devices the learner
  needs (`--learner-devices`). `run_experiment` calls it; a script that computes with JAX
  before (sqil.py puts its demonstrations on the device) calls it first. Calling it again
  does nothing."""
  parallel = config.parallel
  if parallel.num_processes > 1 and not jax.distributed.is_initialized():
    where = parallel.coordinator_address
    print(f"process {parallel.process_id} of {parallel.num_processes}: joining the job at "
          f"{where} (every process must join within {JOIN_TIMEOUT_S} s)", flush=True)  # fmt: skip
  initialize_distributed(parallel.num_processes, parallel.process_id, parallel.coordinator_address)
  ensure_cpu_devices(parallel.learner_devices)


def enable_compilation_cache() -> Optional[str]:
  """Turns on JAX's persistent compilation cache, so that a script launched again with
  the same program loads it from disk instead of compiling it (most of a short run's
  launch time). The directory is JAX's own setting when there is one
  ($JAX_COMPILATION_CACHE_DIR or `jax_compilation_cache_dir`; set and empty: no cache),
  else $XDG_CACHE_HOME/offpolicy_ac/jax (~/.cache/offpolicy_ac/jax). Programs
  that compile in under 0.2 s are not stored ($JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS
  overrides). The directory only grows (as JAX's cache does): delete it to clear it, as
  after a process killed while it wrote an entry (JAX writes in place: it then warns
  "Error reading persistent compilation cache entry" and compiles that program each time).
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


def _seed_args(args: Any, seed: int, run_dir: pathlib.Path) -> Any:
  """The args of seed `seed` alone, logging in `run_dir`. Resuming, a seed that never
  started (its run was stopped before) starts."""
  changes = {"train": args.train.replace(seed=seed, num_seeds=1), "run_dir": str(run_dir)}
  if getattr(args, "resume", False):
    changes["resume"] = (run_dir / "config.json").exists()
  return dataclasses.replace(args, **changes)


def run_experiment(name: str, args: Any, agent_factory: Callable, *,
                   batch_fn: Optional[Callable] = None, progress: Optional[bool] = None,
                   rollout_factory: RolloutFactory = make_training_rollout,
                   inputs: Optional[dict[str, str]] = None,
                   add_logger: Optional[Callable[[pathlib.Path, int], Logger]] = None,
                   ) -> RunResult | list[RunResult]:  # fmt: skip
  """Trains a script's args; see the module docstring. `agent_factory(spec)` builds the
  agent of `args.agent` (config.json records it; only the step-size schedule a script
  derives from the budget, `BUDGET_DERIVED_FIELDS`, may differ). With several learners
  (seeds, a sweep's settings) it returns one RunResult per learner, each logged in its own
  directory under `args.run_dir`, and plots them. `inputs` holds the digests of files
  that args fields name (`{"demos": sha256}`): kept in config.json, a resumed run compares
  them instead of the paths. `add_logger(run_dir, seed)`, called once per learner with
  its directory, returns a `Logger` that gets the learner's metrics lines beside the run
  directory's (for example an MLflow run; on `--resume` its `truncate(num_lines)` is told
  where the run goes on)."""
  if not dataclasses.is_dataclass(args) or isinstance(args, type) or not hasattr(args, "train"):
    raise TypeError(f"run_experiment takes a script's Args (for example presets.impala.Args("
                    f"run_dir=...)), got {type(args).__name__}")  # fmt: skip
  options = _Options(batch_fn, progress, rollout_factory, inputs, add_logger)
  with _stop_on_signals(_StopFlag(), building=True):  # a Ctrl-C is never lost
    return _experiment(name, args, agent_factory, options)


class _Options(NamedTuple):
  """`run_experiment`'s keyword arguments, passed on to where each is used."""

  batch_fn: Optional[Callable]
  progress: Optional[bool]
  rollout_factory: RolloutFactory
  inputs: Optional[dict[str, str]]
  add_logger: Optional[Callable[[pathlib.Path, int], Logger]]


def _experiment(name: str, args: Any, agent_factory: Callable,
                options: _Options) -> RunResult | list[RunResult]:  # fmt: skip
  """`run_experiment` with its signal handlers installed."""
  add_logger = options.add_logger
  if isinstance(args.run_dir, os.PathLike):  # a pathlib.Path from Python
    args = dataclasses.replace(args, run_dir=os.fspath(args.run_dir))
  if isinstance(args.run_dir, str) and args.run_dir.startswith("~"):  # --run-dir=~/x, quoted
    args = dataclasses.replace(args, run_dir=os.path.expanduser(args.run_dir))
  config: TrainConfig = args.train
  resume = bool(getattr(args, "resume", False))
  with refusals():  # before anything is created on disk
    if args.run_dir is not None and not isinstance(args.run_dir, str):
      raise TypeError(f"run_dir must be a path (a str or pathlib.Path), got {args.run_dir!r}")
    if not isinstance(config, TrainConfig):
      raise TypeError(f"train must be a TrainConfig, got {config!r}")
    config.validate()
    if config.tracking.track:
      require_wandb()
    if args.run_dir is not None and not str(args.run_dir).strip():
      raise ValueError("--run-dir is empty: name a directory, or leave the flag out for the "
                       "default one under runs/")  # fmt: skip
    if args.run_dir and pathlib.Path(args.run_dir).exists() and not os.path.isdir(args.run_dir):
      raise ValueError(f"--run-dir {args.run_dir} is a file, not a directory")
    rundir.check_path_usable(pathlib.Path(args.run_dir or "runs"))
    if args.run_dir and not resume and config.parallel.process_id == 0:
      rundir.check_new_run_dir(pathlib.Path(args.run_dir))
    if resume and not args.run_dir:
      raise ValueError("--resume needs --run-dir: the run directory to continue")
    if resume and not pathlib.Path(args.run_dir).is_dir():
      raise FileNotFoundError(f"--resume: {args.run_dir} is not a run directory")
    if resume and not config.checkpoint.checkpoint_every:
      raise ValueError("--resume needs checkpoints: --checkpoint-every 0 writes none")
    if not args.run_dir and config.parallel.num_processes > 1:
      raise ValueError("a multi-process job needs --run-dir: one directory all processes share")
    if add_logger is not None and not callable(add_logger):
      raise ValueError(
          f"add_logger must be add_logger(run_dir, seed) -> Logger, got {add_logger!r}"
      )
  enable_compilation_cache()
  with refusals():
    made = None if args.run_dir else default_run_dir(name, config)
  root = pathlib.Path(args.run_dir or made)
  with _removed_on_error([pathlib.Path(made)] if made else [], rundir.remove_if_unused):
    seeds = config.seeds
    shared = (
        config.budget.sweep
        or len(seeds) == 1
        or (config.budget.vmap_seeds and config.vmap_unsupported_reason() is None)
    )
    writer = config.parallel.process_id == 0  # others log in seed<k>/process<i>
    if not shared:  # one after the other, each a complete run through the same driver
      dirs, between = [root / f"seed{s}" for s in seeds], _StopFlag()
      with contextlib.ExitStack() as held:
        with refusals():
          if writer:
            held.enter_context(rundir.locked(root))
          if resume:
            _refuse_another_seeds_shape(name, root, config, one_after_another=True)
          # Before "holds no run": seeds none of which the run holds are named as such.
          rundir.check_seeds_record(root, seeds, resume=resume, one_after_another=True,
                                    write=writer)  # fmt: skip
          if resume and not any((d / "config.json").exists() for d in dirs):
            raise FileNotFoundError(f"--resume: {root} holds no run (no seed<k>/config.json)")
        held.enter_context(_stop_on_signals(between))  # a signal between two seeds
        held.enter_context(rundir.starting_seeds_of(root))
        results = []
        for seed, seed_dir in zip(seeds, dirs):
          results.append(run_experiment(name, _seed_args(args, seed, seed_dir), agent_factory,
                                        **options._asdict()))  # fmt: skip
          if results[-1].interrupted or between():  # --resume goes on from here
            if not results[-1].interrupted and len(results) < len(seeds):
              print(f"[{name}] stopped by {between.signal_name} before seed "
                    f"{seeds[len(results)]}; --resume starts it", flush=True)  # fmt: skip
            break
        between.finishing = True  # the seeds' files are written: a signal waits for the plot
        if writer:
          plot_runs(dirs[: len(results)], root / "learning_curves.png", group=True,
                    title=f"{name} {config.env.env_id}, {len(seeds)} seeds (one after the "
                    "other)")  # fmt: skip
      return results
    with refusals():
      if resume and len(seeds) > 1:
        _refuse_another_seeds_shape(name, root, config, one_after_another=False)
      # Not into, nor as, a run of several seeds one after the other.
      rundir.check_seeds_record(root, seeds, resume=resume, one_after_another=False,
                                write=False)  # fmt: skip
    results = _run(name, args, root, agent_factory, options)
    return results[0] if len(results) == 1 else results


def _refuse_another_seeds_shape(name: str, root: pathlib.Path, config: TrainConfig, *,
                                one_after_another: bool) -> None:  # fmt: skip
  """On --resume, refuses a run of several seeds whose directory holds them in the other
  shape: one learner of them all (config.json at the root), or one run per seed after
  the other (seed<k>/config.json only); first, a run of another algorithm."""
  seeds = [root / f"seed{seed}" / "config.json" for seed in config.seeds]
  budget_of = lambda path: read_json(path).get("config", {}).get("train", {}).get("budget", {})
  held = next((path for path in [root / "config.json", *seeds] if path.exists()), None)
  record = read_json(held) if held is not None else None
  if isinstance(record, dict) and "algorithm" in record:  # (others: refused by what they are)
    rundir.check_algorithm(name, root, record)
  if one_after_another and (root / "config.json").exists():
    budget = budget_of(root / "config.json")
    why = (
        "--no-vmap-seeds"
        if not config.budget.vmap_seeds
        else f"a vmapped learner cannot use {config.vmap_unsupported_reason()}"
    )
    raise ValueError(
        f"--resume: {root} holds one learner of {budget.get('num_seeds', 1)} seed(s), and these "
        f"settings train {len(seeds)} seeds one after the other ({why}): resume it with the "
        "settings it was run with"
    )
  if not one_after_another and not (root / "config.json").exists():
    held = next((path for path in seeds if path.exists()), None)
    if held is not None:
      vmapped = budget_of(held).get("vmap_seeds", True)
      raise ValueError(
          f"--resume: {root} holds its seeds as runs one after the other"
          f"{'' if vmapped else ' (run with --no-vmap-seeds)'}, and these settings train them "
          "as one vmapped learner: resume it with the settings it was run with"
      )


def _program(name: str, args: Any, lanes: list[sweeps.Lane], agent_factory: Callable,
             options: _Options) -> Any:  # fmt: skip
  """The run's `driver.Program`: the compiled program of a JAX environment, else the
  envpool program. Validates everything before anything runs."""
  config: TrainConfig = args.train
  agent = check_is_agent(agent_factory(task_spec(config)), "agent_factory(spec)")
  check_settings_used(agent.config, agent.spec)
  check_swept_settings_used(agent.config, agent.spec, lanes[0].setting)
  # The run directory rebuilds its agent from `name` and the config (load_run, --resume), as
  # do compiled runs and sweeps: a custom agent under a built-in name would be replaced.
  check_registered(name, agent)
  _check_agent_is_args(args, agent.config)
  if config.compiled:
    # The agent's config as the factory builds it: a script may derive settings from the
    # budget there (IMPALA's --anneal-learning-rate, SQL's --learning-rate-cooldown).
    compiled = make_train(AGENTS[name][0], agent.config, config, batch_fn=options.batch_fn)
    return CompiledProgram(compiled, [lane.seed for lane in lanes],
                           [lane.setting for lane in lanes])  # fmt: skip
  _after_backend_start()
  return EnvpoolProgram(lambda spec: agent, config, batch_fn=options.batch_fn,
                        rollout_factory=options.rollout_factory,
                        make_agent=AGENTS[name][0] if config.budget.sweep else None)  # fmt: skip


BUDGET_DERIVED_FIELDS = ("learning_rate_decay_begin", "learning_rate_decay_updates")
"""Agent config fields a script's `agent_factory` may set from the budget (IMPALA's
--anneal-learning-rate, SQL's --learning-rate-cooldown): a resume with a larger budget
derives them anew, so config.json keeps them as `args.agent` has them."""


def _check_backend_starts() -> None:
  """Starts JAX's backend: one that cannot start (JAX_PLATFORMS=tpu on a machine without
  libtpu, cuda without its plugin) is a refusal, not JAX's traceback."""
  try:
    jax.devices()
  except (RuntimeError, AssertionError) as e:
    platforms = os.environ.get("JAX_PLATFORMS") or jax.config.jax_platforms
    why = str(e) or "its plugin is not installed"
    raise ValueError(
        f"JAX cannot start the backend {platforms!r} (JAX_PLATFORMS): {why}; name one this "
        "machine has, or leave JAX_PLATFORMS unset"
    ) from None


def _check_agent_is_args(args: Any, built: Any) -> None:
  """Refuses an `agent_factory` that builds an agent of another config than `args.agent`
  (but for `BUDGET_DERIVED_FIELDS`): config.json records `args.agent`, and `load_run` and
  `--resume` rebuild the agent from it, so the run would train one agent and record
  another."""
  recorded = getattr(args, "agent", None)
  if not dataclasses.is_dataclass(recorded) or isinstance(recorded, type):
    return  # args without an agent config: config.json records none
  if type(recorded) is not type(built):
    raise ValueError(f"agent_factory built an agent of config {type(built).__name__}, and "
                     f"args.agent is a {type(recorded).__name__}: config.json records "
                     "args.agent; give the factory args.agent")  # fmt: skip
  differ = [(f.name, getattr(recorded, f.name), getattr(built, f.name))
            for f in dataclasses.fields(recorded) if f.name not in BUDGET_DERIVED_FIELDS
            and getattr(recorded, f.name) != getattr(built, f.name)]  # fmt: skip
  if differ:
    shown = "; ".join(f"{k} (args.agent: {a!r}, the agent's: {b!r})" for k, a, b in differ[:4])
    raise ValueError(
        f"agent_factory built an agent whose config differs from args.agent in {shown}"
        f"{'; ...' * (len(differ) > 4)}: config.json records args.agent, and load_run and "
        "--resume rebuild the agent from it; give the factory args.agent "
        "(functools.partial(make_agent, config=args.agent))"
    )


def _run(name: str, args: Any, root: pathlib.Path, agent_factory: Callable,
         options: _Options) -> list[RunResult]:  # fmt: skip
  """One program for the run's learners: writes the run directories, trains, finishes.

  One learner logs in `root` (a multi-host job's other processes in root/process<i>: they
  log their own actors' episodes and restore from process 0's checkpoints). Several
  (`sweeps.lanes_of`: seeds, a sweep's settings x seeds) log in root/seed<k> or
  root/<setting>/seed<k>; root holds the whole config and every learner's checkpoints.
  A resume (of one process) that ends in an error (or a Ctrl-C as it is built) before its
  first checkpoint leaves the run as it found it: config.json too (its budget, its
  `resumed` list); a refused resume, or a Ctrl-C as it is built, leaves summary.json
  unmarked too.
  """
  inputs = options.inputs or {}
  with refusals():
    args = sweeps.canonical_sweep(args)  # validates the sweep before anything is written
    config: TrainConfig = args.train
    lanes = sweeps.lanes_of(args, root)
    _check_open_files(
        len(lanes), "--num-seeds" + " times the --sweep settings" * bool(config.budget.sweep)
    )
    _check_memory_maps(config)
    prepare_process(config)
    _check_backend_starts()
    # Paths may differ between hosts (a shared filesystem mounted elsewhere, `~`): input
    # files are compared by their contents, the run directory not at all.
    own = {"run_dir", "train.parallel.process_id", "train.parallel.coordinator_address"}
    own |= set(inputs)
    mine = {k: v for k, v in rundir.flat_settings(args).items() if k not in own}
    check_same_settings({**mine, **{f"{k} (contents)": v for k, v in inputs.items()}})
    program = _program(name, args, lanes, agent_factory, options)
  process = config.parallel.process_id
  dirs = [lane.run_dir for lane in lanes]
  alone = _alone(root, lanes)
  if alone and process > 0:  # a multi-host job's other processes: their own logs
    dirs = [root / f"process{process}"]
  locked_dirs = [dirs[0]] if alone else [root, *dirs]
  made = _folders_not_yet_made_above(locked_dirs)
  with contextlib.ExitStack() as held:
    held.enter_context(_removed_on_error(made, _rmdir_if_empty))
    with refusals():  # several learners: the root and each learner's directory
      for locked in locked_dirs:
        held.enter_context(rundir.locked(locked))
    keep = bool(getattr(args, "resume", False)) and config.parallel.num_processes == 1
    with _files_kept_on_failure(root, dirs, keep) as kept:
      return _configure_and_drive(name, args, root, lanes, dirs, program, options, kept)


def _alone(root: pathlib.Path, lanes: list[sweeps.Lane]) -> bool:
  """One learner, logging in the root itself; a sweep's learners log below it, a sweep of
  one setting and one seed's too (`sweeps.lanes_of`)."""
  return [lane.run_dir for lane in lanes] == [root]


FILES_PER_LEARNER = 3
"""Files each learner of a run keeps open: its directory's lock, metrics.jsonl and its
TensorBoard events."""


def _check_open_files(learners: int, flags: str) -> None:
  """Refuses more learners than this process may keep files open for (`ulimit -n`), before
  their directories are made (the run would fail part way, with "Too many open files")."""
  import resource

  limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
  needed = FILES_PER_LEARNER * learners + 256  # and the process's own (libraries, checkpoints)
  if learners > 1 and limit != resource.RLIM_INFINITY and needed > limit:
    raise ValueError(
        f"{learners:,} learners ({flags}) keep "
        f"{FILES_PER_LEARNER} files open each: about {needed:,} files, more than this process "
        f"may open ({limit:,}, ulimit -n): train fewer learners in one run, or raise the limit"
    )


MAPS_BASE, MAPS_PER_ACTOR, MAPS_PER_ENV = 2_000, 40, 2
"""A process's memory maps, about: the libraries and compiled programs, plus each actor's
thread, programs and allocator arenas, plus each of its pool's threads (a stack and its
guard; at most one per environment). Measured on CartPole-v1 (16 environments per pool, 2
cores): about 1,300 + 67 per actor."""
MAX_MAP_COUNT = pathlib.Path("/proc/sys/vm/max_map_count")


def _check_memory_maps(config: TrainConfig) -> None:
  """Refuses more actors than the kernel's limit on a process's memory maps
  (`vm.max_map_count`) allows, before they start (at about 1,000 actors, allocations
  failed in every thread and the process crashed)."""
  actors = config.acting.num_actors
  if actors <= 1:
    return
  try:
    limit = int(MAX_MAP_COUNT.read_text())
  except (OSError, ValueError):
    return
  needed = MAPS_BASE + actors * (MAPS_PER_ACTOR + MAPS_PER_ENV * config.env.num_envs)
  if needed > limit:
    raise ValueError(
        f"{actors:,} actors (num_actors), each with a pool of {config.env.num_envs} "
        f"environments, need about {needed:,} memory maps, more than this machine allows a "
        f"process ({limit:,}, vm.max_map_count): fewer actors, or raise the limit"
    )


@dataclasses.dataclass
class _Kept:
  """What `_files_kept_on_failure` puts back: the summaries the body marked resumed
  (`{run_dir: what mark_summary_resumed returned}`), while `building` (until the driver's
  own signal handler is in place)."""

  marked: dict = dataclasses.field(default_factory=dict)
  building: bool = True


@contextlib.contextmanager
def _files_kept_on_failure(root: pathlib.Path, dirs: list[pathlib.Path], keep: bool):
  """With `keep`, puts the config.json files (the root's, each learner's) back as they were
  when the body fails with an error, or a Ctrl-C while the run is built (then the marked
  summaries too: nothing ran), with no checkpoint saved since it began. A stop once the
  run trains (a second signal: at once) keeps them: the run was resumed."""
  paths = [d / "config.json" for d in dict.fromkeys([root, *dirs])] if keep else []
  before = {path: path.read_bytes() for path in paths if path.exists()}
  saved = _checkpoint_saves(root / "checkpoints") if before else {}
  kept = _Kept()
  try:
    yield kept
  except BaseException as e:
    building = isinstance(e, KeyboardInterrupt) and kept.building
    if (before and (isinstance(e, Exception) or building)
        and _checkpoint_saves(root / "checkpoints").items() <= saved.items()):  # fmt: skip
      for path, data in before.items():
        with contextlib.suppress(OSError):  # the failure is the error to show
          if path.read_bytes() != data:
            write_atomic(path, data)
      for d, summary in kept.marked.items() if building else ():
        with contextlib.suppress(OSError):
          rundir.unmark_summary_resumed(d, summary)
    raise


def _checkpoint_saves(directory: pathlib.Path) -> dict[int, int]:
  """When each complete checkpoint in `directory` was saved: {step: its checksums' mtime}."""
  saves = {}
  for step in checkpoint.checkpoint_steps(directory):
    with contextlib.suppress(FileNotFoundError):  # deleted meanwhile
      saves[step] = (directory / str(step) / checkpoint.CHECKSUMS).stat().st_mtime_ns
  return saves


def _configure_and_drive(name: str, args: Any, root: pathlib.Path, lanes: list[sweeps.Lane],
                         dirs: list[pathlib.Path], program: Any,
                         options: _Options, kept: _Kept) -> list[RunResult]:  # fmt: skip
  """config.json, signals, the driver, results. A resume's marked summaries go to
  `kept.marked`, as they were; `kept.building` ends where the driver's signal handler
  takes over."""
  config: TrainConfig = args.train
  resume, add_logger = bool(getattr(args, "resume", False)), options.add_logger
  with refusals():  # before config.json is written
    added = [_added(add_logger, d, lane.seed) for lane, d in zip(lanes, dirs) if add_logger]
  try:
    # Process 0 writes the checkpoints, in the root; the others read them (process<k>/).
    common = {"inputs": options.inputs, "checkpoints": root / "checkpoints",
              "writes_checkpoints": config.parallel.process_id == 0}  # fmt: skip
    with refusals():
      if _alone(root, lanes):
        rundir.check_or_write_config(name, args, dirs[0], resume, **common)
      else:
        written = rundir.check_or_write_config(name, args, root, resume, others=dirs, **common)
        sweeps.write_lane_configs(name, args, root, lanes, written["run_id"], resume,
                                  options.inputs)  # fmt: skip
  except BaseException:
    with contextlib.suppress(Exception):  # the refusal is the error to show
      MultiLogger(*added).close()
    raise
  marked = kept.marked
  for d in dirs if resume else ():
    marked[d] = rundir.mark_summary_resumed(d)
  protocol = describe_protocol(config)
  if config.parallel.process_id == 0:
    print(f"[{name}] evaluation protocol: {protocol}", flush=True)
    step, total = config.steps_per_iteration, config.budget.total_env_steps
    if total % step and config.fixed_iterations:
      print(f"[{name}] the budget, {total:,} env steps, is not a whole number of iterations "
            f"({step:,} env steps each): the run trains {config.planned_iterations * step:,}",
            flush=True)  # fmt: skip
  how = "vmapped, compiled" if config.compiled else "vmapped"
  if len(lanes) > 1:
    print(f"[{name}] {len(lanes)} learners in one program ({how})", flush=True)
  with contextlib.ExitStack() as made:  # a failure closes what was made
    for extra in added:
      made.callback(_close_quietly, extra)
    trackers = []  # first: W&B refusing a run (no API key) leaves no logs behind
    for lane, d in zip(lanes, dirs) if config.tracking.track else ():
      trackers.append(_make_tracker(config, d, group=root.name if d != root else None,
                                    label=lane.label))  # fmt: skip
      made.callback(_close_quietly, trackers[-1])
    loggers: list[Logger] = []
    for k, (lane, d) in enumerate(zip(lanes, dirs)):
      loggers.append(RunLogger(d, total_env_steps=config.budget.total_env_steps,
                               title=f"{name} {config.env.env_id} {lane.label}seed {lane.seed}",
                               progress=options.progress if k == 0 else False))  # fmt: skip
      made.callback(_close_quietly, loggers[-1])
    checkpointer = None  # <root>/checkpoints; in a multi-host job, written by process 0
    if config.checkpoint.checkpoint_every:
      checkpointer = checkpoint.Checkpointer(root / "checkpoints",
                                             max_to_keep=config.checkpoint.keep_checkpoints,
                                             read_only=config.parallel.process_id > 0)  # fmt: skip
    made.pop_all()
  for k, logger in enumerate(loggers):  # each learner's: its directory's, W&B's, add_logger's
    others = [made_for_all[k] for made_for_all in (trackers, added) if made_for_all]
    if others:
      loggers[k] = MultiLogger(logger, *others)
  flag = _StopFlag()
  with _stop_on_signals(flag):  # to the end: a second signal never cuts the files short
    kept.building = False
    try:
      return _drive_and_finish(name, config, root, lanes, dirs, program, protocol, loggers,
                               checkpointer, resume, flag)  # fmt: skip
    except ResumeError:  # refused before it trained: the summaries are as they were
      for d, before in marked.items():
        with contextlib.suppress(OSError):  # the refusal is the error to show
          rundir.unmark_summary_resumed(d, before)
      raise


def _drive_and_finish(name: str, config: TrainConfig, root: pathlib.Path,
                      lanes: list[sweeps.Lane], dirs: list[pathlib.Path], program: Any,
                      protocol: str, loggers: list[Logger], checkpointer: Any, resume: bool,
                      flag: _StopFlag) -> list[RunResult]:  # fmt: skip
  """Trains with the driver, then writes each learner's results and the plots."""
  try:
    try:
      outcome = drive(program, config, loggers, checkpointer=checkpointer, resume=resume,
                      should_stop=flag,
                      keep_best=rundir.BestFiles(dirs),
                      announce=lambda message: print(f"[{name}] {message}", flush=True))  # fmt: skip
    finally:
      flag.finishing = True  # from here a second signal waits for the files to be written
      try:
        for logger in loggers:
          logger.close()
      finally:
        if checkpointer is not None:
          checkpointer.close()  # waits for a save in flight: the checkpoint stays whole
  except Exception as error:
    # The checkpoints cannot be resumed, or the compiled programs need more memory than
    # is free: nothing ran.
    if isinstance(error, (ResumeError, _memory.DoesNotFit)):
      setattr(error, REFUSED, True)
    if config.parallel.num_processes > 1:
      _abandon_distributed_job(name, config, root, error)
    raise
  # A signal after the last step stopped nothing: the run finished. A multi-process job
  # stops when any of its processes gets one.
  stopped_by = (flag.signal_name or "a signal to another process of the job"
                if outcome.results[0].interrupted else None)  # fmt: skip
  for d, result in zip(dirs, outcome.results):
    rundir.write_results(name, d, result, protocol, stopped_by=stopped_by)
  if stopped_by:
    first = outcome.results[0]
    where = (f"--resume continues from its checkpoint at env step {first.checkpoint_env_steps:,}"
             if first.checkpoint_env_steps is not None else
             "--resume continues from the beginning (no checkpoint yet)"
             if config.checkpoint.checkpoint_every else
             "it wrote no checkpoint (--checkpoint-every 0) and cannot be resumed: start it "
             "again in another --run-dir")  # fmt: skip
    print(f"[{name}] stopped by {stopped_by} at env step {first.env_steps:,}; {where}",
          flush=True)  # fmt: skip
  if not _alone(root, lanes):
    sweeps.plot_lanes(name, config, root, lanes,
                      "vmapped, compiled" if config.compiled else "vmapped")  # fmt: skip
  return outcome.results


def _make_tracker(config: TrainConfig, run_dir: pathlib.Path, *, group: Optional[str],
                  label: str) -> WandbLogger:  # fmt: skip
  """With `--track`, a learner's W&B run (its config: the directory's config.json; in
  `group`, the root's name, where the directory is a learner's or a process's below it;
  named by the directory and a sweep's `label`)."""
  tracking = config.tracking
  with refusals():  # W&B refusing the run (no API key): one line
    return WandbLogger(
        run_dir,
        project=tracking.wandb_project,
        entity=tracking.wandb_entity,
        mode=tracking.wandb_mode,
        config=read_json(run_dir / "config.json"),
        group=group,
        name=f"{label}{run_dir.name}",  # a sweep's learners: "learning_rate=0.001 seed0"
    )


def _close_quietly(logger: Logger) -> None:
  """Closes a logger made before a failure, which is the error to show."""
  with contextlib.suppress(Exception):
    logger.close()


def _added(add_logger: Callable, run_dir: pathlib.Path, seed: int) -> Logger:
  """`add_logger(run_dir, seed)`, checked to be a Logger that does not write the learner's
  own metrics.jsonl (the script's RunLogger does: every line would be written twice)."""
  own = run_dir / METRICS_FILE
  existed = own.exists()
  logger = add_logger(run_dir, seed)
  check_logger(logger, "add_logger's logger")
  if isinstance(logger, RunLogger) and logger.metrics_path.resolve() == own.resolve():
    logger.close()
    if not existed:  # the refused logger's empty file: the folder is left as it was found
      own.unlink(missing_ok=True)
    raise ValueError(f"add_logger returned a RunLogger of {run_dir}, which the run logs to "
                     "already: every line would be written twice; add another kind of "
                     "logger, or one for another folder")  # fmt: skip
  return logger


def _abandon_distributed_job(
    name: str, config: TrainConfig, root_dir: pathlib.Path, error: Exception
) -> None:
  """Ends this process of a multi-process job after an error (exit code 1).

  Usually the error is a collective that failed because another process died (gloo:
  "Connection reset by peer" or "closed by peer"). Nothing can go on after that, and
  exiting normally would not end the process either: JAX's exit handler enters the
  distributed runtime's shutdown barrier, which waits for the dead process until the
  heartbeat timeout (100 s) and then aborts. So: report the error and where to resume from, and
  leave at once. The logs and the checkpointer are closed by then, so the last
  checkpoint is whole.
  """
  import traceback

  traceback.print_exception(error)
  saved = checkpoint.checkpoint_steps(root_dir / "checkpoints")
  where = (f"The last checkpoint, at env step {saved[-1]:,} in {root_dir / 'checkpoints'}, is "
           "intact: start every process again with --resume." if saved else
           "No checkpoint was written yet: start every process again (--resume starts over).")  # fmt: skip
  print(
      f"[{name}] process {config.parallel.process_id} of {config.parallel.num_processes} "
      "stopped: "
      f"{type(error).__name__}: {error}\n[{name}] a multi-process job cannot go on "
      "once one of its processes has failed (a collective failing with 'Connection "
      f"reset by peer' or 'closed by peer' means another process died: see its log). {where}",
      file=sys.stderr,
      flush=True,
  )
  sys.stdout.flush()
  os._exit(1)
