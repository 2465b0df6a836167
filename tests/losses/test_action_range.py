"""Out-of-range actions and mismatched weights: refused eagerly, NaN under `jit`,
reported by `checkify` (docs/design.md, Contract 1, "Errors").

Every loss that indexes by action is listed in `_INDEXING`, with the argument that
holds actions and the array whose action axis bounds them. Each is called with
actions A, A + 5 and -1 (A = 2 actions, the unrolled path, and A = 40, the gather
path): eagerly it raises ValueError naming the argument, the value and [0, A);
under `checkify.checkify(jax.jit(fn))` the same check is reported; with valid
actions the checked and the plain compiled programs are the same.
"""

import re

from absl.testing import parameterized
import chex
import jax
from jax.experimental import checkify
import jax.numpy as jnp
import numpy as np
import pytest

from offpolicy_ac import losses as L

T = 4


def _inputs(num_actions: int, shape: tuple[int, ...] = (T,)):
  rng = np.random.default_rng(0)
  q = jnp.asarray(rng.normal(size=shape + (num_actions,)), jnp.float32)
  logits = jnp.asarray(rng.normal(size=shape + (num_actions,)), jnp.float32)
  probs = jax.nn.softmax(logits, axis=-1)
  r = jnp.asarray(rng.normal(size=shape), jnp.float32)
  d = jnp.full(shape, 0.9, jnp.float32)
  mu = jnp.full(shape, 0.5, jnp.float32)
  return q, logits, probs, r, d, mu


def _cases(num_actions: int, shape: tuple[int, ...] = (T,)):
  """(id, argument name, fn(actions) -> outputs) for every loss that indexes by action;
  `shape`: the actions' ([T, *batch])."""
  q, logits, probs, r, d, mu = _inputs(num_actions, shape)
  return [
      ("take_action", "actions", lambda a: L.take_action(q, a)),
      ("categorical_log_prob", "actions", lambda a: L.categorical_log_prob(logits, a)),
      (
          "categorical_importance_ratios",
          "actions",
          lambda a: L.categorical_importance_ratios(logits, logits * 0.5, a),
      ),
      ("retrace-a_tm1", "a_tm1", lambda a: L.retrace(q, q, a, jnp.zeros_like(a), r, d, probs, mu)),
      ("retrace-a_t", "a_t", lambda a: L.retrace(q, q, jnp.zeros_like(a), a, r, d, probs, mu)),
      ("retrace_targets", "a_t", lambda a: L.retrace_targets(q, a, r, d, probs, mu)),
      ("acer_q_ret", "a_t", lambda a: L.acer_q_ret(q, a, r, d, probs, mu)),
      ("acer_policy_objective", "a_tm1", lambda a: L.acer_policy_objective(probs, probs, a, q, r)),
      ("acer_policy_loss", "a_tm1", lambda a: L.acer_policy_loss(probs, probs, a, q, r)),
      (
          "acer_trust_region_policy_loss",
          "a_tm1",
          lambda a: L.acer_trust_region_policy_loss(logits, logits, probs, a, q, r),
      ),
      ("acer_value_loss", "a_tm1", lambda a: L.acer_value_loss(q, a, r)),
      (
          "sql_nstep_td_error",
          "a_tm1",
          lambda a: L.sql_nstep_td_error(q, a, r, d, q, alpha=0.5, n=2),
      ),
      (
          "impala_loss_categorical",
          "a_tm1",
          lambda a: L.impala_loss_categorical(logits, logits, a, r, r, r, d),
      ),
  ]


_NUM_ACTIONS = [2, 40]  # the unrolled path (A <= 32) and the gather path
_CASE_IDS = [c[0] for c in _cases(2)]


def _case(case_id: str, num_actions: int, shape: tuple[int, ...] = (T,)):
  return next(c for c in _cases(num_actions, shape) if c[0] == case_id)


def _actions_with(bad: int) -> jax.Array:
  return jnp.asarray([0, 1, bad, 0], jnp.int32)


@pytest.mark.parametrize("num_actions", _NUM_ACTIONS)
@pytest.mark.parametrize("offset", [0, 5, -1], ids=["A", "A+5", "minus1"])
@pytest.mark.parametrize("case_id", _CASE_IDS)
def test_eager_out_of_range_action_raises_naming_the_argument(case_id, offset, num_actions):
  _, name, fn = _case(case_id, num_actions)
  bad = -1 if offset < 0 else num_actions + offset
  message = rf"`{name}` must hold actions in \[0, {num_actions}\).*got {bad} at index \(2,\)"
  with pytest.raises(ValueError, match=message):
    fn(_actions_with(bad))


def _masked_cases(num_actions: int):
  """(id, the step whose mask is False, fn(actions)) for every loss above that takes a
  mask: the actions of a step it does not read (`a_tm1` at a masked step; `a_t` where the
  trace does not continue, before a masked step) may hold anything."""
  q, logits, probs, r, d, mu = _inputs(num_actions)
  m = lambda step: jnp.arange(T) != step  # noqa: E731
  zero = jnp.zeros((T,), jnp.int32)
  return [
      ("retrace-a_tm1", 2, lambda a, k: L.retrace(q, q, a, zero, r, d, probs, mu, mask=m(k))),
      ("retrace-a_t", 3, lambda a, k: L.retrace(q, q, zero, a, r, d, probs, mu, mask=m(k))),
      ("retrace_targets", 3, lambda a, k: L.retrace_targets(q, a, r, d, probs, mu, mask=m(k))),
      ("acer_q_ret", 3, lambda a, k: L.acer_q_ret(q, a, r, d, probs, mu, mask=m(k))),
      ("acer_policy_objective", 2,
       lambda a, k: L.acer_policy_objective(probs, probs, a, q, r, mask=m(k))),
      ("acer_policy_loss", 2, lambda a, k: L.acer_policy_loss(probs, probs, a, q, r, mask=m(k))),
      ("acer_trust_region_policy_loss", 2,
       lambda a, k: L.acer_trust_region_policy_loss(logits, logits, probs, a, q, r, mask=m(k))),
      ("acer_value_loss", 2, lambda a, k: L.acer_value_loss(q, a, r, mask=m(k))),
      ("sql_nstep_td_error", 2,
       lambda a, k: L.sql_nstep_td_error(q, a, r, d, q, alpha=0.5, n=2, mask=m(k))),
      ("impala_loss_categorical", 2,
       lambda a, k: L.impala_loss_categorical(logits, logits, a, r, r, r, d, mask=m(k))),
  ]  # fmt: skip


@pytest.mark.parametrize("num_actions", _NUM_ACTIONS)
@pytest.mark.parametrize("case_id", [c[0] for c in _masked_cases(2)])
def test_an_action_the_mask_leaves_unread_may_hold_anything(case_id, num_actions):
  """docs/design.md: a masked step's inputs may hold anything. An out-of-range action
  there (-1 padding, say) was refused eagerly though ignored under jit."""
  _, step, fn = next(c for c in _masked_cases(num_actions) if c[0] == case_id)
  for bad in (-1, num_actions + 5):
    actions = _actions_with(bad)
    padded = jax.tree.leaves(fn(actions.at[step].set(bad).at[2].set(bad), step))
    chex.assert_trees_all_close(padded, jax.tree.leaves(fn(_actions_with(1), step)))
    err, _ = checkify.checkify(jax.jit(fn, static_argnums=1))(actions, step)
    assert err.get() is None
  with pytest.raises(ValueError, match="must hold actions in"):  # read where unmasked
    fn(_actions_with(num_actions), step + 1 if step < T - 1 else 0)


def test_concrete_padded_actions_with_a_traced_mask_are_not_refused():
  """Actions closed over (concrete), the mask traced: the range is checked in the program,
  at the steps read, not on the host at every step."""
  q, _, probs, r, d, mu = _inputs(3)
  actions = _actions_with(-1)  # -1 padding at step 2
  fn = lambda mask: L.retrace_targets(q, actions, r, d, probs, mu, mask=mask)  # noqa: E731
  mask = jnp.arange(T) != 3  # the trace does not continue from step 2: a_t[2] is not read
  chex.assert_trees_all_close(jax.jit(fn)(mask), fn(mask))
  err, _ = checkify.checkify(jax.jit(fn))(mask)
  assert err.get() is None
  err, _ = checkify.checkify(jax.jit(fn))(jnp.ones(T, bool))  # read: reported
  assert "`a_t` must hold actions in [0, 3)" in err.get()


@pytest.mark.parametrize("num_actions", _NUM_ACTIONS)
@pytest.mark.parametrize("case_id", _CASE_IDS)
def test_checkify_reports_an_out_of_range_action_under_jit(case_id, num_actions):
  _, name, fn = _case(case_id, num_actions)
  bad = num_actions + 5
  err, _ = checkify.checkify(jax.jit(fn))(_actions_with(bad))
  message = err.get()
  assert message is not None
  assert f"`{name}` must hold actions in [0, {num_actions})" in message
  assert f"got {bad} at flat index 2" in message
  with pytest.raises(checkify.JaxRuntimeError, match=re.escape(f"`{name}`")):
    err.throw()


@pytest.mark.parametrize("num_actions", _NUM_ACTIONS)
@pytest.mark.parametrize("case_id", _CASE_IDS)
def test_checkify_with_valid_actions_reports_nothing_and_changes_nothing(case_id, num_actions):
  _, _, fn = _case(case_id, num_actions)
  actions = _actions_with(1)
  err, checked = checkify.checkify(jax.jit(fn))(actions)
  assert err.get() is None
  chex.assert_trees_all_equal(checked, jax.jit(fn)(actions))


def test_checkify_reports_a_negative_action_in_a_batch():
  q, _, _, r, _, _ = _inputs(3)
  a = jnp.zeros((T, 2), jnp.int32).at[3, 1].set(-2)
  qb = jnp.stack([q, q], axis=1)
  err, _ = checkify.checkify(jax.jit(L.acer_value_loss))(qb, a, jnp.stack([r, r], axis=1))
  assert "`a_tm1` must hold actions in [0, 3)" in err.get()
  assert "got -2 at flat index 7" in err.get()


def test_checkify_reports_an_out_of_range_action_under_vmap():
  q, *_ = _inputs(2)
  err, _ = checkify.checkify(jax.vmap(L.take_action))(
      jnp.stack([q, q]), jnp.asarray([[0, 1, 0, 1], [0, 2, 0, 1]], jnp.int32)
  )
  assert "`actions` must hold actions in [0, 2)" in err.get()


@pytest.mark.parametrize("num_actions", _NUM_ACTIONS)
def test_eager_error_lists_every_bad_value(num_actions):
  q, *_ = _inputs(num_actions)
  a = jnp.asarray([-1, num_actions, 0, num_actions + 3], jnp.int32)
  message = rf"got -1 at index \(0,\) \(all out-of-range values: \[-1, {num_actions}, "
  with pytest.raises(ValueError, match=message + rf"{num_actions + 3}\]\); 3 of 4 entries"):
    L.take_action(q, a)


@pytest.mark.parametrize("num_actions", _NUM_ACTIONS)
@pytest.mark.parametrize("bad", [-1, 0, 5], ids=["minus1", "A", "A+5"])
def test_jit_out_of_range_action_selects_nan(num_actions, bad):
  """What the docs promise under `jit` without checkify: NaN at the bad entry only."""
  bad = -1 if bad < 0 else num_actions + bad
  q, logits, *_ = _inputs(num_actions)
  actions = _actions_with(bad)
  for out in (
      jax.jit(L.take_action)(q, actions),
      jax.jit(L.categorical_log_prob)(logits, actions),
  ):
    np.testing.assert_array_equal(np.isnan(np.asarray(out)), [False, False, True, False])
  np.testing.assert_array_equal(
      np.asarray(jax.jit(L.take_action)(q.astype(jnp.int32), actions))[2],
      np.iinfo(np.int32).min,
  )


def _compiled_ops(fn, *args) -> list[str]:
  """The opcodes of the compiled program."""
  text = jax.jit(fn).lower(*args).compile().as_text()
  return re.findall(r"= \S+ ([\w-]+)\(", text)


@pytest.mark.parametrize("shape", [(T, 0), (0,)], ids=["B=0", "T=0"])
@pytest.mark.parametrize("case_id", _CASE_IDS)
def test_an_empty_batch_under_jit_gives_what_the_eager_call_gives(case_id, shape):
  """An empty batch (B = 0; T = 0 for the per-step losses) works eagerly and gives empty
  outputs; under `jit` the range check took the argmin of no actions ("attempt to get argmin
  of an empty sequence"). Now `jit` and `checkify` give the eager outputs, or the eager
  call's own error (an empty time axis, for the targets)."""
  _, _, fn = _case(case_id, 2, shape)
  actions = jnp.zeros(shape, jnp.int32)
  try:
    eager = fn(actions)
  except ValueError as e:
    with pytest.raises(ValueError, match=re.escape(str(e))):
      jax.jit(fn)(actions)
    return
  chex.assert_trees_all_equal_shapes_and_dtypes(jax.jit(fn)(actions), eager)
  err, out = checkify.checkify(jax.jit(fn))(actions)
  err.throw()
  chex.assert_trees_all_equal_shapes_and_dtypes(out, eager)


@pytest.mark.parametrize("num_actions", _NUM_ACTIONS)
def test_range_check_costs_nothing_when_not_checkified(num_actions):
  """Under plain `jit` the check (an all-reduce and an argmin) is dead code that XLA
  removes; checkified, it is in the program."""
  q, *_ = _inputs(num_actions)
  actions = _actions_with(1)
  plain = _compiled_ops(L.take_action, q, actions)
  checked = _compiled_ops(checkify.checkify(L.take_action), q, actions)
  assert plain and not any(op.startswith("reduce") for op in plain), plain
  assert any(op.startswith("reduce") for op in checked), checked


def test_without_range_checks_the_traced_function_has_no_effect_and_nothing_to_report():
  """`jax.jit` dispatches a function with an effect through its slow Python path; without
  the range checks the function has none, and under jit a bad action still selects NaN."""
  q, *_ = _inputs(3)
  actions = _actions_with(7)
  assert jax.make_jaxpr(L.take_action)(q, actions).effects  # the debug_check's
  fast = L.without_range_checks(L.take_action)
  assert jax.make_jaxpr(fast)(q, actions).effects == set()
  err, out = checkify.checkify(jax.jit(fast))(q, actions)
  assert err.get() is None
  np.testing.assert_array_equal(np.isnan(np.asarray(out)), [False, False, True, False])
  with pytest.raises(ValueError, match="must hold actions"):  # eager checks stay
    fast(q, actions)
  assert jax.make_jaxpr(L.take_action)(q, actions).effects  # outside, the checks are back


# ---------------------------------------------------------------------------
# Weighted reductions.
# ---------------------------------------------------------------------------


def test_weighted_mean_of_the_issue_example_is_the_mean():
  x = jnp.arange(15.0).reshape(5, 3)
  w = jnp.broadcast_to(jnp.ones(3), x.shape)
  np.testing.assert_allclose(L.weighted_mean(x, w), 7.0)


def test_weighted_mean_refuses_negative_weights():
  """Weights summing to 0 with a negative one would make sum(w) no total (the mean was
  sum(w x) / 1)."""
  with pytest.raises(ValueError, match=r"`weights` must be >= 0, got \[1.0, -1.0\]"):
    L.weighted_mean(jnp.array([1.0, 2.0]), jnp.array([1.0, -1.0]))


def test_impala_loss_refuses_mismatched_weights():
  z = jnp.zeros((T, 2))
  with pytest.raises(ValueError, match=r"`weights` must have shape \(4, 2\)"):
    L.impala_loss(z, z, z, z, z, z, z, weights=jnp.ones((2,)))


class WeightedMeanVariantsTest(chex.TestCase):
  """`weighted_mean` with and without `jit`: shapes must match."""

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(
      ((5, 3), (3,)), ((5, 3), (5, 1)), ((3,), (5, 3)), ((5, 3), ()), ((5, 3), (3, 5))
  )
  def test_weighted_mean_refuses_mismatched_shapes(self, x_shape, w_shape):
    x, w = jnp.ones(x_shape), jnp.ones(w_shape)
    expected = re.escape(f"`weights` must have shape {x_shape} (matching `x`), got shape {w_shape}")
    with jax.numpy_rank_promotion("allow"), pytest.raises(ValueError, match=expected):
      self.variant(L.weighted_mean)(x, w)

  @chex.variants(with_jit=True, without_jit=True)
  def test_weighted_mean_of_bool_or_integer_values_is_a_float(self):
    """The fraction of clipped steps, `weighted_mean(rho > 1, mask)`, was cast back to the
    inputs' bool (True), and an integer mean truncated."""
    rho, mask = jnp.array([0.5, 2.0, 0.7, 3.0]), jnp.array([True, True, True, False])
    fraction = self.variant(L.weighted_mean)(rho > 1.0, mask)
    assert fraction.dtype == jnp.float32
    np.testing.assert_allclose(fraction, 1 / 3, rtol=1e-6)
    mean = self.variant(L.weighted_mean)(jnp.array([1, 2, 2]), jnp.array([1, 1, 1]))
    assert mean.dtype == jnp.float32
    np.testing.assert_allclose(mean, 5 / 3, rtol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(((5, 3),), ((7,),), ((2, 3, 4),))
  def test_weighted_mean_matches_numpy(self, shape):
    rng = np.random.default_rng(1)
    x = rng.normal(size=shape).astype(np.float32)
    w = rng.uniform(size=shape).astype(np.float32)
    out = self.variant(L.weighted_mean)(x, w)
    np.testing.assert_allclose(out, np.sum(w * x) / np.sum(w), rtol=1e-5)


def _without_action_axis_cases():
  """(values' name, fn) for losses given values [T, B] whose action axis was left out, with
  actions [T, B]: the values are named, not the actions as of the wrong shape."""
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.uniform(0.1, 0.9, size=(T, 2)), jnp.float32)  # [T, B], no axis A
  a, r = jnp.zeros((T, 2), jnp.int32), jnp.ones((T, 2), jnp.float32)
  return [
      ("values", lambda: L.take_action(x, a)),
      ("logits", lambda: L.categorical_log_prob(x, a)),
      ("logits_tm1", lambda: L.impala_loss_categorical(x, x, a, r, r, r, r)),
      ("q_tm1", lambda: L.acer_value_loss(x, a, r)),
      ("pi_tm1", lambda: L.acer_policy_objective(x, x, a, x, r)),
      ("logits_tm1", lambda: L.acer_trust_region_policy_loss(x, x, x, a, x, r)),
  ]


@pytest.mark.parametrize("case", range(len(_without_action_axis_cases())))
def test_values_without_their_action_axis_are_named_as_such(case):
  """They were reported as actions of the wrong shape: "`a_tm1` must have shape (4,)
  (matching `logits_tm1` without its action axis)"."""
  name, fn = _without_action_axis_cases()[case]
  with pytest.raises(ValueError, match=rf"^`{name}` has shape \(4, 2\) and `a(ctions|_tm1)` "
                     rf"\(4, 2\): `{name}` needs a trailing action axis \[\.\.\., A\]"):  # fmt: skip
    fn()


def test_nan_or_positive_infinite_logits_are_refused_by_name():
  """A diverged network's NaN logits were refused as "`rho_tm1` must be >= 0", a ratio the
  caller never passed; -inf (an action ruled out) and a NaN at a masked step are fine."""
  _, logits, _, r, d, _ = _inputs(3)
  a = jnp.zeros((T,), jnp.int32)
  loss = lambda pi, mu, **kw: L.impala_loss_categorical(pi, mu, a, r, r, r, d, **kw)  # noqa: E731
  with pytest.raises(ValueError, match=r"`logits_tm1` must be finite or -inf \(an action ruled "
                     r"out\), got nan at index \(2, 1\)"):  # fmt: skip
    loss(logits.at[2, 1].set(jnp.nan), logits)
  with pytest.raises(ValueError, match=r"`mu_logits_tm1` must be finite or -inf .* got inf"):
    loss(logits, logits.at[1, 0].set(jnp.inf))
  assert np.isfinite(loss(logits.at[1, 2].set(-jnp.inf), logits).loss)
  masked = loss(logits.at[2, 1].set(jnp.nan), logits, mask=jnp.arange(T) != 2)
  assert np.isfinite(masked.loss)


@pytest.mark.parametrize(
    "dtype, num_actions", [(np.uint8, 256), (np.uint8, 300), (np.int8, 128), (np.uint16, 65536)]
)
def test_actions_of_a_dtype_that_cannot_hold_the_action_count_are_read(dtype, num_actions):
  """A was cast to the actions' dtype for the range check, where 256 wraps to 0 in uint8:
  every uint8 action of 256 read as NaN (and the checkify check reported a valid one)."""
  values = jnp.arange(num_actions, dtype=jnp.float32)
  actions = np.array([0, 5, np.iinfo(dtype).max], dtype)
  expected = actions.astype(np.float32)
  np.testing.assert_array_equal(L.take_action(values[None].repeat(3, 0), actions), expected)
  logits = jnp.zeros((3, num_actions))
  err, out = checkify.checkify(jax.jit(L.categorical_log_prob))(logits, jnp.asarray(actions))
  assert err.get() is None
  np.testing.assert_allclose(out, np.full(3, -np.log(num_actions)), rtol=1e-6)
