"""Hypothesis strategies for time-major trajectories with episode boundaries.

`trajectories()` draws a `Trajectory` (see `offpolicy_ac.testing.trajectories`
for the layout): hypothesis chooses the shapes and each step's kind (MID,
termination, truncation; a junction follows every LAST step, or masked padding
runs from it to the window's end), so a failing example shrinks to a short
sequence with few boundaries; the values come from a drawn seed.

    from hypothesis import given, settings
    from offpolicy_ac import testing
    from offpolicy_ac.testing import strategies

    @settings(deadline=None)  # each new shape compiles `my_fn` once
    @given(strategies.trajectories())
    def test_my_target(traj):
      testing.assert_junction_split_invariant(my_fn, traj)

Needs hypothesis: `pip install 'offpolicy_ac[testing]'`.
"""

from offpolicy_ac._extras import missing

try:
  from hypothesis import strategies as st
except ImportError as e:  # pragma: no cover - exercised in a subprocess test
  raise missing("offpolicy_ac.testing.strategies", "hypothesis", "testing", e) from e

import numpy as np

from offpolicy_ac.testing import trajectories as _tr


def batch_shapes(max_rank: int = 2, max_size: int = 3) -> st.SearchStrategy:
  """Batch shapes `()`, `(B,)`, `(B1, B2)`, ... with rank and sizes bounded."""
  return st.lists(st.integers(1, max_size), max_size=max_rank).map(tuple)


@st.composite
def step_kinds(
    draw,
    t,
    batch_shape=(),
    *,
    allow_start_masked: bool = True,
    allow_padding: bool = True,
):
  """A `[T, *batch]` int8 array of step kinds with a junction after every LAST.

  Hypothesis picks each column's steps from MID, TERMINATION and TRUNCATION
  (shrinking towards MID); the step after a LAST step is a JUNCTION, and a
  column may start with one when `allow_start_masked`. With `allow_padding`, a
  LAST step may instead be followed by masked steps (JUNCTION) to the window's
  end, the padding of a sequence cut from a shorter episode.
  """
  shape = (t,) + tuple(batch_shape)
  kind = np.zeros(shape, np.int8)
  choices = st.sampled_from([_tr.MID, _tr.TERMINATION, _tr.TRUNCATION])
  for idx in np.ndindex(*shape[1:]):
    after_last = allow_start_masked and draw(st.booleans())
    padding = False
    for s in range(t):
      if after_last or padding:
        kind[(s,) + idx] = _tr.JUNCTION
        after_last = False
        continue
      k = draw(choices)
      kind[(s,) + idx] = k
      after_last = k != _tr.MID
      padding = after_last and s + 1 < t and allow_padding and draw(st.booleans())
  return kind


@st.composite
def trajectories(
    draw,
    t=st.integers(1, 12),
    batch_shape=batch_shapes(),
    num_actions=st.integers(1, 4),
    *,
    gamma=st.floats(0.5, 1.0),
    allow_start_masked: bool = True,
    allow_padding: bool = True,
    dtype=np.float32,
):
  """Draws a `Trajectory` with random shapes, boundaries and values.

  Args:
    draw: supplied by hypothesis.
    t: a strategy (or an int) for the number of steps T.
    batch_shape: a strategy (or a tuple) for the batch axes.
    num_actions: a strategy (or an int) for the action count A.
    gamma: a strategy (or a float) for the discount of non-terminal steps
      (one draw per trajectory).
    allow_start_masked: let a column start with a junction step.
    allow_padding: let a column end in masked padding after a LAST step.
    dtype: the floating dtype.
  """
  pick = lambda x: draw(x) if isinstance(x, st.SearchStrategy) else x  # noqa: E731
  t, batch_shape, num_actions = pick(t), tuple(pick(batch_shape)), pick(num_actions)
  gamma = pick(gamma)
  kind = draw(
      step_kinds(t, batch_shape, allow_start_masked=allow_start_masked, allow_padding=allow_padding)
  )
  discount, mask = _tr.layout_from_kinds(kind, gamma)
  rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
  return _tr.trajectory_from_layout(rng, discount, mask, kind, num_actions, dtype=dtype)
