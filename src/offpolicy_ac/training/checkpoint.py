"""Checkpoints of the whole training state with orbax, written atomically and verified.

A checkpoint holds a pytree of arrays (agent state: parameters, target/average
parameters, optimizer state, RNG keys, counters; replay buffers; loop counters
and keys) and a JSON record (log accumulators, metadata). Orbax writes each
step into a temporary directory and renames it when complete; then the CRC-32 of every
array and of the record is written (`checksums.json`, last, atomically), and only then
are the checkpoints older than the newest `max_to_keep` deleted, so a kill at any moment
of a save leaves the previous checkpoints intact. On restore, `restore_latest` falls back
to older checkpoints, with a warning that names it, when the newest cannot be read, has
no checksums (a save that did not finish) or does not match them (the damaged one is
renamed aside, not deleted, until the run's saves delete the checkpoints as old). With
none intact, `restore_newest` refuses, unless the only one was the run's first, cut short.

Multi-host jobs: the learner state is replicated, so process 0 alone writes
(`read_only=False`); the other processes open the same directory read-only
(a shared filesystem, as jax.distributed jobs have) and restore from it.
"""

from __future__ import annotations

import contextlib
import errno
import inspect
import json
import logging
import os
import pathlib
import shutil
import sys
import threading
import time
from typing import Any
from typing import Callable
from typing import Optional
from typing import Sequence
import warnings
import zlib

import jax
import numpy as np

from offpolicy_ac.analysis.metrics_file import read_json
from offpolicy_ac.training.logger import sync_directory
from offpolicy_ac.training.logger import write_atomic


def _ocp():
  import orbax.checkpoint as ocp  # slow to import: only when checkpointing

  return ocp


def _to_savable(tree: Any) -> Any:
  """Orbax stores arrays: typed PRNG keys become raw key data, scalars arrays."""

  def convert(x):
    if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
      return jax.random.key_data(x)
    if not isinstance(x, jax.Array) or jax.process_count() > 1:
      return np.asarray(x)  # multi-host orbax only writes global arrays; ours are local
    return x

  return jax.tree.map(convert, tree)


def abstract_arrays(tree: Any) -> Any:
  """`tree`'s arrays as `jax.ShapeDtypeStruct`s: a restore template that holds no memory
  (`Checkpointer.restore_latest`). jax.Arrays keep their sharding, restored as jax.Arrays
  placed so; other arrays have none, restored as NumPy arrays."""

  def abstract(x):
    if isinstance(x, jax.ShapeDtypeStruct):
      return x
    if not isinstance(x, jax.Array):
      return jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype)  # a scalar: as saved
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)

  return jax.tree.map(abstract, tree)


def _restore_target(template: Any) -> Any:
  """What `_to_savable(template)` saves, as `jax.ShapeDtypeStruct`s (`template`: arrays
  or their `abstract_arrays`): typed PRNG keys as their raw key data, and arrays other
  than single-process jax.Arrays without a sharding (restored as NumPy arrays)."""

  def target(x):
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
      data = jax.eval_shape(jax.random.key_data, x)
      return jax.ShapeDtypeStruct(data.shape, data.dtype, sharding=x.sharding)
    sharding = x.sharding if jax.process_count() == 1 else None
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)

  return jax.tree.map(target, abstract_arrays(template))


def _restore_args(target: Any) -> Any:
  """Orbax's restore arguments for `_restore_target`'s: jax.Arrays placed by the sharding
  where there is one, else NumPy arrays."""
  ocp = _ocp()
  return jax.tree.map(
      lambda x: ocp.RestoreArgs(restore_type=np.ndarray) if x.sharding is None
      else ocp.ArrayRestoreArgs(sharding=x.sharding), target,
  )  # fmt: skip


_CHUNK_BYTES = 64 << 20
"""Orbax writes an array in chunks of at most this size, into data files of about it:
written as one chunk into one file, an array was held again, compressed, as it was written
(a 1.4 GB array of random floats: 1.3 GB more during the save, now 0.3 GB)."""

CHECKSUMS = "checksums.json"
_SET_ASIDE = ".unreadable-"  # a damaged checkpoint renamed `<step>.unreadable-<time>`


class DamagedCheckpointError(ValueError):
  """A checkpoint's arrays do not match the checksums written with them."""


class CheckpointLayoutError(ValueError):
  """A checkpoint holds arrays of other shapes or dtypes than asked for: one of another
  configuration (config.json edited, the networks changed), or, where the run's other
  checkpoints fit, one whose checksums.json is damaged."""


class CheckpointAccessError(OSError):
  """A checkpoint that could not be read for a reason of the machine's, not of its bytes
  (no permission, no memory, too many open files, an I/O error): it is left as it is."""


_ACCESS_ERRNOS = {errno.EACCES, errno.EPERM, errno.ENOMEM, errno.EMFILE, errno.ENFILE,
                  errno.EIO, errno.ESTALE, errno.ETIMEDOUT}  # fmt: skip
_ACCESS_STATUSES = ("PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "UNAVAILABLE")  # tensorstore's


def _access_error(error: BaseException) -> bool:
  """Whether `error` (or one it was raised from) is the machine's: an OSError of
  `_ACCESS_ERRNOS`, a MemoryError, or a tensorstore error of `_ACCESS_STATUSES` (raised as
  a ValueError whose message starts with the status)."""
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    if isinstance(error, MemoryError) or (
        isinstance(error, OSError) and error.errno in _ACCESS_ERRNOS
    ):
      return True
    if str(error).startswith(_ACCESS_STATUSES):
      return True
    error = error.__cause__ or error.__context__
  return False


def _raise_if_access_error(error: BaseException, where: str) -> None:
  """Raises `CheckpointAccessError` for an `_access_error` reading the checkpoint `where`
  (which damage must not be taken for: it would be set aside, or passed over, intact)."""
  if _access_error(error):
    raise CheckpointAccessError(
        f"{where} could not be read ({_brief(error)}): not damage of the checkpoint but of "
        "access to it (permissions, memory, open files, the filesystem). It is left as it "
        "is: mend that, then try again"
    ) from error


def path_name(path: tuple) -> str:
  """A pytree path as "learner/agent/params/..." (dict keys and NamedTuple fields alike)."""
  return jax.tree_util.keystr(path, simple=True, separator="/")


def array_checksums(tree: Any) -> dict[str, str]:
  """The dtype, shape and CRC-32 of every array of `tree`, by its path (`path_name`)."""

  def checksum(leaf):
    x = np.ascontiguousarray(np.asarray(leaf))
    return f"{x.dtype.str}{list(x.shape)}:{zlib.crc32(x.reshape(-1).view(np.uint8)):08x}"

  return {path_name(p): checksum(x) for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


RECORD = "<record>"
"""The key of the record's checksum in checksums.json."""


def record_checksum(record: dict) -> str:
  """The CRC-32 of a checkpoint's JSON record (keys sorted)."""
  return f"{zlib.crc32(json.dumps(record, sort_keys=True).encode()):08x}"


def verify_checksums(tree: Any, expected: dict[str, str], where: str) -> None:
  """Raises DamagedCheckpointError when an array of `tree` differs from its checksum."""
  for name, value in array_checksums(tree).items():
    if expected.get(name) != value:
      raise DamagedCheckpointError(
          f"{where}: array {name} does not match its checksum (damaged or incomplete)"
      )


def layout_mismatch(template: Any, checksums: dict[str, str],
                    partial: bool = False) -> Optional[str]:  # fmt: skip
  """How the arrays a checkpoint holds (`checksums`: their dtypes and shapes) differ from
  `template`'s (with `partial`, `template`'s arrays only), or None when they agree: a
  checkpoint of another configuration, not a damaged one."""
  stored = {k: v.rpartition(":")[0] for k, v in checksums.items() if k != RECORD}
  try:  # `array_checksums` saw a scalar as [1] (np.ascontiguousarray)
    wanted = {path_name(path): f"{np.dtype(leaf.dtype).str}{list(leaf.shape) or [1]}"
              for path, leaf in jax.tree_util.tree_flatten_with_path(template)[0]}  # fmt: skip
  except TypeError:  # a dtype NumPy does not know: no judgement
    return None
  for key in sorted(set(wanted) if partial else set(stored) | set(wanted)):
    if stored.get(key) != wanted.get(key):
      return f"{key}: stored {stored.get(key, 'nothing')}, this run's {wanted.get(key, 'nothing')}"
  return None


def _read_checksums(step_dir: pathlib.Path) -> dict[str, str]:
  path = step_dir / CHECKSUMS
  if not path.exists():
    raise DamagedCheckpointError(f"{step_dir} has no {CHECKSUMS} (its save did not finish)")
  try:
    checksums = read_json(path)
  except ValueError as e:  # not JSON, or not text
    raise DamagedCheckpointError(str(e)) from None
  if not isinstance(checksums, dict) or not all(isinstance(v, str) for v in checksums.values()):
    raise DamagedCheckpointError(f"{path} is not a checkpoint's checksums (an object of "
                                 "strings): damaged")  # fmt: skip
  return checksums


SAVING = threading.Event()
"""Set while a checkpoint is written: the scripts' stop handlers let it finish."""

STORAGE_FULL = {
    errno.ENOSPC: "no space left on device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EFBIG: "a file would pass the file-size limit (ulimit -f)",
}
"""The write errors of storage that is full, for this process (a disk, a quota, a file-size
limit), with what the scripts call them: a run stops on one with its last checkpoint
intact, to be resumed once there is room."""


def _storage_full(message: str) -> Optional[int]:
  """The `STORAGE_FULL` errno a message names (tensorstore's say "No space left on device",
  "File too large", ...), or None."""
  return next((e for e in STORAGE_FULL if os.strerror(e) in message), None)


class Checkpointer:
  """Saves and restores `(arrays pytree, json dict)` pairs under `directory` (see the
  module docstring); `training.train` and `training.drive` take one as `checkpointer`, and
  resume from it with `resume=True`.

  Args:
    directory: where the checkpoints are (one subdirectory per env step), created when
      first used.
    max_to_keep: the newest checkpoints kept (the older ones are deleted after a save).
    read_only: save nothing (the non-writing processes of a multi-host job).
  """

  def __init__(self, directory: str | pathlib.Path, max_to_keep: int = 3, read_only: bool = False):
    if max_to_keep < 1:
      raise ValueError(f"max_to_keep must be >= 1, got {max_to_keep}")
    self.directory = pathlib.Path(directory).absolute()
    self._max_to_keep = max_to_keep
    self.read_only = read_only
    self._manager_or_none = None

  @property
  def _manager(self):
    """Created on first use, so orbax's slow import overlaps with compilation."""
    if self._manager_or_none is None:
      ocp = _ocp()
      kwargs = {}
      if jax.process_count() > 1:
        # Multi-host: one process writes (see the module docstring); no process
        # waits for the others inside orbax.
        pid = jax.process_index()
        kwargs["multiprocessing_options"] = ocp.options.MultiprocessingOptions(
            primary_host=pid,
            active_processes={pid},
            barrier_sync_key_prefix=f"offpolicy_ac_process{pid}",
        )
      self.directory.mkdir(parents=True, exist_ok=True)
      options = ocp.CheckpointManagerOptions(
          max_to_keep=None,  # `save` deletes the old ones, once the new one is complete
          create=not kwargs,
          enable_async_checkpointing=False,
          **kwargs,
      )
      self._manager_or_none = ocp.CheckpointManager(self.directory, options=options)
    return self._manager_or_none

  def save(self, step: int, arrays: Any, record: dict) -> None:
    if self.read_only:
      return
    SAVING.set()
    try:
      self._save(step, arrays, record)
    finally:
      SAVING.clear()

  def _save(self, step: int, arrays: Any, record: dict) -> None:
    ocp = _ocp()
    if step in self.steps():  # e.g. redoing steps after a fall-back
      self._manager.delete(step)
    savable = _to_savable(arrays)
    chunks = jax.tree.map(lambda _: ocp.SaveArgs(chunk_byte_size=_CHUNK_BYTES), savable)
    try:
      with _quiet_failed_save():
        self._manager.save(
            step,
            args=ocp.args.Composite(
                arrays=ocp.args.PyTreeSave(
                    savable, save_args=chunks, ocdbt_target_data_file_size=_CHUNK_BYTES
                ),
                record=ocp.args.JsonSave(record),
            ),
            force=True,
        )
        self._manager.wait_until_finished()
    except Exception as e:  # pylint: disable=broad-except
      # tensorstore reports a full disk as a ValueError ("RESOURCE_EXHAUSTED ... No space
      # left on device"): the OSError it is, so that scripts say so in one line.
      full = _storage_full(str(e))
      if full is not None and not isinstance(e, OSError):
        raise OSError(full, os.strerror(full), str(self.directory)) from e
      raise
    # Written last, once the checkpoint's files are on the disk: a checkpoint without them
    # is one whose save did not finish (a power loss included).
    _sync_tree(self.directory / str(step))
    checksums = {**array_checksums(savable), RECORD: record_checksum(record)}
    write_atomic(self.directory / str(step) / CHECKSUMS, json.dumps(checksums))
    steps = self.steps()
    for old in steps[: -self._max_to_keep]:
      self._manager.delete(old)
    # A copy set aside is kept while checkpoints as old are: as many as a run keeps.
    oldest_kept = steps[-self._max_to_keep :][0]
    for aside in self.directory.glob(f"*{_SET_ASIDE}*"):
      step = aside.name.split(_SET_ASIDE)[0]
      if step.isdigit() and int(step) < oldest_kept:
        shutil.rmtree(aside, ignore_errors=True)

  def steps(self) -> list[int]:
    self._manager.reload()
    return sorted(self._manager.all_steps())

  def restore_latest(
      self, template: Any, check_record: Optional[Callable[[dict], None]] = None
  ) -> Optional[tuple[int, Any, dict]]:
    """(step, arrays, record) of the newest readable checkpoint, or None.

    `template` gives the pytree structure, shapes and dtypes of `arrays`: arrays, or
    their `abstract_arrays` (the memory of a state is then held once as it is read).
    `check_record(record)` may raise for a checkpoint this code must not read (another
    format): the error propagates and the checkpoint is left as it is. Checkpoints of
    other arrays than `template`'s are left as they are too: with no other one readable,
    that is a ValueError naming the first difference. Newer than an intact one of
    `template`'s arrays, they are damaged (their checksums): set aside, with a warning.
    One that cannot be read for a reason of the machine's raises `CheckpointAccessError`
    and is left as it is.
    """
    ocp = _ocp()
    template = _restore_target(template)
    unfit = []  # checkpoints of other arrays (another configuration), not damaged ones
    for step in reversed(self.steps()):
      if check_record is not None:
        record, expected = None, None
        try:
          record = dict(self._manager.restore(
              step, args=ocp.args.Composite(record=ocp.args.JsonRestore())
          )["record"])  # fmt: skip
          expected = _read_checksums(self.directory / str(step)).get(RECORD)
        except Exception:  # pylint: disable=broad-except
          pass  # unreadable, or no checksums (an older version's): handled below
        # A record that does not match its checksum is damaged (set aside below), not a
        # checkpoint of another format or kind (refused here, and not set aside).
        if record is not None and expected in (None, record_checksum(record)):
          check_record(record)
      where = f"checkpoint {step} in {self.directory}"
      try:
        checksums = _read_checksums(self.directory / str(step))
        mismatch = layout_mismatch(template, checksums)
        if mismatch is not None:
          unfit.append((step, mismatch))
          continue
        restored = self._manager.restore(
            step,
            args=ocp.args.Composite(
                arrays=ocp.args.PyTreeRestore(template, restore_args=_restore_args(template)),
                record=ocp.args.JsonRestore(),
            ),
        )
        verify_checksums(restored["arrays"], checksums, where)
        if checksums.get(RECORD) != record_checksum(dict(restored["record"])):
          raise DamagedCheckpointError(f"{where}: its record does not match its checksum")
      except Exception as e:  # pylint: disable=broad-except
        _drop_closed_loop_callbacks()
        _raise_if_access_error(e, where)
        self._set_aside(step, f"could not be read ({_brief(e)})")
        continue
      # A run writes one layout: a newer checkpoint of another one than this intact one's
      # is damaged (its checksums.json), not one of another configuration.
      for newer, mismatch in unfit:
        self._set_aside(newer, f"holds arrays of other shapes than checkpoint {step}'s "
                        f"({mismatch}): its {CHECKSUMS} is damaged")  # fmt: skip
      return step, restored["arrays"], dict(restored["record"])
    if unfit:
      raise ValueError(
          f"the checkpoints in {self.directory} hold arrays of other shapes than this run's "
          f"(checkpoint {unfit[0][0]} ({unfit[0][1]})): config.json no longer describes them, "
          "or the library's networks changed. They are left as they are"
      )
    return None

  def _set_aside(self, step: int, why: str) -> None:
    """Warns that checkpoint `step` cannot be used (`why`) and, unless read-only, renames it
    `<step>.unreadable-<time>` (kept until `save` deletes the checkpoints as old)."""
    unreadable = f"checkpoint {step} in {self.directory} {why}"
    if self.read_only:
      warnings.warn(f"{unreadable}; trying the previous one", RuntimeWarning)
      return
    quarantine = self.directory / f"{step}{_SET_ASIDE}{int(time.time())}"
    moved = f"moved it to {quarantine.name} and falling back to the previous one"
    warnings.warn(f"{unreadable}; {moved}", RuntimeWarning)
    os.replace(self.directory / str(step), quarantine)
    self._manager.reload()

  def close(self) -> None:
    if self._manager_or_none is not None:
      self._manager_or_none.close()


def _sync_tree(path: pathlib.Path) -> None:
  """Syncs every file and directory below `path` (and `path`) to the disk."""
  for folder, _, files in os.walk(path):
    for name in files:
      with open(os.path.join(folder, name), "rb") as f:
        os.fsync(f.fileno())
    sync_directory(pathlib.Path(folder))


def _brief(error: BaseException, limit: int = 240) -> str:
  """An error in one short line: tensorstore's embed the whole store's spec (some 40
  lines of JSON), which buried what a warning says after them."""
  text = " ".join(f"{type(error).__name__}: {error}".split())
  return text if len(text) <= limit else text[: limit - 3] + "..."


class _FullDiskLines(logging.Filter):
  """Drops log lines about full storage: `Checkpointer.save` raises it, as one OSError."""

  def filter(self, record: logging.LogRecord) -> bool:
    return _storage_full(record.getMessage()) is None


def _closed_loop_callbacks_dropped(previous: Callable) -> Callable:
  """`sys.unraisablehook` but for the "Event loop is closed" of a callback into orbax's
  closed event loop and the errors of orbax's array reads left pending (a damaged
  checkpoint's other arrays, each with its tensorstore spec: some 60 lines), which it
  drops: the failure they belong to is reported once, where it was raised."""

  def hook(unraisable):
    error, source = unraisable.exc_value, unraisable.object
    closed_loop = isinstance(error, RuntimeError) and str(error) == "Event loop is closed"
    if not (closed_loop or _of_orbax(source)):
      previous(unraisable)

  hook.drops_closed_loop_callbacks = True
  return hook


def _of_orbax(source: Any) -> bool:
  """Whether `source` (an unraisable exception's object) is one of orbax's coroutines that
  read an array (`_read_array_index_and_device_put`): a save's errors are not dropped."""
  code = getattr(source, "cr_code", None) if inspect.iscoroutine(source) else None
  return (code is not None and f"{os.sep}orbax{os.sep}" in code.co_filename
          and "read" in code.co_name)  # fmt: skip


def _drop_closed_loop_callbacks() -> None:
  """From now on, drops the "Event loop is closed" of callbacks into orbax's closed event
  loop, and the errors of orbax's array reads left pending (`_closed_loop_callbacks_dropped`):
  after a failed read, the tensorstore reads still pending complete into it, later too,
  and those of a damaged file fail too (tracebacks of some 260 lines around the one-line
  warning that the checkpoint is passed over)."""
  if not getattr(sys.unraisablehook, "drops_closed_loop_callbacks", False):
    sys.unraisablehook = _closed_loop_callbacks_dropped(sys.unraisablehook)


@contextlib.contextmanager
def _quiet_failed_save():
  """Keeps a failed save (a full disk) to the one error `save` raises. orbax's threads log
  it too, with tracebacks; and the tensorstore writes still pending complete into orbax's
  closed event loop, each callback's "Event loop is closed" printed as an unraisable
  exception (about 20 tracebacks), later too: after a failure those stay dropped, as do
  the full-storage lines of orbax's other writing threads, which may fail after the first
  one's error has reached `save`."""
  absl, lines = logging.getLogger("absl"), _FullDiskLines()
  absl.addFilter(lines)
  previous = sys.unraisablehook
  sys.unraisablehook = _closed_loop_callbacks_dropped(previous)
  yield  # (after a failure, the filter and the hook stay)
  sys.unraisablehook = previous
  absl.removeFilter(lines)


@contextlib.contextmanager
def _quiet_absl():
  """absl's log lines below ERROR dropped while the context runs."""
  absl = logging.getLogger("absl")
  level = absl.level
  absl.setLevel(logging.ERROR)
  try:
    yield
  finally:
    absl.setLevel(level)


def read_checkpoint(directory: str | pathlib.Path, step: int, item: Any) -> tuple[Any, dict]:
  """Reads part of one checkpoint without writing anything: (arrays, record).

  `item` names the subtrees of the saved arrays to read, as nested dicts (NamedTuples
  by their field names) whose leaves are `jax.ShapeDtypeStruct`s; the rest (a replay
  buffer, optimizer state) is not read. Arrays come back as NumPy arrays, in `item`'s
  structure.

  Raises:
    DamagedCheckpointError: no checksums, files missing or cut short, or arrays or a
      record that do not match their checksums.
    CheckpointLayoutError: the checkpoint holds arrays of other shapes than `item`'s
      (another configuration, or damaged checksums: see the class).
    CheckpointAccessError: it could not be read for a reason of the machine's.
  """
  directory = pathlib.Path(directory).absolute()
  where = f"checkpoint {step} in {directory}"
  try:
    checksums = _read_checksums(directory / str(step))
  except OSError as e:
    _raise_if_access_error(e, where)
    raise
  mismatch = layout_mismatch(item, checksums, partial=True)
  if mismatch is not None:
    raise CheckpointLayoutError(f"{where} holds arrays of other shapes than asked for "
                                f"({mismatch})")  # fmt: skip
  try:
    restored = _restore_read_only(directory, step, item)
  except Exception as e:  # pylint: disable=broad-except
    _drop_closed_loop_callbacks()
    _raise_if_access_error(e, where)
    raise DamagedCheckpointError(f"{where} could not be read: {_brief(e)}") from e
  verify_checksums(restored["arrays"], checksums, where)
  record = dict(restored["record"])
  if checksums.get(RECORD) != record_checksum(record):
    raise DamagedCheckpointError(f"{where}: its record does not match its checksum")
  return restored["arrays"], record


@contextlib.contextmanager
def _read_only_manager(directory: str | pathlib.Path):
  """An orbax manager of `directory` that writes nothing."""
  ocp = _ocp()
  with warnings.catch_warnings(), _quiet_absl():  # orbax's notes on read-only managers
    warnings.simplefilter("ignore")
    options = ocp.CheckpointManagerOptions(read_only=True, create=False)
    manager = ocp.CheckpointManager(pathlib.Path(directory).absolute(), options=options)
    try:
      yield manager
    finally:
      manager.close()


def _restore_read_only(directory: str | pathlib.Path, step: int, item: Any) -> dict:
  """orbax's restore of `item` (and the record) from checkpoint `step`, writing nothing."""
  ocp = _ocp()
  with _read_only_manager(directory) as manager:
    restore_args = jax.tree.map(lambda _: ocp.ArrayRestoreArgs(restore_type=np.ndarray), item)
    return manager.restore(
        step,
        args=ocp.args.Composite(
            arrays=ocp.args.PyTreeRestore(
                item=item, restore_args=restore_args, partial_restore=True
            ),
            record=ocp.args.JsonRestore(),
        ),
    )


def read_record(directory: str | pathlib.Path, step: int) -> Optional[dict]:
  """The JSON record of checkpoint `step`, unverified (an earlier version's checkpoint has
  no checksums), or None where it cannot be read. Writes nothing."""
  ocp = _ocp()
  try:
    with _read_only_manager(directory) as manager:
      restored = manager.restore(step, args=ocp.args.Composite(record=ocp.args.JsonRestore()))
    return dict(restored["record"])
  except Exception:  # pylint: disable=broad-except
    return None


def checkpoint_steps(directory: str | pathlib.Path) -> list[int]:
  """The steps of the complete checkpoints in `directory` (none when it does not exist):
  those with their checksums, written last (a save in progress is not listed)."""
  return [step for step, complete in _step_folders(directory) if complete]


def incomplete_steps(directory: str | pathlib.Path) -> list[int]:
  """The steps of the checkpoints in `directory` without their checksums: being written,
  or damaged."""
  return [step for step, complete in _step_folders(directory) if not complete]


def written_steps(directory: str | pathlib.Path) -> list[int]:
  """The steps of the checkpoints in `directory` that orbax finished writing, with their
  checksums or not (a kill before them, or damage: the restore sets those aside)."""
  return [step for step, _ in _step_folders(directory)
          if (pathlib.Path(directory) / str(step) / "_CHECKPOINT_METADATA").exists()]  # fmt: skip


def set_aside_checkpoints(directory: str | pathlib.Path) -> list[str]:
  """The names of the checkpoints in `directory` set aside as damaged
  (`<step>.unreadable-<time>`), sorted."""
  return sorted(p.name for p in pathlib.Path(directory).glob(f"*{_SET_ASIDE}*"))


def _step_folders(directory: str | pathlib.Path) -> list[tuple[int, bool]]:
  """(step, complete) of each checkpoint folder in `directory`, by step."""
  directory = pathlib.Path(directory)
  if not directory.is_dir():
    return []
  folders = [p for p in directory.iterdir() if p.name.isdigit()]
  return sorted(
      (int(p.name), (p / "_CHECKPOINT_METADATA").exists() and (p / CHECKSUMS).exists())
      for p in folders
  )


def _first_save_cut_short(directory: pathlib.Path, set_aside: Sequence[str],
                          is_first: Callable[[dict], bool]) -> bool:  # fmt: skip
  """Whether the checkpoints set aside (`set_aside`, their names) are copies of the run's
  first one, whose save did not finish: of one step, without checksums, and with a record
  that `is_first` says is the first checkpoint's. (A save starts once the one before has
  its checksums: a later one cut short leaves the one before it complete.)"""
  if len({name.split(_SET_ASIDE)[0] for name in set_aside}) != 1:
    return False
  ocp = _ocp()
  for name in set_aside:
    if (directory / name / CHECKSUMS).exists():
      return False
    try:
      with ocp.Checkpointer(ocp.JsonCheckpointHandler()) as reader:
        record = reader.restore(directory / name / "record")
    except Exception:  # pylint: disable=broad-except
      return False  # unreadable: damaged
    if not is_first(dict(record)):
      return False
  return True


def restore_newest(checkpointer: Optional[Checkpointer], template: Any,
                   check_record: Callable[[dict], Any],
                   is_first: Callable[[dict], bool] = lambda record: False,
                   ) -> Optional[tuple[Any, dict]]:  # fmt: skip
  """(arrays, record) of the newest intact checkpoint, or None, with a warning, when the
  run wrote none (it starts over). `check_record(record)` raises for a checkpoint this
  run must not read (another format, another kind of run).

  A run killed as it wrote its first checkpoint (one without checksums, whose record
  `is_first` says is the first; by default none is) wrote none either: it starts over,
  that copy set aside.

  Raises:
    DamagedCheckpointError: the run wrote checkpoints but none is intact (each was moved
      aside, named `<step>.unreadable-<time>`): nothing is started over unasked.
    ValueError: no checkpoint holds arrays of the template's shapes (left as they are).
  """
  if checkpointer is None:
    raise ValueError("resume needs checkpoints (checkpoint_every > 0)")
  restored = checkpointer.restore_latest(template, check_record=check_record)
  if restored is None:
    damaged = set_aside_checkpoints(checkpointer.directory)
    if damaged and _first_save_cut_short(checkpointer.directory, damaged, is_first):
      warnings.warn(
          f"no complete checkpoint in {checkpointer.directory}: the save of the first one "
          f"did not finish ({', '.join(damaged)}): the run starts again from the beginning",
          RuntimeWarning,
      )
      return None
    if damaged:
      raise DamagedCheckpointError(
          f"no intact checkpoint in {checkpointer.directory}: {', '.join(damaged)} could not "
          "be read (damaged or incomplete). To start the run over, move its directory away "
          "or choose another --run-dir"
      )
    warnings.warn(
        f"no checkpoint in {checkpointer.directory}: the run starts again from the beginning",
        RuntimeWarning,
    )
    return None
  _, arrays, record = restored
  return arrays, record
