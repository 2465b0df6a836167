"""The kit's trajectories have the layout they promise (NumPy generators and strategies)."""

import subprocess
import sys

from hypothesis import find
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
import numpy as np
import pytest

from offpolicy_ac import testing
from offpolicy_ac.testing import strategies


def assert_layout(traj):
  """Every documented property of a Trajectory's layout."""
  t = np.shape(traj.r_t)[0]
  lead = np.shape(traj.r_t)
  for name in testing.Trajectory._fields:
    x = np.asarray(getattr(traj, name))
    want = lead + ((traj.num_actions,) if name in ("q_tm1", "q_t", "pi_t") else ())
    assert x.shape == want, (name, x.shape, want)
  kind, mask = np.asarray(traj.kind), np.asarray(traj.mask)
  assert mask.dtype == bool
  np.testing.assert_array_equal(mask, kind != testing.JUNCTION)
  last = (kind == testing.TERMINATION) | (kind == testing.TRUNCATION)
  junction = kind == testing.JUNCTION
  # A junction follows every LAST step (but the window's last); after step 0, a junction
  # follows a LAST step or a junction, and two junctions in a row start the padding, which
  # runs to the window's end.
  assert not (last[:-1] & ~junction[1:]).any()
  np.testing.assert_array_equal(junction[1:] & ~last[:-1], junction[1:] & junction[:-1])
  if t > 2:
    in_padding = np.logical_or.accumulate(junction[1:-1] & junction[:-2], axis=0)
    assert junction[2:][in_padding].all()
  np.testing.assert_array_equal(np.asarray(traj.discount_t)[kind == testing.TERMINATION], 0.0)
  real = np.asarray(traj.discount_t)[mask & (kind != testing.TERMINATION)]
  assert ((real >= 0.5) & (real <= 1.0)).all()
  # Chained values: the observation after step s is the one step s + 1 starts from.
  if t > 1:
    np.testing.assert_array_equal(traj.v_t[:-1], traj.v_tm1[1:])
    np.testing.assert_array_equal(traj.q_t[:-1], traj.q_tm1[1:])
    np.testing.assert_array_equal(traj.a_t[:-1], traj.a_tm1[1:])
  for a in (traj.a_tm1, traj.a_t):
    assert a.dtype == np.int32 and (a >= 0).all() and (a < traj.num_actions).all()
  np.testing.assert_allclose(np.sum(traj.pi_t, -1), 1.0, rtol=1e-5)
  assert (np.asarray(traj.mu_t) > 0).all() and (np.asarray(traj.mu_t) <= 1).all()
  # The log ratios are of the same policies: log pi(a_s|x_s) - log mu(a_s|x_s).
  if t > 1:
    pi, mu = np.asarray(traj.pi_t, np.float64), np.asarray(traj.mu_t, np.float64)
    taken = np.take_along_axis(pi, np.asarray(traj.a_t)[..., None], axis=-1)[..., 0]
    both_real = mask[:-1] & mask[1:]
    from_probabilities = (np.log(taken) - np.log(mu))[:-1][both_real]
    np.testing.assert_allclose(np.asarray(traj.log_rho_tm1, np.float64)[1:][both_real],
                               from_probabilities, rtol=1e-2, atol=1e-2)  # fmt: skip


@pytest.mark.parametrize("seed", range(20))
def test_random_trajectory_layout(seed):
  assert_layout(testing.random_trajectory(np.random.default_rng(seed)))


def test_random_trajectory_draws_every_kind_and_shape_rank():
  rng = np.random.default_rng(0)
  trajs = [testing.random_trajectory(rng) for _ in range(60)]
  kinds = set(np.concatenate([np.ravel(t.kind) for t in trajs]).tolist())
  assert kinds == {testing.MID, testing.TERMINATION, testing.TRUNCATION, testing.JUNCTION}
  assert {len(t.batch_shape) for t in trajs} == {0, 1, 2}
  assert any(not t.mask[0].all() for t in trajs)  # windows that start at a junction


def test_default_examples_hold_every_boundary():
  examples = testing.default_examples()
  assert [x.batch_shape for x in examples[:3]] == [(), (3,), (2, 2)]
  for x in examples:
    assert_layout(x)
    assert {testing.TERMINATION, testing.TRUNCATION, testing.JUNCTION} <= set(np.ravel(x.kind))
  # Some column ends in padding: two masked steps in a row.
  assert any(_padded(x) for x in examples)


def _padded(traj):
  """Two masked steps in a row: a column that ends in padding."""
  return bool((~traj.mask[1:] & ~traj.mask[:-1]).any())


def test_strategies_draw_padding_unless_told_not_to():
  padded = find(
      strategies.trajectories(t=st.integers(3, 8)),
      _padded,
      settings=settings(max_examples=500, deadline=None, database=None),
  )
  assert_layout(padded)


@settings(max_examples=30, deadline=None)
@given(strategies.trajectories(allow_padding=False))
def test_strategies_without_padding(traj):
  assert_layout(traj)
  assert not _padded(traj)


def test_junction_discounts_and_rewards_are_garbage():
  x = testing.default_examples()[1]
  junction = ~x.mask
  assert (x.discount_t[junction] >= 2.0).all()  # not a valid discount at all
  assert np.abs(x.r_t[junction]).max() > 10.0


@settings(max_examples=30, deadline=None)
@given(strategies.trajectories())
def test_strategy_layout(traj):
  assert_layout(traj)


@settings(max_examples=10, deadline=None)
@given(strategies.trajectories(t=5, batch_shape=(2,), num_actions=2, allow_start_masked=False))
def test_strategy_fixed_shapes(traj):
  assert traj.r_t.shape == (5, 2) and traj.num_actions == 2
  assert traj.mask[0].all()


def test_random_layout_and_junction_layout():
  d, mask, kind = testing.random_layout(
      np.random.default_rng(1), 50, (2,), gamma=0.9, junction_discount=7.0
  )
  np.testing.assert_array_equal(d[~mask], 7.0)
  np.testing.assert_array_equal(d[kind == testing.TRUNCATION], 0.9)
  mask, slices = testing.junction_layout([2, 3], lead_masked=True)
  np.testing.assert_array_equal(mask, [False, True, True, False, True, True, True])
  assert slices == [slice(1, 3), slice(4, 7)]
  with pytest.raises(ValueError, match="p_termination"):
    testing.random_layout(np.random.default_rng(0), 3, p_termination=0.7, p_truncation=0.5)
  with pytest.raises(ValueError, match=r"p_padding must be in \[0, 1\], got 1.5"):
    testing.random_layout(np.random.default_rng(0), 3, p_padding=1.5)


def test_random_layout_pads_from_the_first_last_step():
  _, mask, kind = testing.random_layout(
      np.random.default_rng(2), 12, (6,), p_padding=1.0, p_start_masked=0.0
  )
  last = (kind == testing.TERMINATION) | (kind == testing.TRUNCATION)
  for col in range(6):
    first = np.flatnonzero(last[:, col])
    end = first[0] + 1 if first.size else 12
    assert mask[:end, col].all() and not mask[end:, col].any()
  assert (~mask[1:] & ~mask[:-1]).any()


def test_strategies_without_hypothesis_name_the_extra():
  script = (
      "import sys\n"
      "sys.modules['hypothesis'] = None\n"
      "import offpolicy_ac.testing as t\n"  # the checks and references need no hypothesis
      "t.assert_junction_split_invariant, t.reference.vtrace\n"
      "try:\n"
      "  t.strategies\n"
      "except ImportError as e:\n"
      "  print(e)\n"
  )
  out = subprocess.run(
      [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
  )
  assert out.stdout.strip() == (
      "offpolicy_ac.testing.strategies needs hypothesis, which is not installed: "
      "pip install 'offpolicy_ac[testing]'"
  ), (out.stdout + out.stderr)


@pytest.mark.parametrize(
    "make", [testing.random_trajectory, lambda rng: testing.random_layout(rng, 4)]
)
def test_a_seed_for_the_generator_is_refused_by_name(make):
  """random_trajectory(0) failed with "'int' object has no attribute 'integers'"."""
  with pytest.raises(TypeError, match=r"rng must be a NumPy Generator, e.g. np.random.default_rng"):
    make(0)
  make(np.random.default_rng(0))


def test_impossible_data_is_refused_where_the_trajectory_is_built():
  """A termination that bootstraps, a discount above 1, T = 0 or an integer dtype were
  built silently, and a correct target then failed a check ("a termination must not
  bootstrap"), or every discount was truncated to 0."""
  rng = np.random.default_rng(0)
  kind = np.array([0, 1, 3, 0, 0], np.int8)  # MID, TERMINATION, JUNCTION, MID, MID
  good = np.where(kind == 1, 0.0, 0.9)
  testing.trajectory_from_layout(rng, good, kind != 3, kind)
  refused = [
      ((np.full(5, 0.9), kind != 3, kind), {}, r"step \(1,\) is a TERMINATION with discount_t 0.9"),
      ((np.where(kind == 1, 0.0, 1.2), kind != 3, kind), {}, r"discount_t must be in \[0, 1\] at "
       "real .* got 1.2"),
      ((np.zeros(0), np.zeros(0, bool), np.zeros(0, np.int8)), {}, r"T >= 1 steps, got shape \(0,\)"),
      ((good, kind != 3, kind), {"dtype": np.int32}, "dtype must be a floating dtype, got int32"),
  ]  # fmt: skip
  for args, kwargs, message in refused:
    with pytest.raises(ValueError, match=message):
      testing.trajectory_from_layout(rng, *args, **kwargs)
  for gamma in (1.2, -0.5, float("nan"), (0.5, 1.5)):
    with pytest.raises(ValueError, match=r"gamma must be in \[0, 1\]"):
      testing.random_trajectory(rng, 6, (2,), 3, gamma=gamma)
  with pytest.raises(ValueError, match=r"T >= 1 steps"):
    find(strategies.trajectories(t=0), lambda traj: True)
