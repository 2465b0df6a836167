"""A run directory: config.json, metrics.jsonl, TensorBoard events, a learning-curve PNG.

The run directory is described in docs/design.md (Contract 3). `RunLogger.log(record)`
appends one JSON object per line to metrics.jsonl (format: `analysis.metrics_file`; at least
`env_steps`, `wall_time_s`, `episode_return`), writes the same scalars to TensorBoard, and
prints a progress line (a tqdm bar on a terminal, plain lines otherwise).

A logger is anything with `log(record)`, `truncate(num_lines)` and `close()` (`Logger`);
the driver gives each seed's lines to one. `WandbLogger` sends them to Weights & Biases
(`--track`), and `MultiLogger(RunLogger(...), WandbLogger(...))` sends them to both.
"""

from __future__ import annotations

from importlib import metadata
import json
import os
import pathlib
import platform
import shutil
import subprocess
import sys
import time
from typing import Any
from typing import Optional
from typing import Protocol
from typing import Sequence
from typing import get_args

from offpolicy_ac._extras import require
from offpolicy_ac._oserrors import naming
from offpolicy_ac.analysis import metrics_file
from offpolicy_ac.analysis.metrics_file import METRICS_FILE
from offpolicy_ac.analysis.metrics_file import config_jsonable
from offpolicy_ac.analysis.metrics_file import jsonable
from offpolicy_ac.analysis.plotting import plot_runs
from offpolicy_ac.training.config import WandbMode


class Logger(Protocol):
  """Where a run's metrics lines go (one logger per seed)."""

  def log(self, record: dict) -> None:
    """Records one metrics line (at least `env_steps`, `wall_time_s`, `episode_return`)."""

  def truncate(self, num_lines: int) -> None:
    """On resume: the run goes on after its first `num_lines` lines."""

  def close(self) -> None:
    """Flushes and releases what the logger holds."""


_RECORDED_PACKAGES = ("jax", "jaxlib", "flax", "optax", "chex", "rlax", "envpool", "numpy",
                      "offpolicy_ac")  # fmt: skip


def package_versions() -> dict[str, str]:
  """The versions of Python and of the packages a run's results depend on."""
  versions = {"python": platform.python_version()}
  for name in _RECORDED_PACKAGES:
    try:
      versions[name] = metadata.version(name)
    except Exception:  # pylint: disable=broad-except
      versions[name] = "not installed"
  return versions


def git_revision() -> str:
  """The git revision of the checkout holding this package ('unknown' outside one)."""
  here = pathlib.Path(__file__).resolve().parent
  git = lambda *args, check=False: subprocess.run(  # noqa: E731
      ["git", *args], cwd=here, capture_output=True, text=True, timeout=10, check=check
  ).stdout.strip()
  try:
    rev = git("rev-parse", "HEAD", check=True)
    return rev + ("+dirty" if git("status", "--porcelain", "--untracked-files=no") else "")
  except (OSError, subprocess.SubprocessError):
    return "unknown"


def write_atomic(path: pathlib.Path, data: str | bytes) -> None:
  """Writes `path` whole or not at all: into `<path>.tmp`, synced to the disk, then renamed
  onto `path`, and the rename synced (a failed write, a full disk, leaves no .tmp behind;
  a power loss, the old file or the new one)."""
  tmp = path.with_name(path.name + ".tmp")
  try:
    with open(tmp, "wb") as f:
      f.write(data.encode() if isinstance(data, str) else data)
      f.flush()
      os.fsync(f.fileno())
  except BaseException as e:
    tmp.unlink(missing_ok=True)
    if isinstance(e, OSError) and e.filename is None:  # a write's (a full disk): name it
      e.filename = str(path)
    raise
  os.replace(tmp, path)
  sync_directory(path.parent)


def sync_directory(path: pathlib.Path) -> None:
  """Syncs the directory `path`'s entries (a file renamed or made there) to the disk, where
  the filesystem can (not all can sync a directory)."""
  try:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
  except OSError:
    return
  try:
    os.fsync(fd)
  except OSError:
    pass
  finally:
    os.close(fd)


PROVENANCE = ("git_revision", "versions", "command", "created")
"""config.json's record of what wrote it: kept as the run started by a resume, which adds
its own to `resumed`."""


def write_config(run_dir: pathlib.Path, config: Any, extra: dict | None = None,
                 started: dict | None = None) -> dict:  # fmt: skip
  """Writes config.json: the full config, git revision, package versions, command line
  and time (`PROVENANCE`). `started`: the config.json of the run this process resumes,
  whose provenance stays, with this resume's appended to its `resumed` list."""
  now = {
      "git_revision": git_revision(),
      "versions": package_versions(),
      "command": sys.argv,
      "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
  }
  record = {"config": config_jsonable(config), **now}
  if started is not None:
    record.update({k: started[k] for k in PROVENANCE if k in started})
    record["resumed"] = [*started.get("resumed", []), now]
  if extra:
    record.update(jsonable(extra))
  write_atomic(run_dir / "config.json", json.dumps(record, indent=2))
  return record


def _scalars(record: dict) -> dict:
  """The numbers of a metrics line (bools, strings and nulls left out)."""
  return {
      k: v for k, v in record.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
  }


class EventFile:
  """A TensorBoard event file in `directory`, written line by line in the caller's thread:
  each `add_scalars` is on the disk (flushed) when it returns, and a write error (a full
  disk) is raised there. (tensorboardX's SummaryWriter writes from a thread of its own:
  when that thread died on a full disk, the next line waited forever on its queue.)"""

  def __init__(self, directory: pathlib.Path):
    from tensorboardX.event_file_writer import EventsWriter  # pylint: disable=import-outside-toplevel
    from tensorboardX.proto.event_pb2 import Event  # pylint: disable=import-outside-toplevel
    from tensorboardX.summary import scalar  # pylint: disable=import-outside-toplevel

    self.directory, self._event, self._scalar = directory, Event, scalar
    with naming(directory):
      directory.mkdir(parents=True, exist_ok=True)
      self._events = EventsWriter(str(directory / "events"))

  def add_scalars(self, scalars: dict[str, float], step: int, flush: bool = True) -> None:
    """One event per scalar, at `step` (env steps), then (with `flush`) a flush."""
    with naming(self.directory):
      for name, value in scalars.items():
        self._events.write_event(self._event(wall_time=time.time(), step=step,
                                             summary=self._scalar(name, value)))  # fmt: skip
    if flush:
      self.flush()

  def flush(self) -> None:
    """Writes the events to the disk (tensorboardX syncs the file: once per line)."""
    with naming(self.directory):
      self._events.flush()

  def close(self) -> None:
    """Flushes and closes the file; once (a second call does nothing)."""
    events, self._events = self._events, None
    if events is not None:
      with naming(self.directory):
        events.close()


class RunLogger:
  """Writes metrics.jsonl, TensorBoard scalars, a PNG, and shows progress."""

  def __init__(
      self,
      run_dir: str | os.PathLike,
      *,
      total_env_steps: int,
      title: str = "",
      plot_every_s: float = 30.0,
      progress: bool | None = None,
      tensorboard: bool = True,
  ):
    self.run_dir = pathlib.Path(run_dir)
    self.run_dir.mkdir(parents=True, exist_ok=True)
    self.metrics_path = self.run_dir / METRICS_FILE
    self._file = open(self.metrics_path, "a", buffering=1)
    self._title = title
    self._plot_every_s = plot_every_s
    self._last_plot = time.monotonic()
    self._tensorboard, self._writer = tensorboard, None  # opened with the first line
    self._written = False  # a line logged, or the lines kept by truncate: close plots them
    use_bar = sys.stderr.isatty() if progress is None else progress
    self._bar = None
    if use_bar:
      from tqdm import tqdm

      self._bar = tqdm(total=total_env_steps, unit="step", unit_scale=True, dynamic_ncols=True)
    self._steps_shown = 0

  def log(self, record: dict) -> None:
    record = jsonable(record)
    with naming(self.metrics_path):  # a full disk: the run stops naming the file
      self._file.write(metrics_file.encode_line(record))
    self._written = True
    step = int(record["env_steps"])
    self._add_scalars(record)
    ret = record.get("episode_return")
    ev = record.get("eval_return")
    sps = record.get("env_steps_per_s")
    text = f"return {ret:8.2f}" if ret is not None else "return      n/a"
    if ev is not None:
      text += f" | eval {ev:8.2f}"
    if sps is not None:
      text += f" | {sps:9.0f} steps/s"
    if self._bar is not None:
      self._bar.update(step - self._steps_shown)
      self._bar.set_postfix_str(text)
    else:
      prefix = f"[{self._title}] " if self._title else ""
      print(f"{prefix}steps {step:>9d} | {record['wall_time_s']:7.1f}s | {text}", flush=True)
    self._steps_shown = step
    if time.monotonic() - self._last_plot > self._plot_every_s:
      self.plot()

  def _add_scalars(self, record: dict, flush: bool = True) -> None:
    if self._tensorboard and self._writer is None:
      self._writer = EventFile(self.run_dir / "tensorboard")
    if self._writer is not None:
      scalars = {k: v for k, v in _scalars(record).items() if k != "env_steps"}
      self._writer.add_scalars(scalars, int(record["env_steps"]), flush=flush)

  def truncate(self, num_lines: int) -> None:
    """Keeps the first `num_lines` lines of metrics.jsonl (resuming drops what was
    logged after the checkpoint, including a cut-off last line), and writes TensorBoard's
    events anew from them: the event files of a run stopped after its checkpoint hold
    points past it (or, written by an older version from a thread that flushed every two
    minutes, lack some before it), and a resume logs only the points after its checkpoint."""
    self._file.close()
    data = self.metrics_path.read_bytes() if self.metrics_path.exists() else b""
    # Bytes: what follows the kept lines (a line cut by a kill, junk) is dropped unread.
    lines = [line for line in data.splitlines(keepends=True) if line.endswith(b"\n")]
    kept = [line.decode("utf-8", "replace") for line in lines[:num_lines]]
    if len(kept) < num_lines:
      raise ValueError(
          f"{self.metrics_path} has {len(kept)} complete lines, the checkpoint "
          f"expects {num_lines}"
      )
    records = []
    for number, line in enumerate(kept, 1):  # the run goes on after them: they must be whole
      try:
        records.append(metrics_file.decode_line(line))
      except ValueError:  # (json.JSONDecodeError too)
        raise ValueError(f"{self.metrics_path}: line {number} is damaged (not a metrics "
                         f"line): {line.strip()[:80]!r}") from None  # fmt: skip
    write_atomic(self.metrics_path, "".join(kept))
    self._file = open(self.metrics_path, "a", buffering=1)
    self._written = True
    if records:
      self._steps_shown = int(records[-1]["env_steps"])
    if self._tensorboard:
      if self._writer is not None:
        self._writer.close()
        self._writer = None
      shutil.rmtree(self.run_dir / "tensorboard", ignore_errors=True)
      for record in records:
        self._add_scalars(record, flush=False)
      if self._writer is not None:
        self._writer.flush()  # once, not once per line

  def plot(self) -> pathlib.Path | None:
    """Writes learning_curve.png from metrics.jsonl (episode and eval returns)."""
    self._last_plot = time.monotonic()
    try:
      return plot_runs([self.run_dir], self.run_dir / "learning_curve.png", title=self._title)
    except Exception as e:  # plotting must never kill a run
      print(f"warning: could not plot: {e}", file=sys.stderr)
      return None

  def close(self) -> None:
    """Plots, and closes the files (metrics.jsonl too where TensorBoard's close fails: a
    full disk); once (a second call plots again, nothing more)."""
    try:
      if self._written:  # not after a refused resume, which must leave the run as it was
        self.plot()
      if self._bar is not None:
        self._bar.close()
      writer, self._writer = self._writer, None
      if writer is not None:
        writer.close()
    finally:
      self._file.close()


class MultiLogger:
  """Gives every call to each of `loggers`, in order (close: all of them, even if one
  fails; the first error is raised after)."""

  def __init__(self, *loggers: Logger):
    self.loggers = loggers

  def log(self, record: dict) -> None:
    for logger in self.loggers:
      logger.log(record)

  def truncate(self, num_lines: int) -> None:
    for logger in self.loggers:
      logger.truncate(num_lines)

  def close(self) -> None:
    errors = []
    for logger in self.loggers:
      try:
        logger.close()
      except Exception as e:  # pylint: disable=broad-except
        errors.append(e)
    if errors:
      raise errors[0]


def check_logger(
    logger: Any, where: str, methods: Sequence[str] = ("log", "truncate", "close")
) -> None:
  """Refuses (ValueError) `logger` unless it has the Logger `methods` it will be called
  with (`where` names it)."""
  missing = [m for m in methods if not callable(getattr(logger, m, None))]
  if missing:
    raise ValueError(f"{where} is {logger!r}, which has no {', '.join(missing)}: a Logger "
                     "has log(record), truncate(num_lines) and close()")  # fmt: skip


def check_loggers(loggers: Sequence[Any], resume: bool = False) -> None:
  """Refuses (ValueError), before a run starts, loggers that would lose or mix its lines:
  one without `log` (or `truncate`, to `resume`: what the driver calls; it failed at the
  first metrics line, after an interval of training), the same logger object twice (two
  learners' lines interleaved in one file), or two `RunLogger`s on one metrics.jsonl
  (every line written twice). Looks inside `MultiLogger`s."""
  seen: dict[int, str] = {}
  files: dict[pathlib.Path, str] = {}
  methods = ("log", "truncate") if resume else ("log",)

  def walk(logger: Any, where: str) -> None:
    check_logger(logger, where, methods)
    if id(logger) in seen:
      raise ValueError(f"{where} is the same logger object as {seen[id(logger)]}: their lines "
                       "would go to it mixed; give each learner a logger of its own")  # fmt: skip
    seen[id(logger)] = where
    if isinstance(logger, RunLogger):
      path = logger.metrics_path.resolve()
      if path in files:
        raise ValueError(f"{where} and {files[path]} both write {logger.metrics_path}: its "
                         "lines would be written twice, or two learners' mixed")  # fmt: skip
      files[path] = where
    inner = logger.loggers if isinstance(logger, MultiLogger) else ()
    for k, part in enumerate(inner):
      walk(part, f"{where}'s logger {k}")

  for k, logger in enumerate(loggers):
    walk(logger, f"logger {k}")


WANDB_MODES = get_args(WandbMode)
WANDB_STATE_FILE = "wandb.json"


def require_wandb() -> Any:
  """The wandb module; raises ImportError naming the extra to install when it does not
  import (not installed, or installed and failing: its own error is quoted)."""
  return require("--track (Weights & Biases logging)", "wandb", "track")


def _new_run_id() -> str:
  """8 random lowercase letters and digits, as W&B's own run ids."""
  import secrets
  import string

  return "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))


class WandbLogger:
  """Sends each metrics line's numbers to a Weights & Biases run, against `env_steps`.

  The W&B run is named `name` (default: after the run directory), its config is
  config.json's content, and its id is kept in <run_dir>/wandb.json, so a resumed run
  continues the same W&B run.
  Lines the W&B run already holds (logged before an interruption, then logged again
  after resuming from the checkpoint) are not sent twice. Files go where wandb puts
  them (`WANDB_DIR`, else ./wandb); `mode='offline'` writes them for a later `wandb sync`;
  None leaves the choice to wandb (its `WANDB_MODE` variable, else online).
  """

  def __init__(
      self,
      run_dir: str | os.PathLike,
      *,
      project: str,
      entity: Optional[str] = None,
      mode: Optional[str] = None,
      config: Optional[dict] = None,
      group: Optional[str] = None,
      name: Optional[str] = None,
  ):
    if mode is not None and mode not in WANDB_MODES:
      raise ValueError(f"wandb_mode must be one of {WANDB_MODES}, got {mode!r}")
    wandb = require_wandb()

    self.run_dir = pathlib.Path(run_dir)
    self._state_path = self.run_dir / WANDB_STATE_FILE
    state = json.loads(self._state_path.read_text()) if self._state_path.exists() else {}
    self.run_id: str = state.get("id") or _new_run_id()
    self._logged_steps: Optional[int] = state.get("logged_env_steps")
    try:
      self._run = wandb.init(
          project=project,
          entity=entity,
          mode=mode,
          id=self.run_id,
          name=name or self.run_dir.name,
          group=group,
          config=config,
          resume="allow",
          reinit="create_new",  # several seeds of one process: one W&B run each
          # wandb reads WANDB_DIR once per process; each run reads it again.
          dir=os.environ.get("WANDB_DIR"),
      )
    except wandb.errors.Error as e:  # no API key, a project it may not write, ...
      raise ValueError(f"--track: W&B could not start its run: {e} (`wandb login`, or "
                       "--wandb-mode offline)") from e  # fmt: skip
    self._run.define_metric("*", step_metric="env_steps")
    self._save_state()

  def _save_state(self) -> None:
    state = {"id": self.run_id, "logged_env_steps": self._logged_steps}
    write_atomic(self._state_path, json.dumps(state))

  def log(self, record: dict) -> None:
    record = jsonable(record)
    step = int(record["env_steps"])
    if self._logged_steps is not None and step <= self._logged_steps:
      return  # already in the W&B run (logged before an interruption)
    self._run.log(_scalars(record))
    self._logged_steps = step
    self._save_state()

  def truncate(self, num_lines: int) -> None:
    """W&B keeps what it has; the lines logged again after a resume are skipped."""
    del num_lines

  def close(self) -> None:
    self._run.finish()
