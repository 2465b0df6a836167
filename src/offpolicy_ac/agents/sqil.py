"""SQIL: imitation by soft Q-learning with sparse rewards (Reddy et al. 2019,
arXiv:1905.11108).

The agent is SQL (`make_sql`); what makes it SQIL is the data: each update's
batch is half demonstrations, relabelled with reward 1, and half the agent's own
replayed experience, relabelled with reward 0, drawn from two replay buffers.
`make_sqil_batch_fn` builds the batch transform the training loop applies to
each sampled agent batch; given more demonstration windows than agent windows, it
weighs the agent's data less (the paper's lambda_samp < 1).

Continuous actions: SQIL here is SQIL over soft Q-learning with an SVGD sampler
(`agents/sql_continuous.py`), not the SQIL paper's SAC variant. SQIL is defined as soft
Q-learning with sparse rewards, and this library's SQIL is SQL on relabelled data, so one
agent serves both action kinds.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from offpolicy_ac import demos as demos_lib
from offpolicy_ac import losses
from offpolicy_ac import replay as replay_lib
from offpolicy_ac.agents.base import BatchFn
from offpolicy_ac.agents.sql import SqlConfig
from offpolicy_ac.agents.sql import make_sql
from offpolicy_ac.envs import EnvSpec
from offpolicy_ac.envs import Trajectory

SqilConfig = SqlConfig
"""SQIL's hyper-parameters: those of SQL (`SqlConfig`); SQIL changes the data, not the agent."""


def make_sqil(spec, config: SqlConfig = SqlConfig()):
  """SQIL's learner: SQL on relabelled batches (see `make_sqil_batch_fn`)."""
  return make_sql(spec, config, name="sqil")


def _relabel(batch: Trajectory, is_demonstration: bool) -> Trajectory:
  return batch._replace(reward=losses.sqil_relabel(batch.reward, jnp.asarray(is_demonstration)))


def make_sqil_batch_fn(demo_sequences: Trajectory, *, batch_size: int, length: int) -> BatchFn:
  """Returns batch_fn(agent_batch [length, B], key) -> [length, B + batch_size].

  Args:
    demo_sequences: demonstrations cut into sequences, Trajectory [L, S, ...]
      (see `offpolicy_ac.demos.cut_episodes`), L >= length.
    batch_size: demonstration windows per batch. The SQIL paper's batches are half and
      half: batch_size = B, the agent's windows. With batch_size > B the agent's data
      weigh less in the loss's mean, as the paper's lambda_samp < 1 does (B / batch_size
      in expectation), at the same update cost for B + batch_size fixed.
    length: steps per window, >= 2 (a window of L steps holds L - 1 transitions).

  Returns:
    A `BatchFn` whose data is the demonstrations (on the default device): the training
    drivers pass it to their compiled updates as an argument, after its `check` has
    refused demonstrations that do not fit the agent's task (`demos.check_demo_sequences`).

  Raises:
    TypeError: `demo_sequences` is not a Trajectory (uncut demonstrations, a dict).
    ValueError: `batch_size` < 1, `length` < 2, or sequences shorter than `length`.
  """
  if not isinstance(demo_sequences, Trajectory):
    raise TypeError(
        "make_sqil_batch_fn takes demonstrations cut into sequences, a Trajectory [L, S, ...] "
        f"(demos.cut_episodes(demos.load_demos(path), length)), got {type(demo_sequences).__name__}"
    )
  for name, value, low in (("batch_size", batch_size, 1), ("length", length, 2)):
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < low:
      raise ValueError(f"make_sqil_batch_fn: {name} must be an int >= {low}, got {value!r}")
  batch_size, length = int(batch_size), int(length)
  seq_len = np.shape(demo_sequences.step_type)[0]
  if seq_len < length:
    raise ValueError(
        f"demonstration sequences have {seq_len} steps, fewer than the "
        f"sampled windows' {length}"
    )
  # Built on the host: eager replay_init + replay_add would compile each primitive
  # (~1 s of a CartPole run's start-up).
  state = replay_lib.replay_full(demo_sequences)
  return BatchFn(
      fn=functools.partial(_mix_in_demonstrations, batch_size, length),
      data=state,
      check=functools.partial(_check_fits, demo_sequences),
  )


def _check_fits(demo_sequences: Trajectory, spec: EnvSpec) -> None:
  """Refuses demonstrations that do not fit the task SQIL trains on (actions out of its
  range give NaN parameters at the first update, blamed on the learning rate)."""
  demos_lib.check_demo_sequences(
      demo_sequences, spec, where=f"make_sqil_batch_fn's demonstrations (for {spec.task_id})"
  )


def _mix_in_demonstrations(batch_size: int, length: int, demos: Any, agent_batch: Trajectory,
                           key: jax.Array) -> Trajectory:  # fmt: skip
  """`agent_batch` relabelled with reward 0, then `batch_size` windows sampled from the
  demonstrations' replay state `demos`, relabelled with reward 1, along the batch axis.
  The demonstrations have no behaviour extras: theirs are zeros of the agent's shapes."""
  demo_batch = replay_lib.replay_sample(demos, key, batch_size=batch_size, length=length)
  for field in ("observation", "action"):
    demo_shape, agent_shape = getattr(demo_batch, field).shape, getattr(agent_batch, field).shape
    if demo_shape[2:] != agent_shape[2:] or agent_shape[0] != length:
      raise ValueError(
          f"the demonstrations' {field} windows are {list(demo_shape)} [length, batch, ...], "
          f"the agent's {list(agent_shape)}: they join along the batch axis"
      )
  demo_dtype, agent_dtype = demo_batch.action.dtype, agent_batch.action.dtype
  if jnp.issubdtype(demo_dtype, jnp.integer) != jnp.issubdtype(agent_dtype, jnp.integer):
    raise ValueError(
        f"the demonstrations' actions are {demo_dtype} and the agent's {agent_dtype}: "
        "integer action indices and float actions do not mix (a cast would truncate them)"
    )

  def demo_shaped(x, fill=0):
    """A [length, batch_size, ...] array of `fill` with the agent's leaf x's trailing shape."""
    return jnp.full((length, batch_size) + x.shape[2:], fill, x.dtype)

  demo_batch = demo_batch._replace(
      action=demo_batch.action.astype(agent_batch.action.dtype),
      observation=demo_batch.observation.astype(agent_batch.observation.dtype),
      env_id=demo_shaped(agent_batch.env_id, fill=-1),
      extras=jax.tree.map(demo_shaped, agent_batch.extras),
  )
  parts = (_relabel(agent_batch, False), _relabel(demo_batch, True))
  return jax.tree.map(lambda a, d: jnp.concatenate([a, d], axis=1), *parts)
