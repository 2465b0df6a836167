"""A sequence replay buffer as pure functions (flashbax's shape, our semantics).

Raw trajectories are stored as rows of fixed-length sequences, `[capacity, L, ...]`
(batch-major inside the buffer so a row is one contiguous sequence). Samples come
out time-major, `[length, batch, ...]`, ready for the losses. Sequences are
stored raw: data transformers are applied after sampling, the same way as to
fresh data. A sampled window may cross an episode junction; the losses' `mask`
(derived from step types) handles that.

    replay = make_sequence_replay(capacity=1000, sequence_length=T + 1,
                                  sample_length=9, batch_size=64)
    state = replay.init(example_traj)         # example: [L, B, ...] time-major
    state = replay.add(state, traj)           # traj: [L, B, ...]
    batch = replay.sample(state, key)         # [sample_length, batch_size, ...]

Jit `add` (or any step that returns the state) with the state donated,
`jax.jit(step, donate_argnums=0)`: otherwise XLA copies the whole buffer on every call
(`experiments/bench_replay.py`; the training learner donates its state).
"""

from __future__ import annotations

import functools
from typing import Any
from typing import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from offpolicy_ac.envs import check_key

__all__ = [
    "ReplayState",
    "SequenceReplay",
    "make_sequence_replay",
    "replay_add",
    "replay_epoch",
    "replay_full",
    "replay_init",
    "replay_sample",
]


class ReplayState(NamedTuple):
  """data: pytree of [capacity, L, ...]; insert_index and size: int32 scalars."""

  data: Any
  insert_index: jax.Array
  size: jax.Array


def _sequence_axes(sequences: Any, where: str) -> tuple[int, int]:
  """(L, B) of `sequences`, refusing leaves that are not all [L, B, ...] alike or not of a
  numeric or boolean dtype."""
  leaves = jax.tree_util.tree_flatten_with_path(sequences)[0]
  if not leaves:
    raise ValueError(f"{where}: sequences with no arrays")
  name = lambda path: jax.tree_util.keystr(path) or "the sequences"
  first_path, first = leaves[0][0], tuple(np.shape(leaves[0][1])[:2])
  for path, x in leaves:
    lead = tuple(np.shape(x)[:2])
    if len(lead) < 2 or lead != first:
      other = (
          f" and {name(first_path)} {list(np.shape(leaves[0][1]))}" if path != first_path else ""
      )
      raise ValueError(
          f"{where}: {name(path)} has shape {list(np.shape(x))}{other}; every leaf is "
          "[L, B, ...] time-major, with the same L and B"
      )
  if first[0] < 1:
    raise ValueError(f"{where}: sequences of no steps (L = 0): each holds at least one step")
  for path, x in leaves:  # strings and objects: JAX's own error named neither leaf nor call
    dtype = x.dtype if hasattr(x, "dtype") else np.result_type(x)
    if not any(jnp.issubdtype(dtype, kind) for kind in (jnp.floating, jnp.integer, jnp.bool_)):
      raise ValueError(f"{where}: {name(path)} is of dtype {dtype}; the buffer "
                       "stores numbers and booleans (complex: store the real and imaginary "
                       "parts as two leaves)")  # fmt: skip
  return first


def _check_positive(where: str, **values: Any) -> None:
  """Refuses a count that is not a positive int (an empty or negative buffer, batch or
  window would be built silently, or fail deep inside JAX)."""
  for name, value in values.items():
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
      raise ValueError(f"{where}: `{name}` must be a positive int, got {value!r}")


def replay_init(example: Any, capacity: int) -> ReplayState:
  """An empty buffer for sequences shaped like `example` ([L, B, ...] time-major), of its
  dtypes as JAX stores them (float64 as float32 unless x64 is enabled).

  Raises:
    ValueError: leaves that are not all [L, B, ...] with the same L and B or not of a
      numeric or boolean dtype, or a `capacity` that is not a positive int.
  """
  _check_positive("replay_init", capacity=capacity)
  _sequence_axes(example, "replay_init")
  data = jax.tree.map(
      lambda x: jnp.zeros(
          (capacity, x.shape[0]) + x.shape[2:], jax.dtypes.canonicalize_dtype(x.dtype)
      ),
      example,
  )
  return ReplayState(data, jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32))


def _check_state(state: Any, where: str) -> None:
  if not isinstance(state, ReplayState):
    raise TypeError(f"{where} takes a ReplayState (replay_init, replay_add), got "
                    f"{type(state).__name__}")  # fmt: skip


def replay_add(state: ReplayState, sequences: Any, *, capacity: int) -> ReplayState:
  """Writes the B sequences of `sequences` ([L, B, ...]) as rows, oldest overwritten.

  Raises:
    TypeError: `state` is not a `ReplayState`.
    ValueError: sequences of another structure, shape or dtype than the buffer's rows
      (a broadcast or a cast would write something else), B = 0, B > capacity, or a
      capacity that is not the buffer's.
  """
  _check_state(state, "replay_add")
  if jax.tree.structure(sequences) != jax.tree.structure(state.data):
    raise ValueError(f"replay_add: sequences of structure {jax.tree.structure(sequences)}, "
                     f"the buffer's {jax.tree.structure(state.data)}")  # fmt: skip
  rows_held = jax.tree.leaves(state.data)[0].shape[0]
  if capacity != rows_held:
    raise ValueError(f"replay_add: capacity={capacity!r}, and the buffer holds {rows_held} rows")
  _, batch = _sequence_axes(sequences, "replay_add")
  if batch < 1:  # adding nothing is a caller's slip, not a step of training
    raise ValueError("replay_add: the sequences hold no sequence (B = 0)")
  if batch > capacity:
    raise ValueError(f"replay_add: {batch} sequences, more than the capacity {capacity}")
  for (path, buf), x in zip(jax.tree_util.tree_flatten_with_path(state.data)[0],
                            jax.tree.leaves(sequences)):  # fmt: skip
    dtype = jax.dtypes.canonicalize_dtype(x.dtype)  # as `replay_init` stored it (x64 off)
    if tuple(x.shape) != (buf.shape[1], batch, *buf.shape[2:]) or dtype != buf.dtype:
      raise ValueError(f"replay_add: {jax.tree_util.keystr(path)} is {dtype}{list(x.shape)},"
                       f" the buffer takes {buf.dtype} [L, B, ...] with [L, ...] = "
                       f"{[buf.shape[1], *buf.shape[2:]]}")  # fmt: skip
    _check_ints_fit("replay_add", x, dtype, jax.tree_util.keystr(path))
  rows = (state.insert_index + jnp.arange(batch)) % capacity
  data = jax.tree.map(lambda buf, x: buf.at[rows].set(jnp.swapaxes(x, 0, 1)), state.data, sequences)
  return ReplayState(
      data, (state.insert_index + batch) % capacity, jnp.minimum(state.size + batch, capacity)
  )


def _check_ints_fit(where: str, x: Any, dtype: np.dtype, name: str) -> None:
  """Refuses NumPy integers that JAX's narrower dtype (int64 -> int32 with x64 off) would
  store wrapped: 2**40 was written as 0."""
  if isinstance(x, (np.ndarray, np.generic)) and x.dtype.kind in "iu" and x.dtype != dtype:
    info = np.iinfo(dtype)
    if x.size and (x.min() < info.min or x.max() > info.max):
      raise ValueError(f"{where}: {name} holds {x.dtype} values outside {dtype}'s range "
                       f"[{info.min}, {info.max}] (the buffer's), from {x.min()} to {x.max()}")  # fmt: skip


def replay_full(sequences: Any) -> ReplayState:
  """A buffer holding exactly the B sequences of `sequences` ([L, B, ...]), capacity B:
  what `replay_add(replay_init(sequences, B), sequences, capacity=B)` builds, laid out
  on the host and copied once (no JAX op runs, so nothing compiles). For fixed data
  such as demonstrations.

  Raises:
    ValueError: leaves that are not all [L, B, ...] with the same L and B or not of a
      numeric or boolean dtype, or B = 0.
  """
  _, batch = _sequence_axes(sequences, "replay_full")
  if batch < 1:
    raise ValueError("replay_full: the sequences hold no sequence (B = 0)")
  for path, x in jax.tree_util.tree_flatten_with_path(sequences)[0]:
    if isinstance(x, np.ndarray):  # JAX arrays hold JAX's dtypes already
      _check_ints_fit("replay_full", x, jax.dtypes.canonicalize_dtype(x.dtype),
                      jax.tree_util.keystr(path))  # fmt: skip
  data = jax.tree.map(lambda x: jnp.asarray(np.swapaxes(np.asarray(x), 0, 1)), sequences)
  return ReplayState(data, jnp.zeros((), jnp.int32), jnp.asarray(batch, jnp.int32))


def replay_sample(state: ReplayState, key: jax.Array, *, batch_size: int, length: int) -> Any:
  """Uniform windows of `length` steps: [length, batch_size, ...] time-major.

  Rows are drawn uniformly among the filled ones, each window's start uniformly
  in [0, L - length]. Windows are uniform, steps are not: a step near a row's ends lies in
  fewer windows (with L = 8 and length 4, steps 0 to 7 are drawn in proportion 1, 2, 3, 4,
  4, 3, 2, 1). Called eagerly, an empty buffer is refused; under `jit` (a traced size),
  sampling it returns zeros, which read as real steps: guard with `state.size`.

  Raises:
    TypeError: `state` is not a `ReplayState`.
    ValueError: the buffer is empty (a concrete `state.size` of 0), `length` exceeds the
      stored sequences' L, `batch_size` or `length` is not a positive int, or `key` is
      not a PRNG key.
  """
  _check_state(state, "replay_sample")
  _check_positive("replay_sample", batch_size=batch_size, length=length)
  check_key(key, "replay_sample: ")
  seq_len = jax.tree.leaves(state.data)[0].shape[1]
  if length > seq_len:
    raise ValueError(f"replay_sample: windows of {length} steps from stored sequences of "
                     f"{seq_len}")  # fmt: skip
  if not isinstance(state.size, jax.core.Tracer) and int(state.size) == 0:
    raise ValueError("replay_sample: the buffer is empty (state.size == 0): add sequences "
                     "first (replay_add)")  # fmt: skip
  row_key, start_key = jax.random.split(key)
  rows = jax.random.randint(row_key, (batch_size,), 0, jnp.maximum(state.size, 1))
  starts = jax.random.randint(start_key, (batch_size,), 0, seq_len - length + 1)
  idx = starts[:, None] + jnp.arange(length)[None, :]  # [batch, length]

  def gather(buf):
    seqs = buf[rows]  # [batch, L, ...]
    expand = (slice(None), slice(None)) + (None,) * (buf.ndim - 2)
    window = jnp.take_along_axis(
        seqs, jnp.broadcast_to(idx[expand], idx.shape + buf.shape[2:]), axis=1
    )
    return jnp.swapaxes(window, 0, 1)

  return jax.tree.map(gather, state.data)


def replay_epoch(state: ReplayState, key: jax.Array, *, batch_size: int) -> Any:
  """Whole-buffer training: all filled rows shuffled along the batch axis (time
  order kept), as [num_batches, L, batch_size, ...]; the remainder is dropped.

  The number of batches depends on `state.size`: call it outside `jit`, on a concrete
  state.

  Raises:
    TypeError: `state` is not a `ReplayState`.
    ValueError: `batch_size` is not a positive int, or exceeds the filled rows, `key`
      is not a PRNG key, or `state` is traced (under `jit`).
  """
  _check_state(state, "replay_epoch")
  _check_positive("replay_epoch", batch_size=batch_size)
  check_key(key, "replay_epoch: ")
  if isinstance(state.size, jax.core.Tracer):
    raise ValueError("replay_epoch: state.size is traced, and the number of batches depends "
                     "on it: call replay_epoch outside jit (jit what consumes its batches)")  # fmt: skip
  size = int(state.size)
  num_batches = size // batch_size
  if num_batches == 0:
    raise ValueError(f"replay_epoch: the buffer holds {size} sequences, fewer than one batch "
                     f"of {batch_size}")  # fmt: skip
  perm = jax.random.permutation(key, size)[: num_batches * batch_size]
  perm = perm.reshape(num_batches, batch_size)
  return jax.tree.map(lambda buf: jnp.moveaxis(buf[perm], 2, 1), state.data)


class SequenceReplay(NamedTuple):
  """Pure functions with static settings bound; see the module docstring."""

  init: Callable[[Any], ReplayState]
  add: Callable[[ReplayState, Any], ReplayState]
  sample: Callable[[ReplayState, jax.Array], Any]
  epoch: Callable[[ReplayState, jax.Array], Any]
  capacity: int
  sequence_length: int
  sample_length: int
  batch_size: int


def make_sequence_replay(
    *, capacity: int, sequence_length: int, sample_length: int, batch_size: int
) -> SequenceReplay:
  """Validates settings and binds them.

  Args:
    capacity: number of stored sequences (rows).
    sequence_length: L, steps per stored sequence (an unroll's T + 1).
    sample_length: steps per sampled window, 2 <= sample_length <= L.
    batch_size: windows per sample (drawn with replacement; whole-buffer
      sweeps need at least this many stored sequences).
  """
  _check_positive("make_sequence_replay", capacity=capacity, sequence_length=sequence_length,
                  sample_length=sample_length, batch_size=batch_size)  # fmt: skip
  capacity, sequence_length = int(capacity), int(sequence_length)
  sample_length, batch_size = int(sample_length), int(batch_size)
  if sample_length > sequence_length:
    raise ValueError(
        f"sample_length={sample_length} (mini_batch_length + 1) is longer than the "
        f"stored sequences (unroll_length + 1 = {sequence_length}); use a shorter "
        f"mini-batch length or a longer unroll"
    )
  if sample_length < 2:
    raise ValueError(f"sample_length must be >= 2 (one transition), got {sample_length}")

  def init(example: Any) -> ReplayState:
    length, _ = _sequence_axes(example, "replay init")
    if length != sequence_length:
      raise ValueError(f"replay init: the example's sequences have {length} steps, not "
                       f"sequence_length={sequence_length} ([L, B, ...] time-major)")  # fmt: skip
    return replay_init(example, capacity)

  return SequenceReplay(
      init=init,
      add=functools.partial(replay_add, capacity=capacity),
      sample=functools.partial(replay_sample, batch_size=batch_size, length=sample_length),
      epoch=functools.partial(replay_epoch, batch_size=batch_size),
      capacity=capacity,
      sequence_length=sequence_length,
      sample_length=sample_length,
      batch_size=batch_size,
  )
