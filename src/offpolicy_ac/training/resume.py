"""What makes a run resumable: segment cuts in trajectories, and restoring a checkpoint.

A run is cut into segments at checkpoint points (`training/loop.py`); at a cut the last
step of the unroll is recorded as a time-limit truncation (`mark_cut`), so its value is
still bootstrapped, and a checkpoint holds the learner state with the driver's records
(`records.to_record`), restored by `restore`.
"""

from __future__ import annotations

from typing import Any
from typing import Callable
from typing import Optional
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from offpolicy_ac import envs
from offpolicy_ac.training import records
from offpolicy_ac.training.learner import LearnerState


def mark_cut(traj: envs.Trajectory) -> envs.Trajectory:
  """Records the end of an unroll as a time-limit truncation: LAST, discount 1.

  A step that already is a termination (LAST, discount 0) stays one. Works on device
  (JAX) and host (NumPy) trajectories.
  """
  last_is_termination = (traj.step_type[-1] == envs.LAST) & (traj.discount[-1] == 0)
  if isinstance(traj.step_type, np.ndarray):
    step_type, discount = traj.step_type.copy(), traj.discount.copy()
    step_type[-1] = envs.LAST
    discount[-1] = np.where(last_is_termination, 0.0, 1.0)
    return traj._replace(step_type=step_type, discount=discount)
  return traj._replace(
      step_type=traj.step_type.at[-1].set(envs.LAST),
      discount=traj.discount.at[-1].set(jnp.where(last_is_termination, 0.0, 1.0)),
  )


def restore_newest(checkpointer: Any, template: Any,
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


def restore(checkpointer: Any, template: LearnerState, num_seeds: int) -> Optional[tuple]:
  """(learner state, schedule, accumulators) of the newest readable checkpoint, or None,
  with a warning, when there is none (the run starts over)."""
  where = str(getattr(checkpointer, "directory", ""))
  restored = restore_newest(
      checkpointer, {"learner": template}, lambda r: records.from_record(r, num_seeds, where)
  )
  if restored is None:
    return None
  arrays, record = restored
  state = jax.tree.map(jnp.asarray, arrays["learner"])
  return (LearnerState(*state), *records.from_record(record, num_seeds, where))
