"""The sequence replay buffer: contents, windows, overwrite order, whole-buffer sweeps."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from offpolicy_ac import replay as replay_lib


def _sequences(start, num, length=5):
  """[length, num] sequences whose values encode (sequence id, step)."""
  ids = np.arange(start, start + num)
  value = ids[None, :] * 100 + np.arange(length)[:, None]
  return {
      "x": jnp.asarray(value, jnp.float32),
      "obs": jnp.asarray(np.stack([value, -value], -1), jnp.int32),
  }


def test_add_then_sample_returns_contiguous_windows_of_stored_sequences():
  replay = replay_lib.make_sequence_replay(
      capacity=8, sequence_length=5, sample_length=3, batch_size=16
  )
  state = replay.add(replay.init(_sequences(0, 4)), _sequences(0, 4))
  assert int(state.size) == 4
  batch = jax.jit(replay.sample)(state, jax.random.PRNGKey(0))
  assert batch["x"].shape == (3, 16) and batch["obs"].shape == (3, 16, 2)
  x = np.asarray(batch["x"])
  ids, steps = x // 100, x % 100
  assert np.all(ids == ids[0]) and set(ids[0]) <= {0, 1, 2, 3}
  np.testing.assert_array_equal(np.diff(steps, axis=0), 1)  # time order kept
  assert steps.min() >= 0 and steps.max() <= 4
  np.testing.assert_array_equal(np.asarray(batch["obs"])[..., 1], -x)


def test_overwrites_oldest_rows_when_full():
  replay = replay_lib.make_sequence_replay(
      capacity=6, sequence_length=5, sample_length=5, batch_size=64
  )
  state = replay.init(_sequences(0, 4))
  for start in (0, 4, 8):
    state = replay.add(state, _sequences(start, 4))
  assert int(state.size) == 6
  stored = set((np.asarray(state.data["x"])[:, 0] // 100).astype(int))
  assert stored == {6, 7, 8, 9, 10, 11}


def test_epoch_visits_every_row_once_in_time_order():
  replay = replay_lib.make_sequence_replay(
      capacity=12, sequence_length=5, sample_length=5, batch_size=4
  )
  state = replay.add(replay.init(_sequences(0, 12)), _sequences(0, 12))
  batches = replay.epoch(state, jax.random.PRNGKey(3))
  x = np.asarray(batches["x"])  # [num_batches, L, batch]
  assert x.shape == (3, 5, 4)
  assert sorted((x[:, 0, :] // 100).ravel().tolist()) == list(range(12))
  np.testing.assert_array_equal(np.diff(x % 100, axis=1), 1)
  # Jitted, the batch count cannot be read: jax's ConcretizationTypeError named no argument.
  with pytest.raises(ValueError, match=r"replay_epoch: state.size is traced.*outside jit"):
    jax.jit(replay.epoch)(state, jax.random.PRNGKey(3))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(capacity=8, sequence_length=5, sample_length=6, batch_size=4), "longer than"),
        (dict(capacity=8, sequence_length=5, sample_length=1, batch_size=4), ">= 2"),
        (dict(capacity=8, sequence_length=0, sample_length=3, batch_size=4), "sequence_length"),
        (dict(capacity=0, sequence_length=5, sample_length=3, batch_size=4), "capacity"),
    ],
)
def test_bad_settings_raise(kwargs, message):
  with pytest.raises(ValueError, match=message):
    replay_lib.make_sequence_replay(**kwargs)


@pytest.mark.parametrize("jit", [False, True])
def test_replay_full_equals_init_then_add(jit):
  seqs = _sequences(3, 5)
  add = lambda s: replay_lib.replay_add(replay_lib.replay_init(s, 5), s, capacity=5)
  expected = jax.jit(add)(seqs) if jit else add(seqs)
  full = replay_lib.replay_full(seqs)
  assert jax.tree.structure(full) == jax.tree.structure(expected)
  for got, want in zip(jax.tree.leaves(full), jax.tree.leaves(expected)):
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("jit", [False, True])
def test_add_refuses_sequences_that_are_not_rows_of_the_buffer(jit):
  """A broadcast, a cast or a batch over the capacity would write something else."""
  replay = replay_lib.make_sequence_replay(
      capacity=3, sequence_length=5, sample_length=3, batch_size=4
  )
  state = replay.init(_sequences(0, 2))
  add = jax.jit(replay.add) if jit else replay.add
  good = _sequences(0, 2)
  bad = [
      ({**good, "obs": good["obs"][..., :1]}, r"\['obs'\] is int32\[5, 2, 1\]"),
      ({**good, "x": good["x"][:4]}, r"\['x'\] has shape \[4, 2\] and \['obs'\] \[5, 2, 2\]"),
      ({**good, "x": good["x"].astype(jnp.int32)}, r"\['x'\] is int32"),
      ({"x": good["x"]}, "sequences of structure"),
      (_sequences(0, 4), "4 sequences, more than the capacity 3"),
  ]
  for sequences, message in bad:
    with pytest.raises(ValueError, match=message):
      add(state, sequences)
  assert int(add(state, good).size) == 2
  # float64 is stored as float32 (x64 off): a wrong shape in float64 is named as the buffer
  # would store it, so that only the shape reads as wrong.
  wide = {**good, "x": np.asarray(good["x"], np.float64)[..., None].repeat(2, -1)}
  with pytest.raises(ValueError, match=r"\['x'\] is float32\[5, 2, 2\], the buffer takes float32"):
    add(state, wide)
  # A capacity that is not the buffer's would write rows past its end (dropped).
  with pytest.raises(ValueError, match="capacity=5, and the buffer holds 3 rows"):
    replay_lib.replay_add(state, good, capacity=5)
  if not jit:  # int64 values beyond int32 were stored wrapped (2**40 as 0)
    huge = {**good, "obs": np.full((5, 2, 2), 2**40, np.int64)}
    message = r"\['obs'\] holds int64 values outside int32's range .* from 1099511627776 to"
    with pytest.raises(ValueError, match="replay_add: " + message):
      add(state, huge)
    with pytest.raises(ValueError, match="replay_full: " + message):
      replay_lib.replay_full(huge)
    fits = {**good, "obs": np.asarray(good["obs"], np.int64)}
    assert int(add(state, fits).size) == 2 and int(replay_lib.replay_full(fits).size) == 2


def test_sequences_must_be_time_major_alike_in_every_leaf():
  """A leaf of another L or B, or without its batch axis, is refused by name at init (it
  would sample NaN or fill values past its end) and by `replay_full`."""
  good = _sequences(0, 2)
  replay = replay_lib.make_sequence_replay(
      capacity=np.int64(4), sequence_length=5, sample_length=3, batch_size=np.int32(2)
  )
  for bad, message in [
      ({**good, "x": good["x"][:4]}, r"\['x'\] has shape \[4, 2\] and \['obs'\] \[5, 2, 2\]"),
      ({**good, "x": good["x"][:, 0]}, r"\['x'\] has shape \[5\]"),
      ({**good, "x": good["x"][:, :1]}, r"\['x'\] has shape \[5, 1\]"),
  ]:
    with pytest.raises(ValueError, match="replay init: " + message):
      replay.init(bad)
    with pytest.raises(ValueError, match="replay_full: " + message):
      replay_lib.replay_full(bad)
  assert replay.capacity == 4 and int(replay.init(good).size) == 0
  # No sequence: a buffer of capacity 0 failed in JAX when sampled.
  with pytest.raises(ValueError, match=r"replay_full: the sequences hold no sequence \(B = 0\)"):
    replay_lib.replay_full({k: v[:, :0] for k, v in good.items()})
  state = replay.init(good)
  with pytest.raises(ValueError, match="replay_add: capacity='4', and the buffer holds 4 rows"):
    replay_lib.replay_add(state, good, capacity="4")
  # Adding none (B = 0) was a silent no-op, jitted or not.
  for add in (replay.add, jax.jit(replay.add)):
    with pytest.raises(ValueError, match=r"replay_add: the sequences hold no sequence \(B = 0\)"):
      add(state, {k: v[:, :0] for k, v in good.items()})


@pytest.mark.parametrize("leaf", [np.array([["a", "b"]] * 5), np.zeros((5, 2), object),
                                  np.zeros((5, 2), np.complex64)])  # fmt: skip
def test_leaves_that_are_not_numbers_or_booleans_are_refused_by_name(leaf):
  """Strings and objects got JAX's "only supports number, bool, and string dtypes ... in
  zeros", naming neither the leaf nor the call; complex was stored, which nothing reads."""
  sequences = {**_sequences(0, 2), "extra": leaf}
  message = rf"\['extra'\] is of dtype {leaf.dtype}; the buffer stores numbers and booleans"
  with pytest.raises(ValueError, match="replay_init: " + message):
    replay_lib.replay_init(sequences, 4)
  with pytest.raises(ValueError, match="replay_full: " + message):
    replay_lib.replay_full(sequences)
  kept = {**_sequences(0, 2), "low": np.zeros((5, 2), jnp.bfloat16), "flag": np.ones((5, 2), bool)}
  state = replay_lib.replay_add(replay_lib.replay_init(kept, 4), kept, capacity=4)
  assert state.data["low"].dtype == jnp.bfloat16 and int(state.size) == 2


def test_init_and_sample_refuse_sequences_of_another_length():
  """Windows longer than the stored rows would be gathered out of bounds (NaN or garbage)."""
  replay = replay_lib.make_sequence_replay(
      capacity=4, sequence_length=9, sample_length=9, batch_size=3
  )
  with pytest.raises(ValueError, match="the example's sequences have 5 steps, not sequence_le"):
    replay.init(_sequences(0, 2))
  state = replay_lib.replay_init(_sequences(0, 2), 4)
  with pytest.raises(ValueError, match="windows of 9 steps from stored sequences of 5"):
    replay_lib.replay_sample(state, jax.random.PRNGKey(0), batch_size=3, length=9)


def test_add_takes_the_numpy_example_init_was_built_from():
  """With x64 off, float64/int64 NumPy data is stored as float32/int32 by both."""
  replay = replay_lib.make_sequence_replay(
      capacity=4, sequence_length=5, sample_length=3, batch_size=2
  )
  example = (np.ones((5, 2), np.float64), np.ones((5, 2), np.int64))
  state = replay.add(replay.init(example), example)
  assert [x.dtype for x in state.data] == [jnp.float32, jnp.int32]
  assert int(state.size) == 2


def test_functions_refuse_counts_that_are_not_positive_ints():
  """An empty or negative capacity, batch or window was built silently (windows of 0 steps,
  a buffer of 0 rows) or failed inside JAX (a ZeroDivisionError, a broadcast's TypeError)."""
  seqs = _sequences(0, 2)
  state = replay_lib.replay_full(seqs)
  key = jax.random.PRNGKey(0)
  for capacity in (0, -1, 2.0):
    with pytest.raises(ValueError, match="replay_init: `capacity` must be a positive int"):
      replay_lib.replay_init(seqs, capacity)
  for batch_size, length in [(2, 0), (2, -2), (0, 3), (2, 3.0)]:
    with pytest.raises(ValueError, match="replay_sample: `(batch_size|length)` must be a posi"):
      replay_lib.replay_sample(state, key, batch_size=batch_size, length=length)
  for batch_size in (0, -1):
    with pytest.raises(ValueError, match="replay_epoch: `batch_size` must be a positive int"):
      replay_lib.replay_epoch(state, key, batch_size=batch_size)
  assert replay_lib.replay_sample(state, key, batch_size=np.int64(3), length=1)["x"].shape == (1, 3)


def test_sampling_an_empty_buffer_is_refused_unless_traced():
  """Eagerly, an empty buffer gave windows of zeros: FIRST steps with discount 0, which
  `loss_inputs` reads as real transitions into terminations."""
  replay = replay_lib.make_sequence_replay(
      capacity=4, sequence_length=5, sample_length=3, batch_size=2
  )
  empty, key = replay.init(_sequences(0, 2)), jax.random.PRNGKey(0)
  with pytest.raises(ValueError, match=r"the buffer is empty \(state.size == 0\)"):
    replay.sample(empty, key)
  assert jax.jit(replay.sample)(empty, key)["x"].shape == (3, 2)  # documented: zeros
  with pytest.raises(TypeError, match="replay_sample takes a ReplayState .*got dict"):
    replay.sample(empty._asdict(), key)
  with pytest.raises(ValueError, match=r"replay_sample: key must be a PRNG key .*got 3"):
    replay.sample(replay.add(empty, _sequences(0, 2)), 3)  # JAX's "invalid PRNG key data"
  # replay_add and replay_epoch too (an AttributeError on `size`, JAX's key message).
  with pytest.raises(TypeError, match="replay_add takes a ReplayState .*got dict"):
    replay.add(empty._asdict(), _sequences(0, 2))
  with pytest.raises(TypeError, match="replay_epoch takes a ReplayState .*got dict"):
    replay.epoch(empty._asdict(), key)
  with pytest.raises(ValueError, match=r"replay_epoch: key must be a PRNG key .*got 3"):
    replay.epoch(replay.add(empty, _sequences(0, 2)), 3)
  with pytest.raises(ValueError, match=r"^replay_epoch: the buffer holds 0 sequences, fewer"):
    replay.epoch(empty, key)
  for build in (lambda: replay_lib.replay_init({"x": np.zeros((0, 2))}, 4),
                lambda: replay_lib.replay_full({"x": np.zeros((0, 2))})):  # fmt: skip
    with pytest.raises(ValueError, match=r"sequences of no steps \(L = 0\)"):
      build()
