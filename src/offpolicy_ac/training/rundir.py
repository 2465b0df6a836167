"""The run directory (docs/design.md, contract 3): writing its config.json, parameters and
summary, and reading a run back as Python objects.

    check_or_write_config(name, args, run_dir, resume)  # refuse overwriting / a changed config
    write_results(name, run_dir, result, protocol)      # parameters, summary.json

    run = load_run("runs/impala-cartpole")                  # the final parameters
    run = load_run("runs/impala-cartpole", checkpoint=10240)  # a checkpoint's (env steps)
    env = run.make_env(5, seed=0)                           # the run's task, 5 environments
    returns = evaluate(env, run.greedy, run.acting, num_episodes=5)
    action = run.greedy_policy()(observation)               # [B, ...] -> [B, ...]
    action = run.behaviour_policy(seed=0)(observation)      # sampled as in training

Any run directory written by the experiment scripts (`run_experiment`) loads: the agent is
rebuilt from config.json exactly as the script built it (the algorithm's factory, the
saved agent config, the training pools' `EnvSpec`), and its parameters come from
`final_params.msgpack` or from a checkpoint. The policy acts on observations transformed
as in training: the data transformer's state (observation statistics with
`--normalize-observations`) comes from `final_transform.msgpack` or the same checkpoint.

Runs on a JAX environment ("gymnax:...", "brax:...": one compiled program,
`training.make_train`) load alike: the agent gets the functional environment's spec,
`make_env` gives a host pool over it (`envs.FunctionalPool`), and a learner of a run of
several seeds or of a sweep (`<run-dir>/seed<k>`, `<run-dir>/<setting>/seed<k>`) finds its
checkpoints in `<run-dir>/checkpoints`, among the other learners'. So does a lane of a
sweep on an envpool task (the vmapped learner's lanes, `training/sweeps.py`).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import datetime
import fcntl
import json
import numbers
import os
import pathlib
import re
import shlex
import shutil
import socket
import sys
import time
from typing import Any
from typing import Callable
from typing import NamedTuple
from typing import Optional
from typing import Sequence
import uuid
import warnings
import zlib

import flax.serialization
import jax
import numpy as np

from offpolicy_ac import envs
from offpolicy_ac.agents.base import Agent
from offpolicy_ac.agents.hyperparams import canonical_sweep
from offpolicy_ac.agents.registry import AGENTS
from offpolicy_ac.agents.registry import make_agent
from offpolicy_ac.analysis.metrics_file import config_jsonable
from offpolicy_ac.analysis.metrics_file import read_json
from offpolicy_ac.training import records
from offpolicy_ac.training.checkpoint import CHECKSUMS
from offpolicy_ac.training.checkpoint import CheckpointLayoutError
from offpolicy_ac.training.checkpoint import DamagedCheckpointError
from offpolicy_ac.training.checkpoint import checkpoint_steps
from offpolicy_ac.training.checkpoint import incomplete_steps
from offpolicy_ac.training.checkpoint import read_checkpoint
from offpolicy_ac.training.checkpoint import read_record
from offpolicy_ac.training.checkpoint import set_aside_checkpoints
from offpolicy_ac.training.checkpoint import written_steps
from offpolicy_ac.training.config import TrainConfig
from offpolicy_ac.training.config import fields_without_effect
from offpolicy_ac.training.config import without_removed_fields
from offpolicy_ac.training.driver import RunResult
from offpolicy_ac.training.learner import Acting
from offpolicy_ac.training.learner import make_policies
from offpolicy_ac.training.learner import make_transformer
from offpolicy_ac.training.learner import take_lane
from offpolicy_ac.training.logger import write_atomic
from offpolicy_ac.training.logger import write_config
from offpolicy_ac.training.sources import make_env
from offpolicy_ac.training.sources import task_spec

FINAL_PARAMS = "final_params.msgpack"
FINAL_TRANSFORM = "final_transform.msgpack"
BEST_PARAMS = "best_params.msgpack"
BEST_TRANSFORM = "best_transform.msgpack"
BEST_RECORD = "best.json"
BEST_AT_CHECKPOINT = "best_at_checkpoint"
"""The folder of a run directory that keeps the best files as they were at the newest
checkpoint, once a later evaluation replaces them (`BestFiles`)."""
SEEDS_RECORD = "seeds.json"
"""At the root of a run whose seeds train one after the other (each a run of its own in
seed<k>/): the seeds it trains, `{"seeds": [0, 1, ...]}`, which a resume must train too."""

RESUMABLE_CHANGES = (
    "train.budget.total_env_steps",
    "train.parallel.coordinator_address",
    "train.tracking.track",
    "train.tracking.wandb_project",
    "train.tracking.wandb_entity",
    "train.tracking.wandb_mode",
    "resume",
    "run_dir",
    "import_modules",
)
"""Config fields that may change when a run is resumed."""


def _eval_interval(config: dict) -> int:
  return TrainConfig.from_dict(config["train"]).eval_interval


NULL_MEANS_DERIVED: dict[str, Callable[[dict], Any]] = {
    "train.eval.eval_every": _eval_interval,
    "demo_batch_size": lambda config: config["train"]["replay"]["mini_batch_size"],  # sqil.py's
}
"""Config fields (dotted) whose null stands for a value derived from the other fields (a
script's config as config.json holds it -> that value): on resume, null and that value
given explicitly are the same setting (`config_differences`)."""


LOCK = ".lock"


class RunDirectoryInUse(RuntimeError):
  """Another process holds the run directory's lock."""


@contextlib.contextmanager
def locked(run_dir: pathlib.Path):
  """Holds an OS-level lock on `run_dir` (`fcntl.flock` of the directory itself and of
  `run_dir/.lock`) while the context runs, so that one process at a time writes a run
  directory.

  The lock file says who holds it (host, pid, start time, command line). The kernel
  releases the locks when their process ends, however it ends (kill -9 included), so a
  lock left by a dead process never blocks, and removing a .lock file that looks stale
  does not let a second process in: the directory stays locked. On a shared filesystem
  (NFS), which may not lock directories, the lock file's lock is the server's, released
  when the holder's host stops renewing it.

  A directory this call made is removed again, before its lock is released, when the
  context ends with an error and nothing but the lock file was written there (a refused
  run); one that another process made is never removed. In a directory that was there,
  such a run removes the lock file it made, leaving the directory as it found it.

  Raises:
    RunDirectoryInUse: another process holds it (the message names the holder), or
      removed it while this one locked it.
    ValueError: `run_dir` cannot be made, or written.
  """
  try:
    made = _made_here(run_dir)
  except OSError as e:  # no permission, a read-only or missing filesystem, a file
    raise ValueError(f"the run directory {run_dir} cannot be made ({e.strerror}): choose "
                     "another --run-dir") from e  # fmt: skip
  dir_fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY)
  try:
    dir_locked = _lock_or_refuse(dir_fd, run_dir, directory=True)
    held_before = None if made else _listing(run_dir)
    try:
      fd = os.open(run_dir / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:  # a read-only filesystem, no permission to write in it
      raise ValueError(f"the run directory {run_dir} cannot be written ({e.strerror}): "
                       "choose another --run-dir") from e  # fmt: skip
    try:
      _lock_or_refuse(fd, run_dir, directory=False)
      _check_still_there(run_dir, dir_fd)
      me = {"host": socket.gethostname(), "pid": os.getpid(),
            "since": time.strftime("%Y-%m-%d %H:%M:%S"), "command": " ".join(sys.argv)}  # fmt: skip
      os.ftruncate(fd, 0)
      os.pwrite(fd, json.dumps(me).encode(), 0)
      try:
        yield
      except BaseException:
        if made:
          remove_if_unused(run_dir)  # still locked: no other process is in it
        elif dir_locked and held_before is not None and LOCK not in held_before:
          with contextlib.suppress(OSError):  # (the directory's lock keeps others out)
            if _listing(run_dir) == held_before | {LOCK}:
              (run_dir / LOCK).unlink()
        raise
    finally:
      os.close(fd)  # releases the file's lock
  finally:
    os.close(dir_fd)  # and the directory's


def _made_here(path: pathlib.Path) -> bool:
  """Makes the directory `path` (and the folders above it); whether this call made it
  (False: it was there already)."""
  try:
    path.mkdir(parents=True)
    return True
  except FileExistsError:
    if not path.is_dir():
      raise
    return False


def _check_still_there(run_dir: pathlib.Path, dir_fd: int) -> None:
  """Refuses a lock taken on a directory that another process removed (a refused run
  removing the directory it made) between its opening and its locking here."""
  held, there = os.fstat(dir_fd), None
  with contextlib.suppress(OSError):
    there = os.stat(run_dir)
  if there is None or (there.st_dev, there.st_ino) != (held.st_dev, held.st_ino):
    raise RunDirectoryInUse(f"{run_dir} was removed by another process as this one locked it "
                            "(a run refused there): start again")  # fmt: skip


def remove_if_unused(path: pathlib.Path) -> None:
  """Removes the directory `path` if it holds nothing but a lock file (a refused run's); a
  directory that holds anything else, or is gone, is left as it is."""
  with contextlib.suppress(OSError):  # gone, or written meanwhile (the rmdir fails)
    if set(os.listdir(path)) <= {LOCK}:
      (path / LOCK).unlink(missing_ok=True)
      os.rmdir(path)


def _listing(path: pathlib.Path) -> Optional[set[str]]:
  """The names in the directory `path` (None: it cannot be read)."""
  try:
    return set(os.listdir(path))
  except OSError:
    return None


def _lock_or_refuse(fd: int, run_dir: pathlib.Path, directory: bool) -> bool:
  """Locks `fd` (the run directory's, or its lock file's) or refuses, naming the holder
  its lock file names; whether it is locked. A directory that cannot be locked (NFS) is
  left to the file's (False)."""
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return True
  except BlockingIOError:
    try:
      holder = (run_dir / LOCK).read_text(errors="replace").strip() or "unknown"
    except OSError:
      holder = f"unknown: its {LOCK} file was removed"
    raise RunDirectoryInUse(
        f"{run_dir} is in use by another process ({holder}): wait for it to finish, stop "
        "it, or choose another --run-dir"
    ) from None
  except OSError:
    if not directory:
      raise
    return False


def _crc32(data: bytes) -> str:
  """The CRC-32 of `data` as the checksum files and records write it (8 hex digits)."""
  return f"{zlib.crc32(data):08x}"


def _checksum_path(path: pathlib.Path) -> pathlib.Path:
  return path.with_name(path.name + ".crc32")


def _checksums_in(checksum: pathlib.Path) -> list[str]:
  """The CRC-32s a checksum file lists (none when it is missing or not text: damaged)."""
  try:
    return checksum.read_bytes().decode("ascii").split()
  except (FileNotFoundError, UnicodeDecodeError):
    return []


def save_params(path: pathlib.Path, params: Any) -> str:
  """Writes parameters (flax msgpack) atomically, and their CRC-32 beside them
  (`<path>.crc32`), which `load_params` checks. While the file is replaced, the checksum
  file holds the old file's CRC beside the new one's, so a kill at any moment leaves a
  pair that matches. Returns the CRC-32 (8 hex digits)."""
  path = pathlib.Path(path).expanduser()
  checksum = _checksum_path(path)
  data = flax.serialization.to_bytes(jax.device_get(params))
  new = _crc32(data)
  old = []  # the file being replaced, when it is intact
  if path.exists() and checksum.exists():
    current = _crc32(path.read_bytes())
    old = [current] if current in _checksums_in(checksum) else []
  write_atomic(checksum, " ".join([new, *old]) + "\n")
  write_atomic(path, data)
  write_atomic(checksum, f"{new}\n")
  return new


def load_params(path: str | os.PathLike, template: Any) -> Any:
  """Reads parameters written by `save_params` into the structure of `template`.

  Warns (RuntimeWarning) when the checksum file is missing: the file is read unchecked.

  Raises:
    DamagedCheckpointError: the file does not match the checksum written with it.
    ValueError: the file is not parameters of `template`'s structure and shapes.
  """
  path = pathlib.Path(path).expanduser()
  data = path.read_bytes()
  checksum = _checksum_path(path)
  if not checksum.exists():
    warnings.warn(
        f"{path} has no checksum beside it ({checksum.name}: removed, or offpolicy_ac 0.2 or "
        "earlier wrote the file): it is read unchecked",
        RuntimeWarning,
        stacklevel=2,
    )
  elif _crc32(data) not in _checksums_in(checksum):
    raise DamagedCheckpointError(
        f"{path} does not match its checksum ({checksum.name}): the file is damaged or "
        "incomplete"
    )
  try:
    loaded = flax.serialization.from_bytes(template, data)
  except Exception as e:  # pylint: disable=broad-except
    raise ValueError(f"{path} could not be read as the run's parameters: {e}") from e
  return _check_shapes(template, loaded, str(path))


def _check_shapes(template: Any, loaded: Any, where: str) -> Any:
  """`loaded`, refused (ValueError) where its shapes are not `template`'s: parameters of
  another agent (a run's: another than its config.json describes, an edited config, changed
  networks)."""
  shape = lambda x: tuple(getattr(x, "shape", np.shape(x)))  # noqa: E731
  for (path, want), got in zip(jax.tree_util.tree_flatten_with_path(template)[0],
                               jax.tree.leaves(loaded)):  # fmt: skip
    if shape(want) != shape(got):
      raise ValueError(f"{where} holds parameters of other shapes than the template's "
                       f"({jax.tree_util.keystr(path)}: {shape(got)}, the template's "
                       f"{shape(want)}; a run's template is the agent its config.json "
                       "describes)")  # fmt: skip
  return loaded


def default_run_dir(name: str, config: TrainConfig) -> str:
  """runs/<name>-<task>-seed<k>-<time>, created here: a run started in the same second
  gets the next free name (-2, -3, ...). The task's ':' is a '-' (scp reads ':' as a host).
  Refused (ValueError) inside another run's directory, as `check_new_run_dir` refuses."""
  inside = enclosing_run(pathlib.Path("runs", "new"))
  if inside is not None:
    raise ValueError(f"the default run directory, ./runs/..., would be inside the directory "
                     f"of the run in {inside} (the working directory is): give --run-dir "
                     "outside it, or start from another directory")  # fmt: skip
  task = config.env.env_id.replace(":", "-")
  base = os.path.join(
      "runs", f"{name}-{task}-seed{config.budget.seed}-{time.strftime('%Y%m%d-%H%M%S')}"
  )
  try:
    os.makedirs("runs", exist_ok=True)
  except OSError as e:  # a file named runs, or no permission
    raise ValueError(f"the default run directory cannot be made in ./runs ({e.strerror}): "
                     "give --run-dir") from e  # fmt: skip
  for k in range(1, 1000):
    path = base if k == 1 else f"{base}-{k}"
    with contextlib.suppress(FileExistsError):
      os.mkdir(path)  # atomic: of two processes, one gets the name
      return path
  raise FileExistsError(f"{base}: no free run directory name; give --run-dir")


def _flatten(d: Any, prefix: str = "") -> dict:
  if isinstance(d, dict):
    out = {}
    for k, v in d.items():
      out.update(_flatten(v, f"{prefix}{k}."))
    return out
  return {prefix[:-1]: d}


def flat_settings(args: Any) -> dict[str, Any]:
  """A script's `args` as config.json records them, by dotted field
  ("agent.learning_rate": 0.003)."""
  return _flatten(config_jsonable(args))


def config_differences(old: dict, new: dict, defaults: Optional[dict] = None) -> list[str]:
  """Fields (dotted) whose values differ, ignoring RESUMABLE_CHANGES. A field the old
  config lacks (added to the library since) counts as unchanged when the new value is
  its default in `defaults`: a new field's default keeps the old behaviour. A field of
  NULL_MEANS_DERIVED null in one config and set in the other is unchanged when the set
  value is the one the null stands for (derived from that config's other fields):
  `--demo-batch-size 32` resumes a run that took the default, --mini-batch-size's 32. A
  field that has no effect in either run (`fields_without_effect`: `vmap_seeds` where the
  seeds cannot share a vmapped learner) is not a difference."""
  a, b = _flatten(old), _flatten(new)
  known = _flatten(defaults) if defaults is not None else {}
  for k in set(b) - set(a):
    if k in known:
      a[k] = known[k]
  inert = _without_effect(old) & _without_effect(new)
  return sorted(k for k in set(a) | set(b)
                if k not in RESUMABLE_CHANGES and k not in inert
                and not _same_setting(a.get(k), b.get(k))
                and not _same_derived(k, (old, a.get(k)), (new, b.get(k))))  # fmt: skip


def _without_effect(config: dict) -> set[str]:
  """The dotted fields of a script's config (as config.json holds it) that have no effect
  in its run (`fields_without_effect`); none where the config cannot say."""
  try:
    train = TrainConfig.from_dict(config["train"])
  except (KeyError, TypeError, ValueError):
    return set()
  names = fields_without_effect(train)
  return {k for k in _flatten({"train": config["train"]}) if k.rsplit(".", 1)[-1] in names}


def _derived_value(field: str, config: dict, value: Any) -> Any:
  """The value a NULL_MEANS_DERIVED `field` (dotted) stands for in `config` (a script's
  config as config.json holds it): `value` when it is set or `field` is not one of them,
  None when the config cannot say (another layout, damaged)."""
  if value is not None or field not in NULL_MEANS_DERIVED:
    return value
  try:
    return NULL_MEANS_DERIVED[field](config)
  except (KeyError, TypeError, ValueError):
    return None


def _setting(field: str, config: dict, value: Any) -> str:
  """`value` as JSON, with the value a null of NULL_MEANS_DERIVED stands for in `config`
  ("null = 32")."""
  derived = _derived_value(field, config, value)
  return json.dumps(value) + (
      f" = {json.dumps(derived)}" if value is None and derived is not None else ""
  )


def _same_derived(field: str, old: tuple[dict, Any], new: tuple[dict, Any]) -> bool:
  """Whether a NULL_MEANS_DERIVED field null in one config (each as (config, value)) and
  set in the other is the same setting: the null's value, derived in its own config."""
  if field not in NULL_MEANS_DERIVED or (old[1] is None) == (new[1] is None):
    return False  # two nulls are equal, and two values compare as given
  was, now = _derived_value(field, *old), _derived_value(field, *new)
  return was is not None and _same_setting(was, now)


def _same_setting(old: Any, new: Any) -> bool:
  """Whether config.json's `old` value is the setting `new` (JSON values). A config.json
  written before 0-d JAX arrays and NumPy bools were numbers holds their str ("0.001" for
  jnp.float32(1e-3), "True"), the same setting as the number now written."""
  if old == new or not isinstance(old, str) or isinstance(new, str):
    return old == new
  if isinstance(new, bool):
    return old == str(new)
  if not isinstance(new, (int, float)):
    return False
  try:
    number = float(old)
  except ValueError:
    return False
  return number == new or any(t(number) == t(new) for t in (np.float32, np.float16))


def holds_run(run_dir: pathlib.Path) -> bool:
  """Whether a run logged, checkpointed or summed up anything there (a run refused before
  its first step leaves only config.json and an empty metrics.jsonl: not a run)."""
  metrics = run_dir / "metrics.jsonl"
  checkpoints = run_dir / "checkpoints"
  return (
      (metrics.exists() and metrics.stat().st_size > 0)
      or (checkpoints.exists() and any(checkpoints.iterdir()))
      or (run_dir / "summary.json").exists()
  )


ROOM_FOR_RUN_FILES = 256
"""Bytes a run's own paths add below its directory, at most (a seed's and a process's
folders, orbax's `checkpoints/<step>.orbax-checkpoint-tmp/arrays/ocdbt.process_0/d/<hash>`)."""


def check_path_usable(run_dir: pathlib.Path) -> None:
  """Refuses (ValueError) a run directory that training would fail in only at its first
  checkpoint: a name that is not valid UTF-8 (bytes the locale could not decode, which
  orbax cannot pass on), or an absolute path too long for the run's files under it; and one
  that cannot be made: a link (it, or a folder above it) to a folder that does not exist."""
  absolute = os.path.abspath(run_dir)
  for path in (pathlib.Path(absolute), *pathlib.Path(absolute).parents):
    try:
      dangling = path.is_symlink() and not path.exists()
      target = os.readlink(path) if dangling else None
    except OSError:  # cannot be read: the lock's own message says why
      continue
    if dangling:
      raise ValueError(f"--run-dir {run_dir}: {path} is a link to {target}, which does not "
                       "exist: make that directory, or choose another --run-dir")  # fmt: skip
  try:
    absolute.encode("utf-8")
  except UnicodeEncodeError:
    raise ValueError(
        f"--run-dir {os.fsencode(absolute)!r}: the path is not valid UTF-8 text in this "
        "locale, and checkpoints cannot be written under it: choose another name (or run "
        "in a UTF-8 locale)"
    ) from None
  existing = pathlib.Path(absolute)
  while not existing.exists() and existing != existing.parent:
    existing = existing.parent
  try:
    path_max = os.pathconf(existing, "PC_PATH_MAX")
  except (OSError, ValueError):
    path_max = 4096
  length = len(os.fsencode(absolute))
  if length + ROOM_FOR_RUN_FILES > path_max:
    raise ValueError(
        f"--run-dir: its absolute path is {length:,} bytes long, and the run's files need "
        f"up to {ROOM_FOR_RUN_FILES} more within this filesystem's limit of {path_max:,}: "
        "choose a shorter path"
    )


def check_new_run_dir(run_dir: pathlib.Path) -> None:
  """Refuses a directory for a new run that lies inside another run's directory, or that
  holds files of something else (documents, another run's checkpoints/): the run's files
  would mix with them. A new or empty directory, one that a refused start left (lock files
  only) and a run's directory (`check_or_write_config` refuses or resumes it) pass."""
  parent = enclosing_run(run_dir)
  if parent is not None and not _one_of_its_seeds(parent, run_dir):
    raise ValueError(f"--run-dir {run_dir} is inside the directory of the run in {parent}: "
                     "choose a directory outside it")  # fmt: skip
  try:
    if not run_dir.is_dir() or _holds_a_run_at_its_top(run_dir):
      return
    foreign = sorted(p.name for p in run_dir.iterdir() if not _left_by_a_start(p))
  except OSError as e:
    raise ValueError(f"--run-dir {run_dir} cannot be read ({e.strerror})") from e
  if foreign:
    shown = ", ".join(foreign[:4]) + (", ..." if len(foreign) > 4 else "")
    raise ValueError(f"--run-dir {run_dir} holds other files ({shown}) and no run: choose a "
                     "new or empty directory")  # fmt: skip


def _holds_a_run_at_its_top(run_dir: pathlib.Path) -> bool:
  """Whether `run_dir` is a run's directory: its config.json, a run of seeds' seed<k>/, or a
  sweep's <setting>/seed<k>/ (a setting is `field=value,...`); not a folder of runs, one
  of which holds seeds (<run>/config.json, or <run>/seeds.json of seeds trained one after
  the other, beside <run>/seed<k>/)."""
  if (run_dir / "config.json").exists() or next(run_dir.glob("seed[0-9]*/config.json"), None):
    return True
  settings = {path.parent.parent for path in run_dir.glob("*=*/seed[0-9]*/config.json")}
  return any(not (setting / "config.json").exists() and not (setting / SEEDS_RECORD).exists()
             for setting in settings)  # fmt: skip


def _canonical_sweep(config: dict, args: Any) -> dict:
  """A run's config.json config with its sweep as `sweeps.canonical_sweep` writes it (runs
  written before kept it as typed: `lambda=...`, `1e-3`)."""
  budget = config.get("train", {}).get("budget", {})
  if not budget.get("sweep") or not hasattr(args, "agent"):
    return config
  try:
    sweep = list(canonical_sweep(args.agent, budget["sweep"]))
  except (ValueError, TypeError):
    return config  # not a sweep this version reads: the comparison names it
  train = {**config["train"], "budget": {**budget, "sweep": sweep}}
  return {**config, "train": train}


def check_seeds_record(root: pathlib.Path, seeds: Sequence[int], *, resume: bool,
                       one_after_another: bool, write: bool) -> None:  # fmt: skip
  """Keeps a run of several seeds one after the other (each a run in `root`/seed<k>)
  whole: its `SEEDS_RECORD` names its seeds.

  A resume must train those seeds (a run without the record, of an earlier version: the
  seeds it started must be among `seeds`); a new start of any run in `root` is refused
  while it holds one. A record without any seed's run (a refused start left it), or
  beside a run of its own in `root`, is not one. `write`: record `seeds` for a new run
  of seeds one after the other, or a resumed one without a record (process 0)."""
  record = root / SEEDS_RECORD
  started = [path.parent.name.removeprefix("seed") for path in root.glob("seed*/config.json")]
  started_seeds = sorted(int(k) for k in started if k.isdigit())
  held = None
  if record.exists() and started_seeds and not (root / "config.json").exists():
    held = read_json(record)
    held = held.get("seeds") if isinstance(held, dict) else held
  if not resume:
    if held is not None:
      raise ValueError(f"--run-dir {root} holds a run of the seeds {held} one after the "
                       "other: --resume it, or choose another directory")  # fmt: skip
    if write and one_after_another and not started_seeds:
      record_seeds(root, seeds)
    return
  if held is None and one_after_another and started_seeds:  # an earlier version's run
    held = list(seeds) if set(started_seeds) <= set(seeds) else started_seeds
  if held is not None and held != list(seeds):
    raise ValueError(
        f"--resume: {root} holds a run of the seeds {held} one after the other, and these "
        f"settings train {list(seeds)}: resume it with the --seed and --num-seeds it was "
        "run with"
    )
  if write and one_after_another and not record.exists():
    record_seeds(root, seeds)


def record_seeds(root: pathlib.Path, seeds: Sequence[int]) -> None:
  """Writes `SEEDS_RECORD`: `root` holds a run of `seeds` one after the other."""
  write_atomic(root / SEEDS_RECORD, json.dumps({"seeds": list(seeds)}))


def enclosing_run(path: pathlib.Path) -> Optional[pathlib.Path]:
  """The run directory `path` lies inside (None: none): one with a config.json, or the root
  of seeds run one after the other (its `SEEDS_RECORD` and a seed<k>/config.json)."""
  return next((p for p in path.resolve().parents if _is_run_root(p)), None)


_STARTING_SEEDS_OF: contextvars.ContextVar[Optional[pathlib.Path]] = contextvars.ContextVar(
    "starting_seeds_of", default=None
)


@contextlib.contextmanager
def starting_seeds_of(root: pathlib.Path):
  """While it runs, this process starts (or resumes) the seeds of the run in `root` one
  after the other, each as a run of its own in root/seed<k>: what `check_or_write_config`
  refuses to a --resume given one seed's folder."""
  token = _STARTING_SEEDS_OF.set(root.resolve())
  try:
    yield
  finally:
    _STARTING_SEEDS_OF.reset(token)


def _one_of_its_seeds(root: pathlib.Path, run_dir: pathlib.Path) -> bool:
  """Whether `run_dir` is root/seed<k> of a seed k of the run of seeds one after the other
  in `root` (where that run starts each of them)."""
  if (root / "config.json").exists() or run_dir.resolve().parent != root:
    return False
  if not (root / SEEDS_RECORD).is_file():  # not a run of seeds one after the other
    return False
  seeds = read_json(root / SEEDS_RECORD)
  seeds = seeds.get("seeds") if isinstance(seeds, dict) else None
  return isinstance(seeds, list) and run_dir.name in [f"seed{k}" for k in seeds]


def _is_run_root(path: pathlib.Path) -> bool:
  if _is_run_config(path / "config.json"):
    return True
  return (path / SEEDS_RECORD).is_file() and any(
      _is_run_config(c) for c in path.glob("seed*/config.json")
  )


def recorded_budget(run_dir: str | os.PathLike) -> Optional[int]:
  """The step budget (`--total-env-steps`) of the run in `run_dir` as its config.json
  records it (a root of seeds run one after the other: its first seed's); None where there
  is no readable run (a resume says why)."""
  run_dir = pathlib.Path(run_dir).expanduser()
  paths = [run_dir / "config.json", *sorted(run_dir.glob("seed*/config.json"))]
  for path in paths if _is_run_root(run_dir) else ():
    try:
      budget = _run_config(path)["config"]["train"]["budget"]["total_env_steps"]
    except (OSError, ValueError, KeyError, TypeError):
      continue
    if isinstance(budget, int) and not isinstance(budget, bool):
      return budget
  return None


def _is_run_config(path: pathlib.Path) -> bool:
  try:
    return path.is_file() and bool(_run_config(path))
  except (OSError, ValueError):
    return False


def _left_by_a_start(path: pathlib.Path) -> bool:
  """Whether `path` is what a refused or stopped start leaves: lock files, folders of
  nothing else, or a multi-host job's process<i>/ logs."""
  if path.name in (LOCK, SEEDS_RECORD):  # the record of seeds none of which started
    return True
  try:
    if not path.is_dir():
      return False
    if re.fullmatch(r"process\d+", path.name):
      return True
    walked = os.walk(path, onerror=_raise)  # an unreadable folder: not known to be empty
    return all(name == LOCK for _, _, files in walked for name in files)
  except OSError:
    return False


def _raise(error: OSError) -> None:
  raise error


def _run_config(path: pathlib.Path) -> dict:
  """A run's config.json, refusing a file of that name that is not one."""
  record = read_json(path)
  if not isinstance(record, dict) or not isinstance(record.get("config"), dict):
    raise ValueError(f"{path} is not a run's config.json (no `config` object): choose "
                     "another --run-dir")  # fmt: skip
  _check_groups(path, record["config"])
  return record


def _check_groups(path: pathlib.Path, config: dict) -> None:
  """Refuses a config.json whose `train` or `agent` is not an object of fields, or whose
  `train` holds a group that is not (a hand-edited or damaged file), naming the entry; the
  fields' values are checked where the configs are rebuilt (`validate`)."""
  groups = [(name, config[name]) for name in ("train", "agent") if name in config]
  if isinstance(config.get("train"), dict):
    groups += [(f"train.{name}", group) for name, group in config["train"].items()]
  for name, group in groups:
    if not isinstance(group, dict):
      raise ValueError(f"{path}: config.{name} is {json.dumps(group)[:60]}, not an object of "
                       "fields (the file was edited or damaged)")  # fmt: skip


def _field_defaults(args: Any) -> Optional[dict]:
  """The script's default args as JSON (None when its args class needs arguments)."""
  try:
    return config_jsonable(type(args)())
  except TypeError:
    return None


def _last_command(name: str, record: dict) -> str:
  """Where the run was last started or resumed by the `name` script (config.json's
  `command`, or its latest resume's): a clause that shows the command, whose flags a resume
  repeats; "" for a run made from Python."""
  command = [record, *record.get("resumed", [])][-1].get("command")
  if not (isinstance(command, list) and command and all(isinstance(a, str) for a in command)
          and os.path.basename(command[0]) == f"{name}.py"):  # fmt: skip
    return ""
  again = "repeat that command" if "--resume" in command else "repeat it with --resume"
  return f"; the run last ran as `python {shlex.join(command)}`: {again}"


def check_algorithm(name: str, run_dir: pathlib.Path, record: dict) -> None:
  """On --resume, refuses a run (its config.json `record`) of another algorithm than
  `name`, naming the script that resumes it."""
  if record.get("algorithm") != name:
    raise ValueError(f"--resume: {run_dir} is a run of {record.get('algorithm')}, not of "
                     f"{name}: resume it with experiments/{record.get('algorithm')}.py")  # fmt: skip


def check_or_write_config(name: str, args: Any, run_dir: pathlib.Path, resume: bool,
                          others: Sequence[pathlib.Path] = (),
                          inputs: Optional[dict] = None,
                          checkpoints: Optional[pathlib.Path] = None,
                          writes_checkpoints: bool = True) -> dict:  # fmt: skip
  """On resume, refuses a changed config or input file (`inputs`: the digests of the
  files that args fields name, kept in config.json, compared instead of the paths), and
  a run that cannot go on: `checkpoints` (default `run_dir`/checkpoints; a multi-process
  job's other processes read process 0's) gone while its summary names one, or folders it
  writes in (with `writes_checkpoints`, the checkpoints too) not writable. Otherwise
  refuses to overwrite a run (in `run_dir` or any of `others`), and a resume under another
  `jax_enable_x64`. Then writes config.json, with the run's `run_id` (a new one for a new
  run, or a resumed one that has none) and its `jax_enable_x64`, and returns what it
  wrote."""
  import jax  # pylint: disable=import-outside-toplevel  (started by then: a run's)

  x64 = bool(jax.config.jax_enable_x64)  # float64 intermediates: other numbers
  config_path = run_dir / "config.json"
  old = _run_config(config_path) if config_path.exists() else None
  lane_of = old is not None and _learner_of(old)
  if lane_of:  # its checkpoints and config are the whole run's
    lane_of = _learner_root(run_dir, old) or lane_of  # a copied run's own root
    raise ValueError(
        f"{run_dir} is one learner of the run in {lane_of}: resume that run (--run-dir "
        f"{lane_of} --resume), or choose another --run-dir"
    )
  if resume:
    if old is None:
      inside = enclosing_run(run_dir)
      if (
          inside is not None
          and not writes_checkpoints
          and checkpoints is not None
          and checkpoints.parent.resolve() == inside.resolve()
      ):  # process k's own directory of the job in `inside`
        raise FileNotFoundError(
            f"--resume: {run_dir} holds no run (no config.json): this process's files of "
            f"the job in {inside} are gone, so the job cannot go on from its checkpoint; "
            "start it again in another --run-dir"
        )
      raise FileNotFoundError(
          f"--resume: {run_dir} holds no run (no config.json)"
          + (f"; it lies inside the run in {inside}: resume that run (--run-dir {inside} "
             "--resume)" if inside is not None else "")
      )  # fmt: skip
    check_algorithm(name, run_dir, old)
    if old.get("jax_enable_x64", x64) != x64:
      raise ValueError(
          f"--resume: the run was made with jax_enable_x64 {old['jax_enable_x64']} "
          f"(JAX_ENABLE_X64), and this process has it {x64}: the resumed run would not "
          "continue as the run would have; resume with the run's setting"
      )
    root = run_dir.resolve().parent
    if _one_of_its_seeds(root, run_dir) and _STARTING_SEEDS_OF.get() != root:
      raise ValueError(
          f"--resume: {run_dir} is {run_dir.name} of the run in {root}, whose seeds run one "
          f"after the other: resume that run (--run-dir {root} --resume, with the settings "
          f"it was run with){_last_command(name, old)}"
      )
    if "loop" in old["config"]:
      raise ValueError(
          f"--resume: {run_dir} was written by offpolicy_ac 0.1 (a flat `loop` config, "
          "checkpoint record format 1); this version reads format "
          f"{records.RECORD_FORMAT} (a grouped `train` config): resume that run with "
          "offpolicy_ac 0.1"
      )
    new = config_jsonable(args)
    try:  # an edited value is refused by name before the configs are compared
      train = without_removed_fields(old["config"].get("train", {}))
      TrainConfig.from_dict(train).validate()
    except (TypeError, ValueError) as e:
      raise ValueError(f"--resume: {config_path}: {e}") from None
    started = _canonical_sweep({**old["config"], "train": train}, args)
    defaults = _field_defaults(args)
    diffs = config_differences(started, new, defaults)
    budget = lambda c: c.get("train", {}).get("budget", {}).get("total_env_steps")
    before, after = budget(old["config"]), budget(new)
    if after is not None and before is not None and after < before:
      raise ValueError(
          f"--resume: --total-env-steps {after:,} is smaller than the run's {before:,}; a "
          "resumed run may only get a larger budget"
      )
    for field, digest in (inputs or {}).items():  # compared by content, not by path
      if field in old.get("inputs", {}):
        diffs = [d for d in diffs if d != field]
        if old["inputs"][field] != digest:
          raise ValueError(f"--resume: the --{field.replace('_', '-')} file's content differs "
                           "from the one the run started with; resume with that file (at this "
                           "or any other path), or start a new run")  # fmt: skip
    if diffs:
      was, now, usual = _flatten(started), _flatten(new), _flatten(defaults or {})
      predates = "the run's config.json predates it: the default,"  # a field added since
      held = lambda k: (f"the run's {_setting(k, started, was[k])}," if k in was else
                        f"{predates} {json.dumps(usual.get(k))};")  # fmt: skip
      # The task's settings first (another --env-id makes the rest differ too).
      diffs = sorted(diffs, key=lambda k: not k.startswith("train.env."))
      shown = "; ".join(  # by field name (unique), which scripts show as the flag
          f"{k.rsplit('.', 1)[-1]} ({held(k)} given {_setting(k, new, now.get(k))})"
          for k in diffs[:4]
      ) + (f"; and {len(diffs) - 4} more" if len(diffs) > 4 else "")
      raise ValueError(
          f"--resume: the config differs from the run's in {shown}; only the step budget "
          "(--total-env-steps), the tracking flags, --import-modules and a job's "
          f"--coordinator-address may change{_last_command(name, old)}"
      )
    checkpoints = run_dir / "checkpoints" if checkpoints is None else checkpoints
    _check_learners_kept(run_dir, others)
    _check_writable(run_dir, others or (run_dir,), checkpoints if writes_checkpoints else None)
    _check_checkpoints_kept(checkpoints, others or (run_dir,))
    _refuse_earlier_format(checkpoints, None, checkpoint_steps(checkpoints))
    if after is not None and before is not None and after > before:
      print(f"[{name}] the budget grows from {before:,} to {after:,} env steps: a step size "
            "annealed over the run follows the new budget from here on, and the default "
            "evaluation interval after the next evaluation (a run started with it would "
            "differ; an envpool run's data too, unless the old budget ended on a checkpoint)",
            flush=True)  # fmt: skip
  else:
    for d in (run_dir, *others):
      if (d / "config.json").exists():
        _run_config(d / "config.json")  # a file of that name that is not a run's: kept
      if holds_run(d):
        raise FileExistsError(
            f"{d} already holds a run: pass --resume to continue it (from Python: "
            "resume=True in the args), or choose another --run-dir"
        )
  run_dir.mkdir(parents=True, exist_ok=True)
  run_id = (old or {}).get("run_id") if resume else None
  extra = {"algorithm": name, "run_id": run_id or uuid.uuid4().hex, "jax_enable_x64": x64,
           **({"inputs": inputs} if inputs else {})}  # fmt: skip
  return write_config(run_dir, args, extra=extra, started=old if resume else None)


def _check_writable(root: pathlib.Path, dirs: Sequence[pathlib.Path],
                    checkpoints: Optional[pathlib.Path]) -> None:  # fmt: skip
  """Refuses to resume a run whose checkpoints folder (None: this process writes none) or
  run folders cannot be written, before anything is trained (not at its first
  checkpoint)."""
  if checkpoints is not None and checkpoints.exists() and not checkpoints.is_dir():
    raise ValueError(f"--resume: {checkpoints} is a file, not the run's checkpoints folder")
  # The files are replaced whole (written beside, then renamed): their folders count.
  for path in (root, *([checkpoints] if checkpoints else []), *dirs):
    if path.exists() and not os.access(path, os.W_OK):
      raise PermissionError(f"--resume: {path} is not writable: the run goes on writing in it")


def _check_learners_kept(root: pathlib.Path, learners: Sequence[pathlib.Path]) -> None:
  """Refuses to resume a run of several learners one of whose directories is gone: every
  learner's was written when the run started, and its checkpoints hold each learner, so
  the run would go on with that learner's logs begun anew, or be refused only after its
  directory was made again."""
  for d in learners:
    if d != root and not (d / "config.json").exists():
      raise FileNotFoundError(
          f"--resume: {d}, a learner of the run in {root}, is gone (no config.json): put it "
          "back, or start the run over in another --run-dir"
      )


def _check_checkpoints_kept(checkpoints: pathlib.Path, dirs: Sequence[pathlib.Path]) -> None:
  """Refuses to resume a run whose summary names a checkpoint when its checkpoints folder
  holds none that was written whole, nor one set aside as damaged (deleted, or not copied
  with the run; the folders a save killed early leaves do not count): it would start over
  and overwrite what the run trained."""
  if written_steps(checkpoints) or set_aside_checkpoints(checkpoints):
    return  # the restore reads them, or sets damaged ones aside
  for d in dirs:
    try:
      step = read_json(d / "summary.json").get("checkpoint_env_steps")
    except (OSError, ValueError, AttributeError):
      continue  # no summary (stopped before it): --resume starts over, as it says
    if isinstance(step, int):
      raise FileNotFoundError(
          f"--resume: {d / 'summary.json'} names a checkpoint at env step {step:,}, and "
          f"{checkpoints} holds none written whole: put the run's checkpoints back, or "
          "start it over in another --run-dir"
      )


def write_best(run_dir: pathlib.Path, params: Any, transform_state: Any, env_steps: int) -> None:
  """Writes a learner's best-evaluated parameters so far (and its data transformer's
  state, when it has one), as SB3's evaluation callback keeps `best_model`, and the env
  steps they were trained for (best.json, with the CRC-32 of the parameters and of the
  transformer's state: a kill between the files leaves the steps unknown, never wrong, and
  `load_run` refuses parameters beside another evaluation's statistics)."""
  crc = save_params(run_dir / BEST_PARAMS, params)
  record = {"env_steps": int(env_steps), "params_crc32": crc}
  if jax.tree.leaves(transform_state):
    record["transform_crc32"] = save_params(run_dir / BEST_TRANSFORM, transform_state)
  write_atomic(run_dir / BEST_RECORD, json.dumps(record))


class BestFiles:
  """Each learner's best-evaluated parameters in its run directory (`write_best`), and
  on resume the files of the checkpoint it continues from: the best parameters written
  after a checkpoint belong to the stretch a resume repeats, which a run with actor threads
  does not repeat exactly. Before an evaluation replaces the files the newest checkpoint
  counts as its best, they are linked into `best_at_checkpoint/` (hard links: no copy
  until they are replaced), and a resume puts them back. A `training.BestKeeper`.

  Args:
    dirs: the run directory of each learner (lane).
  """

  _NAMES = tuple(f"{name}{suffix}" for name in (BEST_PARAMS, BEST_TRANSFORM)
                 for suffix in ("", ".crc32")) + (BEST_RECORD,)  # fmt: skip

  def __init__(self, dirs: Sequence[pathlib.Path]):
    self.dirs = list(dirs)

  def keep(self, lane: int, params: Any, transform_state: Any, env_steps: int,
           checkpointed: Optional[int]) -> None:  # fmt: skip
    run_dir = self.dirs[lane]
    written = _best_steps(run_dir)
    if written is not None and checkpointed is not None and written <= checkpointed:
      self._link(run_dir, run_dir / BEST_AT_CHECKPOINT)
    write_best(run_dir, params, transform_state, env_steps)

  def rewind(self, lane: int, best_env_steps: Optional[int]) -> bool:
    run_dir, aside = self.dirs[lane], self.dirs[lane] / BEST_AT_CHECKPOINT
    if best_env_steps is not None and _best_steps(run_dir) == best_env_steps:
      return True
    if best_env_steps is not None and _best_steps(aside) == best_env_steps:
      self._link(aside, run_dir)
      return True
    for name in self._NAMES[::-1]:  # best.json first: no record of the others remains
      (run_dir / name).unlink(missing_ok=True)
    if best_env_steps is None:  # no evaluation before the checkpoint, or no checkpoint
      shutil.rmtree(aside, ignore_errors=True)
    return best_env_steps is None

  @classmethod
  def _link(cls, source: pathlib.Path, target: pathlib.Path) -> None:
    """Makes `target`'s best files `source`'s, best.json last (until then, the record
    there pairs with no parameters: `_best_record` passes it over)."""
    target.mkdir(exist_ok=True)
    (target / BEST_RECORD).unlink(missing_ok=True)
    for name in cls._NAMES:
      if not (source / name).exists():
        (target / name).unlink(missing_ok=True)
        continue
      if (target / name).exists() and os.path.samefile(source / name, target / name):
        continue  # already the same file (renaming a link onto it would do nothing)
      tmp = target / f"{name}.link"  # not write_atomic's .tmp, which it writes into
      tmp.unlink(missing_ok=True)
      try:
        os.link(source / name, tmp)
      except OSError:  # a filesystem without hard links
        shutil.copyfile(source / name, tmp)
      os.replace(tmp, target / name)


def _best_steps(run_dir: pathlib.Path) -> Optional[int]:
  """The env steps best.json records for the best files beside it (None: no best files,
  or a record that does not pair with them)."""
  return _recorded_steps(_best_record(run_dir))


def _recorded_steps(record: Optional[dict]) -> Optional[int]:
  """A best.json record's env steps (None: no record, or no count of steps in it)."""
  steps = (record or {}).get("env_steps")
  return steps if type(steps) is int else None  # a bool is no count


def _read_summary(path: pathlib.Path) -> dict:
  """summary.json ({} when there is none), refusing one edited or damaged out of shape:
  `load_run` trusts its step counts to tell whether the final parameters are the newest."""
  if not path.exists():
    return {}
  summary = read_json(path)
  fix = "(the file was edited or damaged): restore it, or delete it to load the newest checkpoint"
  if not isinstance(summary, dict):
    raise ValueError(f"{path} is {json.dumps(summary)[:60]}, not a run's summary {fix}")
  for field in ("env_steps", "best_env_steps", "checkpoint_env_steps"):
    value = summary.get(field)
    if value is not None and (type(value) is not int or value < 0):  # a bool is no count
      raise ValueError(f"{path}: {field} is {json.dumps(value)[:60]}, not a count of env "
                       f"steps {fix}")  # fmt: skip
  return summary


def _best_record(run_dir: pathlib.Path) -> Optional[dict]:
  """best.json's record when it is the one of the best files beside it: the CRC-32 of the
  parameters and, when it records one, of the transformer's state match (a kill between
  the writes leaves them unpaired). None otherwise."""
  try:
    record = read_json(run_dir / BEST_RECORD)
    crc = lambda name: _crc32((run_dir / name).read_bytes())  # noqa: E731
    paired = (
        isinstance(record, dict)
        and record.get("params_crc32") == crc(BEST_PARAMS)
        and ("transform_crc32" not in record or record["transform_crc32"] == crc(BEST_TRANSFORM))
    )
  except (OSError, ValueError):
    return None
  return record if paired else None


def mark_summary_resumed(run_dir: pathlib.Path) -> Optional[bytes]:
  """Adds `resumed_since` (when this resume started) to the summary.json a resumed run
  finds: until the new segment writes its own, the summary is of the segment before (a
  segment that is killed leaves it so; `load_run` then loads the newest checkpoint).
  Returns the summary as it was (None: there was none to mark), for
  `unmark_summary_resumed`."""
  path = run_dir / "summary.json"
  try:
    before = path.read_bytes()
    summary = read_json(path)
  except (OSError, ValueError):
    return None  # none yet (stopped before it), or one load_run refuses by name
  if not isinstance(summary, dict):
    return None
  summary["resumed_since"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
  write_atomic(path, json.dumps(summary, indent=2))
  return before


def unmark_summary_resumed(run_dir: pathlib.Path, before: Optional[bytes]) -> None:
  """Puts back the summary.json `mark_summary_resumed` marked (`before`, what it returned),
  for a resume refused before it trained: the run is as it was, finished or stopped."""
  if before is not None:
    write_atomic(run_dir / "summary.json", before)


def write_results(name: str, run_dir: pathlib.Path, result: RunResult, protocol: str,
                  stopped_by: Optional[str] = None) -> dict:  # fmt: skip
  """Writes a finished (or stopped) run's final parameters, its data transformer's state
  (when it has one: observation statistics the policy acts with) and summary.json, which
  records their CRC-32s (a kill between the writes leaves a summary of other files, which
  `load_run` does not pair with them); returns the summary."""
  crcs = {"final_params_crc32": save_params(run_dir / FINAL_PARAMS, result.agent_state.params)}
  if jax.tree.leaves(result.transform_state):
    crcs["final_transform_crc32"] = save_params(run_dir / FINAL_TRANSFORM, result.transform_state)
  summary = {
      k: v
      for k, v in dataclasses.asdict(result).items()
      if k not in ("agent_state", "transform_state")
  }
  summary.update(crcs)
  summary["run_dir"] = str(run_dir)
  summary["evaluation_protocol"] = protocol
  if stopped_by:
    summary["stopped_by"] = stopped_by
  write_atomic(run_dir / "summary.json", json.dumps(summary, indent=2))
  shown = {k: v for k, v in summary.items() if k not in crcs}
  print(f"[{name}] done: {shown}", flush=True)
  return summary


class LoadedRun(NamedTuple):
  """A run directory's agent, parameters and task.

  Attributes:
    run_dir: the run directory.
    algorithm: the experiment script's name ("impala", "acer", "sql", "sqil").
    config: the run's `TrainConfig`.
    agent: the agent, built as the script built it.
    acting: the parameters and data-transformer state the policy acts with (`Acting`).
    env_steps: env steps of training behind these parameters (None if unknown).
    source: where the parameters came from: "final", "best" or "checkpoint".
    checkpoints: env steps of the run's checkpoints, oldest first.
    greedy: `greedy(acting, obs [B, ...]) -> action [B, ...]`, jitted: the greedy
      (discrete) or mean (continuous) action on transformed observations, as the
      in-training evaluation uses it.
    act: `act(acting, obs, key) -> (action, extras)`, jitted: the behaviour policy.
  """

  run_dir: pathlib.Path
  algorithm: str
  config: TrainConfig
  agent: Agent
  acting: Acting
  env_steps: Optional[int]
  source: str
  checkpoints: tuple[int, ...]
  greedy: Callable
  act: Callable

  @property
  def params(self) -> Any:
    return self.acting.params

  def make_env(self, num_envs: int, seed: int, *, train: bool = False,
               **envpool_kwargs) -> envs.EnvPoolEnv | envs.FunctionalPool:  # fmt: skip
    """A pool of the run's task (env id, Atari options, max_episode_steps).

    `train=False` (default): evaluation settings (Atari: no reward clipping), as the
    in-training evaluation uses; `train=True`: the training pools'.
    `envpool_kwargs` are further envpool options, e.g. `render_mode="rgb_array"`.
    A run on a JAX environment (gymnax, brax: a compiled run) gets an
    `envs.FunctionalPool` of it, which cannot render.
    """
    return make_env(self.config, num_envs, seed, train=train, **envpool_kwargs)

  def greedy_policy(self) -> Callable[[Any], np.ndarray]:
    """`policy(obs [B, ...]) -> action [B, ...]` with this run's parameters (NumPy out)."""
    greedy, acting = self.greedy, self.acting
    return lambda obs: np.asarray(greedy(acting, np.asarray(obs)))

  def behaviour_policy(self, seed: int) -> Callable[[Any], np.ndarray]:
    """`policy(obs [B, ...]) -> action [B, ...]`: actions sampled from the policy the run
    trained with (`act`), each call with a fresh key split from `PRNGKey(seed)`.

    Use it where the greedy policy gets stuck, playing until the time limit.
    """
    if not isinstance(seed, numbers.Integral) or isinstance(seed, bool) or not 0 <= seed < 2**32:
      raise ValueError(f"behaviour_policy: seed must be an int in [0, 2**32), got {seed!r}")
    act, acting = self.act, self.acting
    key = jax.random.PRNGKey(int(seed))

    def policy(obs):
      nonlocal key
      key, step_key = jax.random.split(key)
      return np.asarray(act(acting, np.asarray(obs), step_key)[0])

    return policy


def _read_config(run_dir: str | os.PathLike) -> tuple[dict, TrainConfig]:
  """config.json of a run directory, checked to be one this version reads.

  Raises:
    FileNotFoundError: `run_dir` does not exist or holds no config.json.
    ValueError: a run of another format (offpolicy_ac 0.1), of an unknown algorithm,
      or the root of a run of several seeds or of a sweep.
  """
  run_dir = pathlib.Path(run_dir)
  if not run_dir.is_dir():
    raise FileNotFoundError(f"{run_dir} is not a directory")
  path = run_dir / "config.json"
  if not path.exists():
    learners = sorted(str(p.parent) for p in run_dir.glob("seed*/config.json"))
    run = enclosing_run(run_dir)
    raise FileNotFoundError(f"{run_dir} is not a run directory (no config.json)" + (
        f"; it holds the seeds of one: load one of them ({', '.join(learners)})"
        if learners else f"; it is inside the run in {run}" if run else ""))  # fmt: skip
  record = read_json(path)
  config = record.get("config") if isinstance(record, dict) else None
  if not isinstance(config, dict) or not isinstance(record.get("algorithm"), str):
    raise ValueError(f"{path} was not written by an experiment script (no algorithm/config)")
  if "loop" in config:
    raise ValueError(
        f"{run_dir} was written by offpolicy_ac 0.1 (a flat `loop` config); this version "
        "reads runs with a grouped `train` config: load it with offpolicy_ac 0.1"
    )
  if not isinstance(config.get("train"), dict) or not isinstance(config.get("agent"), dict):
    raise ValueError(f"{path} has no `train` and `agent` configs")
  _check_groups(path, config)
  if record["algorithm"] not in AGENTS:
    raise ValueError(
        f"{run_dir} is a run of {record['algorithm']!r}; known algorithms: {sorted(AGENTS)} "
        "(a custom agent: register it in this process first, agents.register_agent; "
        "evaluate.py and record_demos.py: --import-modules MODULE, the module that does)"
    )
  try:  # before any field is read: a hand-edited value is refused by name
    train = TrainConfig.from_dict(config["train"])
    train.validate()
  except (TypeError, ValueError) as e:
    raise ValueError(f"{path}: {e}") from e
  if train.budget.sweep:
    learners = sorted(str(p.parent) for p in run_dir.glob("*/seed*/config.json"))
    raise ValueError(
        f"{run_dir} is the root of a sweep ({', '.join(train.budget.sweep)}): load one of its "
        f"learner directories ({', '.join(learners)})"
    )
  if train.budget.num_seeds > 1:
    raise ValueError(
        f"{run_dir} holds {train.budget.num_seeds} seeds: load one of its seed directories "
        f"({', '.join(str(run_dir / f'seed{s}') for s in train.seeds)})"
    )
  return record, train


def _learner_of(record: dict) -> Optional[str]:
  """The root of the run of several whose learner a config.json record is, or None:
  `learners_of` (offpolicy_ac 0.2 recorded a vmapped seed's as `vmapped_seeds_of`)."""
  return record.get("learners_of") or record.get("vmapped_seeds_of")


def _learner_root(run_dir: pathlib.Path, record: dict) -> Optional[pathlib.Path]:
  """The root of the run of several whose learner `run_dir` (its config.json `record`) is:
  where the learner lies first (root/seed<k>, root/<setting>/seed<k>), so that a copied or
  moved run is its own, else the root recorded when it was written; None for a run that is
  no learner, or whose root is gone (another run in its place included: `_is_root_of`)."""
  lanes_of = _learner_of(record)
  if lanes_of is None:
    return None
  candidates = [run_dir.parent, run_dir.parent.parent, pathlib.Path(lanes_of)]
  return next((c for c in candidates if _is_root_of(c, record)), None)


def _is_root_of(root: pathlib.Path, record: dict) -> bool:
  """Whether `root` holds the run whose learner's config.json is `record`: the same
  `run_id`; for a learner written before run ids, a run of the same algorithm started no
  later than the learner (a run started since in its place is another)."""
  try:
    held = read_json(root / "config.json")
  except (OSError, ValueError):
    return False
  if not isinstance(held, dict):
    return False
  if "run_id" in record:
    return held.get("run_id") == record["run_id"]
  started = [_started(r) for r in (held, record)]
  return held.get("algorithm") == record.get("algorithm") and (
      None in started or started[0] <= started[1]
  )


def _started(record: dict) -> Optional[float]:
  """When the run of a config.json `record` started (its `created`, as a POSIX time), or
  None when it does not say."""
  try:
    return datetime.datetime.strptime(record["created"], "%Y-%m-%dT%H:%M:%S%z").timestamp()
  except (KeyError, TypeError, ValueError):
    return None


def _checkpoint_source(run_dir: pathlib.Path, record: dict) -> tuple[pathlib.Path, int, int]:
  """(checkpoint directory, learners in its arrays, this run's index among them). A
  learner of a run of several (seeds, a sweep's settings), written in `<root>/seed<k>` or
  `<root>/<setting>/seed<k>`, finds its checkpoints in the root, stacked with the other
  learners' (its config.json records its lane: `learners_of`, `learner`, `learners`; a
  vmapped seed of offpolicy_ac 0.2, `vmapped_seeds_of`: its seed's place in the root's).
  A lane that is not its seed's (an edited file) is refused (ValueError)."""
  root = _learner_root(run_dir, record)
  if root is None:  # not a learner, or its root is gone: no checkpoints to read
    return run_dir / "checkpoints", 1, 0
  try:
    first, count = (read_json(root / "config.json")["config"]["train"]["budget"][k]
                    for k in ("seed", "num_seeds"))  # fmt: skip
    seed = record["config"]["train"]["budget"]["seed"]
  except (KeyError, TypeError) as e:
    raise ValueError(f"{root / 'config.json'} or {run_dir / 'config.json'} holds no seed "
                     f"(edited or damaged: {e!r})") from None  # fmt: skip
  if record.get("learners_of") is None:
    return root / "checkpoints", count, seed - first
  learner, learners = record.get("learner"), record.get("learners")
  # Lanes are the settings, then the seeds (`sweeps.lanes_of`): lane k trains seed
  # first + k % count.
  if not all(isinstance(n, int) and not isinstance(n, bool) for n in (learner, learners)) or (
      not 0 <= learner < learners or seed != first + learner % count
  ):  # fmt: skip
    raise ValueError(f"{run_dir / 'config.json'}: learner {learner!r} of {learners!r} is not "
                     f"the lane of its seed, {seed}, in the run in {root} (the file was "
                     "edited)")  # fmt: skip
  return root / "checkpoints", learners, learner


def load_run(run_dir: str | os.PathLike, *, checkpoint: Optional[int] = None,
             best: bool = False) -> LoadedRun:  # fmt: skip
  """Loads a run directory written by an experiment script.

  Args:
    run_dir: the run directory (of a run of several seeds: one of its seed<k>
      directories; of a sweep: one of its <setting>/seed<k> directories).
    checkpoint: None: the final parameters (final_params.msgpack), or, if the run
      wrote none or went on since (it is still running, or was killed, resumed or not),
      or they are damaged (with a warning), its newest checkpoint's (a damaged one is
      passed over, with a warning, as `--resume` passes it over); an int: the checkpoint
      taken at that many env steps (see `LoadedRun.checkpoints`).
    best: the best-evaluated parameters (best_params.msgpack: those of the evaluation
      with the highest mean return, summary.json's `best_eval_return`) instead of the
      final ones.

  Returns:
    A `LoadedRun`.

  Raises:
    FileNotFoundError: not a run directory.
    ValueError: a run of another format or of an unknown algorithm, the root of a run
      of several seeds or of a sweep, no parameters saved (no final parameters and no
      checkpoint, no checkpoint at `checkpoint`, no best parameters), or parameters that
      do not match their checksum (damaged: `DamagedCheckpointError`, a ValueError; with
      `checkpoint` None, only when no checkpoint is intact).
    CheckpointAccessError: an OSError: a checkpoint could not be read for a reason of
      the machine's (no permission, no memory, too many open files, an I/O error).
    TypeError: `run_dir` is not a path, or `checkpoint` not an int.
  """
  if not isinstance(best, bool):
    raise TypeError(f"load_run: best must be True or False, got {best!r}")
  if best and checkpoint is not None:
    raise ValueError("load_run: choose the best parameters or a checkpoint, not both")
  if checkpoint is not None:
    if not isinstance(checkpoint, numbers.Integral) or isinstance(checkpoint, bool):
      raise TypeError("load_run: checkpoint must be an int (the env steps of one of "
                      f"LoadedRun.checkpoints), got {checkpoint!r}")  # fmt: skip
    checkpoint = int(checkpoint)
  if not isinstance(run_dir, (str, os.PathLike)):
    raise TypeError(f"load_run: run_dir must be a path (a str or a pathlib.Path), got {run_dir!r}")
  run_dir = pathlib.Path(run_dir).expanduser()
  record, config = _read_config(run_dir)
  algorithm = record["algorithm"]
  agent = make_agent(algorithm, task_spec(config), record["config"]["agent"])
  transformer = make_transformer(agent.spec, config)
  act, greedy = make_policies(agent, transformer)
  params_template = jax.eval_shape(agent.init, jax.random.PRNGKey(0)).params
  transform = transformer.init()
  ckpt_dir, num_seeds, index = _checkpoint_source(run_dir, record)
  steps = tuple(checkpoint_steps(ckpt_dir))
  final = run_dir / FINAL_PARAMS
  summary = _read_summary(run_dir / "summary.json")
  if not jax.tree.leaves(transform):
    _refuse_statistics_unused(run_dir, summary)
  paired = _summary_of_final(run_dir, summary)
  # A run resumed after its summary went on (it is running, or was killed): the final
  # parameters and the summary's steps are older than its newest checkpoint, or (killed
  # as it wrote its results) the final parameters are newer than the summary.
  stale = bool(steps) and (
      summary.get("env_steps", -1) < steps[-1] or "resumed_since" in summary or not paired
  )
  if not paired and not best and checkpoint is None:
    also = "; loading the newest checkpoint" if steps else ", whose env steps are not known"
    warnings.warn(f"{run_dir}: {FINAL_PARAMS} is not of the run summary.json describes (it "
                  f"was stopped as it wrote them){also}", RuntimeWarning, stacklevel=2)  # fmt: skip
  if best:
    if not (run_dir / BEST_PARAMS).exists():
      earlier = summary and "best_eval_return" not in summary  # a summary of 0.2 or earlier
      why = "offpolicy_ac 0.2 and earlier kept none" if earlier else "no evaluation yet"
      if summary.get("best_eval_return") is not None:
        why = f"the run evaluated a best at {summary.get('best_env_steps')} env steps, and "
        why += "the file is gone"
      if config.eval_interval == 0:
        why = "it trained with --eval-every 0: no greedy evaluation, so no best"
      raise ValueError(f"{run_dir} holds no best parameters ({why}): no {BEST_PARAMS}")
    params = load_params(run_dir / BEST_PARAMS, params_template)
    transform = _load_transform(run_dir / BEST_TRANSFORM, transform)
    record = _best_record(run_dir)
    if jax.tree.leaves(transform) and record is None:
      raise ValueError(
          f"{run_dir}: {BEST_PARAMS} and {BEST_TRANSFORM} are not the pair {BEST_RECORD} "
          "records (the run was stopped while it wrote them): --resume the run, or load its "
          "final parameters or a checkpoint's"
      )
    env_steps, source = _recorded_steps(record), "best"
    if env_steps is None and not stale and not (run_dir / BEST_RECORD).exists():
      env_steps = summary.get("best_env_steps")  # a run from before best.json
  elif checkpoint is None and final.exists() and not stale and (
      loaded := _final_unless_damaged(run_dir, params_template, transform, steps)
  ):  # fmt: skip
    (params, transform), source = loaded, "final"
    env_steps = summary.get("env_steps") if paired else None
  else:
    also = f" (this version loads its final parameters, {FINAL_PARAMS})" if final.exists() else ""
    _refuse_earlier_format(ckpt_dir, checkpoint, steps,
                           f": load its checkpoints with that version{also}")  # fmt: skip
    if checkpoint is None and not steps:
      raise ValueError(f"{run_dir} holds no parameters: no {FINAL_PARAMS} and no checkpoint")
    if checkpoint is not None and checkpoint in incomplete_steps(ckpt_dir):
      raise DamagedCheckpointError(
          f"{run_dir}: the checkpoint at env step {checkpoint} is incomplete (being written, "
          f"or damaged: its save did not finish); the complete ones are at {list(steps)}"
      )
    if checkpoint is not None and checkpoint not in steps:
      raise ValueError(f"{run_dir} has no checkpoint at env step {checkpoint}; it has "
                       f"{list(steps)}")  # fmt: skip
    read = lambda step: _read_acting(ckpt_dir, step, num_seeds, index, params_template,
                                     transform, compiled=config.compiled)  # fmt: skip
    if checkpoint is None:
      _warn_of_newer_incomplete(ckpt_dir, steps[-1])
      # The checkpoints newer than the final parameters (a run resumed since), all
      # damaged: the final parameters are the newest intact ones.
      since = [s for s in steps if s > summary.get("env_steps", -1)]
      since = since if final.exists() and paired else []
      older = f"the final parameters ({FINAL_PARAMS})" if since else ""
      found = _newest_readable(since or steps, read, older)
    else:
      found = checkpoint, _read_one(checkpoint, steps, read)
    if found is None:
      params = load_params(final, params_template)
      transform = _load_transform(run_dir / FINAL_TRANSFORM, transform)
      env_steps, source = summary.get("env_steps"), "final"
    else:
      step, (params, transform) = found
      env_steps, source = step, "checkpoint"
  acting = jax.device_put(Acting(params, transform))
  return LoadedRun(
      run_dir=run_dir, algorithm=algorithm, config=config, agent=agent, acting=acting,
      env_steps=env_steps, source=source, checkpoints=steps, greedy=jax.jit(greedy),
      act=jax.jit(act),
  )  # fmt: skip


def _refuse_statistics_unused(run_dir: pathlib.Path, summary: dict) -> None:
  """Refuses a run whose config.json describes a data transformer without a state when
  the run saved one (observation statistics: final_transform.msgpack, best_transform.msgpack,
  or their CRC-32s in summary.json and best.json): config.json was edited, and the
  parameters would act on observations not normalised as in training."""
  saved = [name for name in (FINAL_TRANSFORM, BEST_TRANSFORM) if (run_dir / name).exists()]
  try:
    best = read_json(run_dir / BEST_RECORD)
  except (OSError, ValueError):  # none, or damaged: its files say
    best = {}
  best = best if isinstance(best, dict) else {}
  if not saved and ("final_transform_crc32" in summary or "transform_crc32" in best):
    saved = ["summary.json" if "final_transform_crc32" in summary else BEST_RECORD]
  if saved:
    raise ValueError(
        f"{run_dir}: config.json trains without observation statistics "
        "(normalize_observations false), but the run saved them (" + ", ".join(saved) + "): "
        "config.json was edited; set normalize_observations back to true"
    )


def _summary_of_final(run_dir: pathlib.Path, summary: dict) -> bool:
  """Whether summary.json is the one of the final parameters (and data transformer's
  state) beside it: the CRC-32s it records match theirs. A summary of a version that
  recorded none is taken as theirs; a missing file, or one that does not match its own
  checksum file (damaged), is left to its loading, which refuses or passes over it."""
  for field, name in (("final_params_crc32", FINAL_PARAMS),
                      ("final_transform_crc32", FINAL_TRANSFORM)):  # fmt: skip
    path = run_dir / name
    if field in summary and path.exists():
      crc, checksum = _crc32(path.read_bytes()), _checksum_path(path)
      intact = not checksum.exists() or crc in _checksums_in(checksum)
      if intact and crc != summary[field]:
        return False
  return True


def _final_unless_damaged(run_dir: pathlib.Path, params_template: Any, transform: Any,
                          steps: Sequence[int]) -> Optional[tuple[Any, Any]]:  # fmt: skip
  """The final parameters and observation statistics; None, with a warning, where they are
  damaged and the run has checkpoints (its newest intact one is loaded instead, as
  `--resume` would go on from it)."""
  try:
    params = load_params(run_dir / FINAL_PARAMS, params_template)
    return params, _load_transform(run_dir / FINAL_TRANSFORM, transform)
  except DamagedCheckpointError as e:
    if not steps:
      raise
    warnings.warn(f"{e}: loading the newest intact checkpoint instead", RuntimeWarning,
                  stacklevel=3)  # fmt: skip
    return None


def _refuse_earlier_format(ckpt_dir: pathlib.Path, step: Optional[int], steps: Sequence[int],
                           then: str = "") -> None:  # fmt: skip
  """Refuses checkpoint `step` (None: the newest) when an earlier version wrote it, with the
  version that reads it and `then` (what to do instead): offpolicy_ac 0.2 wrote no
  checksums, so `checkpoint_steps` (`steps`) does not list its checkpoints."""
  if step in steps or (step is None and steps):
    return
  unlisted = incomplete_steps(ckpt_dir)
  if not unlisted:
    return
  step = step if step in unlisted else unlisted[-1]
  record = read_record(ckpt_dir, step)
  if record is None:
    return  # none, or unreadable: damaged, not of another version
  try:
    records.check_format(record, f"{ckpt_dir} at step {step}")
  except ValueError as e:
    raise ValueError(f"{e}{then}") from None


def _newest_readable(steps: Sequence[int], read: Callable[[int], Any],
                     older: str = "") -> Optional[tuple[int, Any]]:  # fmt: skip
  """(step, read(step)) of the newest of `steps` whose checkpoint reads and matches its
  checksums, with a warning naming the damaged ones passed over (as `--resume` falls
  back). A run writes one layout, so one of other shapes than an older intact one's is
  damaged (its checksums.json) and passed over too. With none readable: None where
  `older` names what is loaded instead, else the newest one's error (of other shapes
  first: another configuration)."""
  errors, unfit = [], []
  for step in reversed(steps):
    try:
      found = step, read(step)
    except CheckpointLayoutError as e:
      unfit.append(e)
      continue
    except DamagedCheckpointError as e:
      errors.append(e)
      continue
    if errors or unfit:
      warnings.warn(f"{_passed_over(errors, unfit)}: loaded the newest intact checkpoint, at "
                    f"env step {step:,}", RuntimeWarning, stacklevel=3)  # fmt: skip
    return found
  if (errors or unfit) and older:
    warnings.warn(f"{_passed_over(errors, unfit)}: loaded {older}", RuntimeWarning, stacklevel=3)
    return None
  if unfit:
    raise _another_configuration(unfit[0])
  raise errors[0]


def _passed_over(errors: list[Exception], unfit: list[Exception]) -> str:
  """The damaged checkpoints passed over, in one line: those that could not be read, and
  those whose checksums.json lists arrays of other shapes than an intact one holds."""
  return "; ".join([*map(str, errors), *(f"{e}: its {CHECKSUMS} is damaged" for e in unfit)])


def _another_configuration(error: CheckpointLayoutError) -> CheckpointLayoutError:
  return CheckpointLayoutError(f"{error}: config.json no longer describes the agent that "
                               "wrote it")  # fmt: skip


def _read_one(step: int, steps: Sequence[int], read: Callable[[int], Any]) -> Any:
  """read(step), where the checkpoint at `step` holding arrays of other shapes is damaged
  (DamagedCheckpointError: its checksums.json) when another of the run's `steps` reads: a
  run writes one layout."""
  try:
    return read(step)
  except CheckpointLayoutError as e:
    for other in reversed([s for s in steps if s != step]):
      try:
        read(other)
      except (ValueError, OSError):
        continue
      raise DamagedCheckpointError(f"{e}: its {CHECKSUMS} is damaged (the run's checkpoint "
                                   f"at env step {other:,} holds this run's)") from None  # fmt: skip
    raise _another_configuration(e) from None


def _warn_of_newer_incomplete(ckpt_dir: pathlib.Path, step: int) -> None:
  """Warns of checkpoints newer than `step` that are not complete (no checksums: being
  written, or damaged), which the newest parameters pass over."""
  newer = [s for s in incomplete_steps(ckpt_dir) if s > step]
  if newer:
    warnings.warn(f"{ckpt_dir}: the checkpoint at env step {newer[-1]:,} is incomplete (being "
                  f"written, or damaged): the newest complete one, at {step:,}, is loaded",
                  RuntimeWarning, stacklevel=3)  # fmt: skip


def _load_transform(path: pathlib.Path, template: Any) -> Any:
  """The data transformer's state saved beside parameters (`template`'s structure): the
  parameters act on observations transformed with it, so a run whose transformer has a
  state (observation statistics) and lacks the file is refused, not given fresh ones."""
  if not jax.tree.leaves(template):
    return template
  if not path.exists():
    raise ValueError(f"{path} is missing: the parameters beside it act on observations "
                     "transformed with the state it holds (--normalize-observations); load a "
                     "checkpoint's parameters (checkpoint=..., --checkpoint) instead")  # fmt: skip
  return load_params(path, template)


def _read_acting(ckpt_dir: pathlib.Path, step: int, num_seeds: int, index: int,
                 params: Any, transform: Any, *, compiled: bool) -> tuple[Any, Any]:  # fmt: skip
  """The parameters and transformer state of seed `index` in checkpoint `step` (the
  learner's arrays carry a leading seed axis of `num_seeds`; a compiled run's, of
  learners, under its whole state's `learner`)."""
  shapes = lambda tree: jax.tree.map(
      lambda x: jax.ShapeDtypeStruct((num_seeds,) + tuple(x.shape), x.dtype), tree
  )
  to_dict = flax.serialization.to_state_dict
  item = {"learner": {"agent": {"params": shapes(to_dict(params))},
                      "transform": shapes(to_dict(transform))}}  # fmt: skip
  if compiled:
    item = {"state": item}
  where = f"checkpoint {step} in {ckpt_dir}"
  arrays, record = read_checkpoint(ckpt_dir, step, item)
  records.check_format(record, f"{ckpt_dir} at step {step}", "compiled" if compiled else "envpool")
  learner = take_lane((arrays["state"] if compiled else arrays)["learner"], index)
  return (
      _check_shapes(params, flax.serialization.from_state_dict(params, learner["agent"]["params"]),
                    where),
      _check_shapes(transform, flax.serialization.from_state_dict(transform, learner["transform"]),
                    where),
  )  # fmt: skip
