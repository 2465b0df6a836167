"""Time-major trajectories with episode boundaries, drawn with a NumPy generator.

A `Trajectory` holds every per-step array the library's targets take, laid out
`[T, *batch]` (time first, any number of batch axes) the way an auto-resetting
environment produces them: row `s` is the transition `(x_s, a_s, r_s, x_{s+1})`.

Each step has a kind:

* `MID`: an ordinary step, `discount_t = gamma`.
* `TERMINATION`: the episode ends (LAST), `discount_t = 0`.
* `TRUNCATION`: the episode is cut by a time limit (LAST), the environment's
  discount stays 1, so `discount_t = gamma` and the final observation's value
  is bootstrapped.
* `JUNCTION`: the auto-reset step that follows every LAST step (and may open a
  window that starts right after a LAST). It is not a real transition:
  `mask` is False there and its reward, discount, action and ratios hold
  garbage that a correct target must ignore.

Values are chained like real data: `v_t[s] == v_tm1[s + 1]`,
`q_t[s] == q_tm1[s + 1]` and `a_t[s] == a_tm1[s + 1]` (the observation after
step `s` is the one step `s + 1` starts from, junctions included).

This module needs only NumPy; `offpolicy_ac.testing.strategies` draws the same
trajectories with hypothesis.
"""

from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

MID = 0
"""Step kind: a step inside an episode (discount gamma, mask True)."""
TERMINATION = 1
"""Step kind: an episode's LAST step at a terminal state (discount 0, mask True)."""
TRUNCATION = 2
"""Step kind: an episode's LAST step at a time limit (discount gamma, mask True)."""
JUNCTION = 3
"""Step kind: the auto-reset step after a LAST step (mask False; its values are garbage)."""


class Trajectory(NamedTuple):
  """Per-step arrays of a time-major batch; shapes `[T, *batch]` unless noted.

  Attributes:
    r_t: rewards r_s, float.
    discount_t: gamma times the environment discount, float (garbage where
      `mask` is False).
    mask: bool, False at the masked auto-reset (junction) steps.
    kind: int8 step kind, one of `MID`, `TERMINATION`, `TRUNCATION`, `JUNCTION`.
    v_tm1: state values V(x_s), float.
    v_t: state values V(x_{s+1}), float.
    q_tm1: action values Q(x_s, .), float `[T, *batch, A]`.
    q_t: action values Q(x_{s+1}, .), float `[T, *batch, A]`.
    a_tm1: actions a_s, int32 in `[0, A)`.
    a_t: actions a_{s+1}, int32 in `[0, A)`.
    pi_t: target-policy probabilities pi(.|x_{s+1}), float `[T, *batch, A]`.
    mu_t: behaviour probability mu(a_{s+1}|x_{s+1}), float in `(0, 1]`.
    log_rho_tm1: log importance ratio log pi(a_s|x_s) - log mu(a_s|x_s), float.
  """

  r_t: np.ndarray
  discount_t: np.ndarray
  mask: np.ndarray
  kind: np.ndarray
  v_tm1: np.ndarray
  v_t: np.ndarray
  q_tm1: np.ndarray
  q_t: np.ndarray
  a_tm1: np.ndarray
  a_t: np.ndarray
  pi_t: np.ndarray
  mu_t: np.ndarray
  log_rho_tm1: np.ndarray

  @property
  def batch_shape(self) -> tuple[int, ...]:
    """The batch axes `*batch` (everything after time)."""
    return tuple(np.shape(self.r_t)[1:])

  @property
  def num_actions(self) -> int:
    """The size A of the action axis."""
    return int(np.shape(self.q_t)[-1])


# Fields with a trailing action axis; the others are exactly [T, *batch].
ACTION_AXIS_FIELDS = ("q_tm1", "q_t", "pi_t")
# Integer action fields (values in [0, A)).
ACTION_FIELDS = ("a_tm1", "a_t")
# Fields describing the episode structure rather than the data.
LAYOUT_FIELDS = ("mask", "kind")


def _columns(shape):
  """Index tuples (slice over time, batch index...) of every column."""
  return [(slice(None),) + idx for idx in np.ndindex(*shape[1:])]


def _check_rng(rng, where: str) -> None:
  """Raises unless `rng` is a NumPy Generator (a seed failed on its first draw)."""
  if not isinstance(rng, np.random.Generator):
    raise TypeError(
        f"{where}: rng must be a NumPy Generator, e.g. np.random.default_rng(0), got "
        f"{type(rng).__name__} {rng!r:.40}"
    )


def random_layout(
    rng: np.random.Generator,
    t: int,
    batch_shape=(),
    *,
    p_termination: float = 0.15,
    p_truncation: float = 0.15,
    p_start_masked: float = 0.15,
    p_padding: float = 0.0,
    gamma=(0.5, 1.0),
    junction_discount: float | None = None,
):
  """Random episode structure for `[T, *batch]` sequences.

  Every LAST step (termination or truncation) that is not the window's last
  step is followed by one `JUNCTION` step; a column may also start with one
  (the window began right after a LAST step). A padded column is masked from
  its first LAST step to the window's end, as a sequence cut from a shorter
  episode is (`demos.cut_episodes` with `null_padding`): a run of masked steps.

  Args:
    rng: the NumPy generator.
    t: the number of steps T.
    batch_shape: the batch axes.
    p_termination: probability that a non-junction step terminates.
    p_truncation: probability that a non-junction step is truncated.
    p_start_masked: probability that a column starts with a junction step.
    p_padding: probability that a column is padded after its first LAST step.
    gamma: a float, or a `(low, high)` range to draw one gamma per column.
    junction_discount: the discount written at junction steps; None leaves
      gamma there.

  Returns:
    `(discount_t, mask, kind)`, each `[T, *batch]` (float64, bool, int8).
  """
  _check_rng(rng, "random_layout")
  if t < 1:
    raise ValueError(f"t must be >= 1, got {t}")
  if not 0.0 <= p_termination + p_truncation <= 1.0 or min(p_termination, p_truncation) < 0:
    raise ValueError(
        f"p_termination ({p_termination}) and p_truncation ({p_truncation}) must be"
        " non-negative and sum to at most 1"
    )
  if not 0.0 <= p_padding <= 1.0:
    raise ValueError(f"p_padding must be in [0, 1], got {p_padding}")
  gammas = gamma if isinstance(gamma, (tuple, list)) else (gamma,)
  if not all(0.0 <= g <= 1.0 for g in gammas):  # NaN too
    raise ValueError(f"gamma must be in [0, 1] (a float, or a (low, high) range), got {gamma}")
  shape = (t,) + tuple(batch_shape)
  discount = np.zeros(shape)
  mask = np.ones(shape, dtype=bool)
  kind = np.zeros(shape, dtype=np.int8)
  for col in _columns(shape):
    g = rng.uniform(*gamma) if isinstance(gamma, (tuple, list)) else float(gamma)
    after_last = rng.random() < p_start_masked
    # Drawn only when asked for, so that a seed's layouts without padding stay as they were.
    padded = p_padding > 0 and rng.random() < p_padding
    padding = False
    for s in range(t):
      idx = (s,) + col[1:]
      if after_last or padding:
        mask[idx], kind[idx] = False, JUNCTION
        discount[idx] = g if junction_discount is None else junction_discount
        after_last = False
        continue
      u = rng.random()
      if u < p_termination:
        kind[idx], discount[idx], after_last = TERMINATION, 0.0, True
      elif u < p_termination + p_truncation:
        kind[idx], discount[idx], after_last = TRUNCATION, g, True
      else:
        kind[idx], discount[idx] = MID, g
      padding = padded and after_last
  return discount, mask, kind


def check_layout(mask, kind) -> None:
  """Refuses a layout no auto-resetting environment (or padding) produces: a step kind
  outside MID, TERMINATION, TRUNCATION and JUNCTION; an unmasked JUNCTION; a LAST step
  (termination or truncation) followed by an unmasked step, where the next episode would
  start without its junction (a target could read it, and the checks, which cut on the
  mask, could not tell). Masked steps of any kind (padding) are allowed anywhere.

  Raises:
    ValueError: naming the first offending step.
  """
  mask, kind = np.asarray(mask), np.asarray(kind)
  if mask.shape != kind.shape or not kind.shape:
    raise ValueError(f"mask and kind must share one [T, *batch] shape, got {mask.shape} and "
                     f"{kind.shape}")  # fmt: skip
  for col in _columns(kind.shape):
    kinds, where = kind[col], lambda s, col=col: (s,) + col[1:]
    for s, k in enumerate(kinds.tolist()):
      real = bool(mask[where(s)])
      if k not in (MID, TERMINATION, TRUNCATION, JUNCTION):
        why = f"kind {k} is not MID, TERMINATION, TRUNCATION or JUNCTION"
      elif k == JUNCTION and real:
        why = "a JUNCTION is unmasked (mask True); it is the auto-reset step, never real"
      elif s and kinds[s - 1] in (TERMINATION, TRUNCATION) and real:
        why = "a LAST step is followed by a real step, not by the auto-reset JUNCTION"
      else:
        continue
      raise ValueError(f"step {where(s)} of the layout: {why}")


def layout_from_kinds(kind, gamma) -> tuple[np.ndarray, np.ndarray]:
  """`(discount_t, mask)` for an explicit `[T, *batch]` array of step kinds.

  `gamma` is a scalar or an array broadcastable to `kind`. Junction steps get
  discount gamma (overwrite it with garbage as you like).

  Raises:
    ValueError: a layout an environment cannot produce (`check_layout`).
  """
  kind = np.asarray(kind)
  check_layout(kind != JUNCTION, kind)
  gamma = np.broadcast_to(np.asarray(gamma, np.float64), kind.shape)
  discount = np.where(kind == TERMINATION, 0.0, gamma)
  return discount, kind != JUNCTION


def junction_layout(lengths, lead_masked: bool = False):
  """Episodes of the given lengths joined in time by one masked step each.

  Returns `(mask [T] bool, slices)`, where `slices[i]` indexes episode `i` in
  the concatenated time axis; the masked junction steps hold garbage.
  """
  mask, slices, t = [], [], 0
  if lead_masked:
    mask.append(False)
    t += 1
  for i, length in enumerate(lengths):
    if i > 0:
      mask.append(False)
      t += 1
    slices.append(slice(t, t + length))
    mask.extend([True] * length)
    t += length
  return np.asarray(mask, bool), slices


def garble(rng: np.random.Generator, x, mask, scale: float = 1e3):
  """Copy of `x` with the masked steps replaced by finite garbage in `[-scale, scale]`.

  `mask` is `[T, *batch]` and broadcasts over any trailing axes of `x`.
  """
  x = np.array(x, copy=True)
  m = np.asarray(mask)
  m = m.reshape(m.shape + (1,) * (x.ndim - m.ndim))
  garbage = rng.uniform(-scale, scale, size=x.shape).astype(x.dtype)
  return np.where(m, x, garbage)


def fill_masked(x, mask, value):
  """Copy of `x` with every masked step set to `value` (a scalar or an array like `x`).

  `mask` is `[T, *batch]` and broadcasts over any trailing axes of `x`.
  """
  x = np.array(x, copy=True)
  m = np.asarray(mask).reshape(np.shape(mask) + (1,) * (x.ndim - np.ndim(mask)))
  return np.where(m, x, np.asarray(value, dtype=x.dtype))


def _probabilities(rng, shape):
  p = rng.uniform(0.05, 1.0, size=shape)
  return p / p.sum(-1, keepdims=True)


def trajectory_from_layout(
    rng: np.random.Generator,
    discount_t,
    mask,
    kind,
    num_actions: int = 3,
    *,
    reward_scale: float = 1.0,
    value_scale: float = 2.0,
    garbage_scale: float = 1e3,
    dtype=np.float32,
) -> Trajectory:
  """Fills a layout from `random_layout` (or your own) with random data.

  Rewards, values and probabilities are drawn at random (values chained over
  time, see the module docstring). The policies agree, as a target computed from
  the log ratios and one computed from the probabilities need: where rows s and
  s + 1 are real, `log_rho_tm1[s + 1] == log pi_t[s][a_t[s]] - log mu_t[s]`.
  Junction steps get garbage rewards in
  `[-garbage_scale, garbage_scale]`, discounts in `[2, 10]`, behaviour
  probabilities in `(0, 1]` and log ratios in `[-5, 5]`.

  Raises:
    ValueError: `num_actions` < 1, shapes that differ, T = 0, a layout an environment
      cannot produce (`check_layout`), a real step's discount outside [0, 1] or a
      termination's other than 0 (the checks would blame a correct target for it), or a
      `dtype` that is not floating.
  """
  if num_actions < 1:
    raise ValueError(f"num_actions must be >= 1, got {num_actions}")
  if not jnp.issubdtype(dtype, jnp.floating):  # bfloat16 too
    raise ValueError(f"dtype must be a floating dtype, got {np.dtype(dtype)}")
  discount_t, mask, kind = np.asarray(discount_t), np.asarray(mask, bool), np.asarray(kind)
  shape = discount_t.shape
  if mask.shape != shape or kind.shape != shape or not shape:
    raise ValueError(f"discount_t, mask and kind must share one [T, *batch] shape, got {shape}")
  if shape[0] < 1:
    raise ValueError(f"a trajectory needs T >= 1 steps, got shape {shape}")
  check_layout(mask, kind)
  real = np.asarray(discount_t, np.float64)[mask]
  if not np.all((real >= 0) & (real <= 1)):  # NaN too
    bad = real[~((real >= 0) & (real <= 1))][0]
    raise ValueError(f"discount_t must be in [0, 1] at real (unmasked) steps, got {bad}")
  ends = mask & (kind == TERMINATION) & (discount_t != 0)
  if ends.any():
    where = tuple(int(i) for i in np.argwhere(ends)[0])
    raise ValueError(f"step {where} is a TERMINATION with discount_t {discount_t[where]}: a "
                     "termination's discount is 0")  # fmt: skip
  obs_shape = (shape[0] + 1,) + shape[1:]
  v_obs = rng.normal(size=obs_shape) * value_scale
  q_obs = rng.normal(size=obs_shape + (num_actions,)) * value_scale
  a_obs = rng.integers(0, num_actions, size=obs_shape).astype(np.int32)
  pi_obs = _probabilities(rng, obs_shape + (num_actions,))
  r_t = rng.normal(size=shape) * reward_scale
  mu_t = rng.uniform(0.05, 1.0, size=shape)  # mu(a_{s+1}|x_{s+1})
  # mu(a_0|x_0): row 0 of a [T, *batch] draw, so that every later draw, and with it the
  # layouts and data a seed gives (default_examples' among them), stays as it was.
  mu_0 = rng.uniform(0.05, 1.0, size=shape)[:1]
  pi_taken = np.take_along_axis(pi_obs, a_obs[..., None], axis=-1)[..., 0]  # pi(a_s|x_s)
  log_rho = np.log(pi_taken[:-1]) - np.log(np.concatenate([mu_0, mu_t[:-1]]))
  discount_t = np.where(mask, discount_t, rng.uniform(2.0, 10.0, size=shape))
  r_t = garble(rng, r_t, mask, garbage_scale)
  mu_t = np.where(mask, mu_t, rng.uniform(1e-3, 1.0, size=shape))
  log_rho = np.where(mask, log_rho, rng.uniform(-5.0, 5.0, size=shape))
  f = lambda x: np.asarray(x, dtype)  # noqa: E731
  return Trajectory(
      r_t=f(r_t),
      discount_t=f(discount_t),
      mask=mask,
      kind=kind.astype(np.int8),
      v_tm1=f(v_obs[:-1]),
      v_t=f(v_obs[1:]),
      q_tm1=f(q_obs[:-1]),
      q_t=f(q_obs[1:]),
      a_tm1=a_obs[:-1],
      a_t=a_obs[1:],
      pi_t=f(pi_obs[1:]),
      mu_t=f(mu_t),
      log_rho_tm1=f(log_rho),
  )


def random_trajectory(
    rng: np.random.Generator,
    t: int | None = None,
    batch_shape=None,
    num_actions: int | None = None,
    *,
    p_termination: float = 0.15,
    p_truncation: float = 0.15,
    p_start_masked: float = 0.15,
    p_padding: float = 0.0,
    gamma=(0.5, 1.0),
    dtype=np.float32,
) -> Trajectory:
  """A random `Trajectory` with terminations, truncations and junctions.

  Args:
    rng: the NumPy generator, e.g. `np.random.default_rng(0)`.
    t: the number of steps T; None draws one in `[1, 12]`.
    batch_shape: the batch axes; None draws `()`, `(B,)` or `(B1, B2)` with
      sizes in `[1, 3]`.
    num_actions: the action count A; None draws one in `[1, 4]`.
    p_termination, p_truncation, p_start_masked, p_padding, gamma: as in
      `random_layout`.
    dtype: the floating dtype of the arrays.

  Example:
    >>> import numpy as np
    >>> from offpolicy_ac.testing import random_trajectory
    >>> traj = random_trajectory(np.random.default_rng(0), 6, (2,), 3)
    >>> traj.q_t.shape, traj.mask.dtype
    ((6, 2, 3), dtype('bool'))
  """
  _check_rng(rng, "random_trajectory")
  if t is None:
    t = int(rng.integers(1, 13))
  if batch_shape is None:
    batch_shape = tuple(int(b) for b in rng.integers(1, 4, size=int(rng.integers(0, 3))))
  if num_actions is None:
    num_actions = int(rng.integers(1, 5))
  discount, mask, kind = random_layout(
      rng,
      t,
      batch_shape,
      p_termination=p_termination,
      p_truncation=p_truncation,
      p_start_masked=p_start_masked,
      p_padding=p_padding,
      gamma=gamma,
  )
  return trajectory_from_layout(rng, discount, mask, kind, num_actions, dtype=dtype)


def default_examples(seed: int = 0, num: int = 6) -> list[Trajectory]:
  """A few small random trajectories that together hold every step kind.

  The first examples cover batch shapes `()`, `(3,)` and `(2, 2)`; all of them
  have at least one termination, one truncation and one junction, and a column
  may end in masked padding (two of the second example's do), so a check run on
  them exercises every boundary. Used when a check gets no examples.
  """
  rng = np.random.default_rng(seed)
  shapes = [(), (3,), (2, 2)]
  out = []
  while len(out) < num:
    batch = shapes[len(out) % len(shapes)]
    traj = random_trajectory(
        rng,
        int(rng.integers(6, 11)),
        batch,
        3,
        p_termination=0.2,
        p_truncation=0.2,
        p_padding=0.2,
    )
    kinds = set(np.unique(traj.kind).tolist())
    if {TERMINATION, TRUNCATION, JUNCTION} <= kinds:
      out.append(traj)
  return out
