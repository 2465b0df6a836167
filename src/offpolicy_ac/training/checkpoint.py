"""Checkpoints of the whole training state with orbax, written atomically.

A checkpoint holds a pytree of arrays (agent state: parameters, target/average
parameters, optimizer state, RNG keys, counters; replay buffers; loop counters
and keys) and a JSON record (log accumulators, metadata). Orbax writes each
step into a temporary directory and renames it when complete, so a kill during
a save leaves the previous checkpoints untouched; the last `max_to_keep` are
kept. `restore_latest` falls back to older checkpoints, with a warning, when
the newest cannot be read (the unreadable one is renamed aside, not deleted).

Multi-host jobs: the learner state is replicated, so process 0 alone writes
(`read_only=False`); the other processes open the same directory read-only
(a shared filesystem, as jax.distributed jobs have) and restore from it.
"""

from __future__ import annotations

import os
import pathlib
import time
from typing import Any
from typing import Callable
from typing import Optional
import warnings

import jax
import numpy as np


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


class Checkpointer:
  """Saves and restores `(arrays pytree, json dict)` pairs under `directory`."""

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
          max_to_keep=self._max_to_keep,
          create=not kwargs,
          enable_async_checkpointing=False,
          **kwargs,
      )
      self._manager_or_none = ocp.CheckpointManager(self.directory, options=options)
    return self._manager_or_none

  def save(self, step: int, arrays: Any, record: dict) -> None:
    if self.read_only:
      return
    ocp = _ocp()
    if step in self.steps():  # e.g. redoing steps after a fall-back
      self._manager.delete(step)
    self._manager.save(
        step,
        args=ocp.args.Composite(
            arrays=ocp.args.StandardSave(_to_savable(arrays)), record=ocp.args.JsonSave(record)
        ),
        force=True,
    )
    self._manager.wait_until_finished()

  def steps(self) -> list[int]:
    self._manager.reload()
    return sorted(self._manager.all_steps())

  def restore_latest(
      self, template: Any, check_record: Optional[Callable[[dict], None]] = None
  ) -> Optional[tuple[int, Any, dict]]:
    """(step, arrays, record) of the newest readable checkpoint, or None.

    `template` gives the pytree structure, shapes and dtypes of `arrays`.
    `check_record(record)` may raise for a checkpoint this code must not read (another
    format): the error propagates and the checkpoint is left as it is.
    """
    ocp = _ocp()
    template = _to_savable(template)
    for step in reversed(self.steps()):
      if check_record is not None:
        try:
          record = self._manager.restore(
              step, args=ocp.args.Composite(record=ocp.args.JsonRestore())
          )["record"]
        except Exception:  # pylint: disable=broad-except
          record = None  # unreadable: handled with the arrays below
        if record is not None:
          check_record(dict(record))  # a checkpoint of another kind: not quarantined
      try:
        restored = self._manager.restore(
            step,
            args=ocp.args.Composite(
                arrays=ocp.args.StandardRestore(template), record=ocp.args.JsonRestore()
            ),
        )
        return step, restored["arrays"], dict(restored["record"])
      except Exception as e:  # pylint: disable=broad-except
        if self.read_only:
          warnings.warn(
              f"checkpoint {step} in {self.directory} could not be read "
              f"({e!r}); trying the previous one",
              RuntimeWarning,
          )
          continue
        quarantine = self.directory / f"{step}.unreadable-{int(time.time())}"
        warnings.warn(
            f"checkpoint {step} in {self.directory} could not be read ({e!r}); "
            f"moved it to {quarantine.name} and falling back to the previous one",
            RuntimeWarning,
        )
        os.replace(self.directory / str(step), quarantine)
        self._manager.reload()
    return None

  def close(self) -> None:
    if self._manager_or_none is not None:
      self._manager_or_none.close()


def read_checkpoint(directory: str | pathlib.Path, step: int, item: Any) -> tuple[Any, dict]:
  """Reads part of one checkpoint without writing anything: (arrays, record).

  `item` names the subtrees of the saved arrays to read, as nested dicts (NamedTuples
  by their field names) whose leaves are `jax.ShapeDtypeStruct`s; the rest (a replay
  buffer, optimizer state) is not read. Arrays come back as NumPy arrays, in `item`'s
  structure.
  """
  ocp = _ocp()
  options = ocp.CheckpointManagerOptions(read_only=True, create=False)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # orbax's notes on read-only managers and shardings
    manager = ocp.CheckpointManager(pathlib.Path(directory).absolute(), options=options)
    try:
      restore_args = jax.tree.map(lambda _: ocp.ArrayRestoreArgs(restore_type=np.ndarray), item)
      restored = manager.restore(
          step,
          args=ocp.args.Composite(
              arrays=ocp.args.PyTreeRestore(
                  item=item, restore_args=restore_args, partial_restore=True
              ),
              record=ocp.args.JsonRestore(),
          ),
      )
    finally:
      manager.close()
  return restored["arrays"], dict(restored["record"])


def checkpoint_steps(directory: str | pathlib.Path) -> list[int]:
  """The steps of the complete checkpoints in `directory` (none when it does not exist)."""
  directory = pathlib.Path(directory)
  if not directory.is_dir():
    return []
  return sorted(
      int(p.name)
      for p in directory.iterdir()
      if p.name.isdigit() and (p / "_CHECKPOINT_METADATA").exists()
  )


def restore_newest(checkpointer: Optional[Checkpointer], template: Any,
                   check_record: Callable[[dict], Any]) -> Optional[tuple[Any, dict]]:  # fmt: skip
  """(arrays, record) of the newest readable checkpoint, or None, with a warning, when
  there is none (the run starts over). `check_record(record)` raises for a checkpoint
  this run must not read (another format, another kind of run)."""
  if checkpointer is None:
    raise ValueError("resume needs checkpoints (checkpoint_every > 0)")
  restored = checkpointer.restore_latest(template, check_record=check_record)
  if restored is None:
    warnings.warn(
        f"no readable checkpoint in {checkpointer.directory}: the run starts again from the "
        "beginning",
        RuntimeWarning,
    )
    return None
  _, arrays, record = restored
  return arrays, record
