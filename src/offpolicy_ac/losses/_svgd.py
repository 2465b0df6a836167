"""Soft Q-learning for continuous actions: the importance-sampled soft value and SVGD.

See "Reinforcement Learning with Deep Energy-Based Policies" by Haarnoja et al.
(https://arxiv.org/abs/1702.08165), eq. 10 (the soft value estimated from sampled
actions) and eq. 13 (the Stein variational gradient that trains the sampler), and
"Stein Variational Gradient Descent" by Liu and Wang (https://arxiv.org/abs/1608.04471).
The shapes are particle-major: any leading axes, then particles, then action dimensions.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from offpolicy_ac.losses import _checks
from offpolicy_ac.losses._soft_q import soft_value

_FINITE_MAX = float(np.finfo(np.float64).max)  # the proposal's std: inf is refused

MIN_BANDWIDTH = 1e-3
"""Floor of the adaptive RBF bandwidth (the authors' h_min), so that coinciding particles
give kappa = 1 and a zero kernel gradient instead of 0 / 0."""


class RbfKernelOutput(NamedTuple):
  """kappa: k(x_k, y_m) [..., K, M]; grad_x: its gradient w.r.t. x_k [..., K, M, d]."""

  kappa: jax.Array
  grad_x: jax.Array


def importance_sampled_soft_value(q_samples: jax.Array, log_proposal, alpha) -> jax.Array:
  """Soft value V(s) = alpha log E_{a ~ q'}[exp(Q(s, a) / alpha) / q'(a)] from M samples.

      V(s) ~= alpha * (logsumexp_j(Q(s, a_j) / alpha - log q'(a_j)) - log M)

  (Haarnoja et al. 2017, eq. 10). With a uniform proposal on a box of volume |A| the
  estimate of a constant Q is Q + alpha log |A|; as alpha -> 0 it tends to max_j Q(s, a_j).
  Stable for any finite input (the maximum is subtracted inside the logsumexp).

  Args:
    q_samples: Q(s, a_j) for M actions a_j ~ q' [..., M].
    log_proposal: log q'(a_j), broadcastable to q_samples (e.g. a scalar -d log 2 for
      actions uniform in [-1, 1]^d).
    alpha: temperature > 0 and finite, a scalar or an array of q_samples.shape[:-1]'s rank
      that broadcasts to it.

  Returns:
    soft values [...] (q_samples.shape[:-1]).
  """
  _checks.check_floating("q_samples", q_samples)
  _checks.check_min_rank("q_samples", q_samples, 1, "a trailing sample axis [..., M]")
  _checks.check_nonempty("q_samples", q_samples, -1, "samples")
  _checks.check_floating("log_proposal", log_proposal)
  _check_broadcasts_to("log_proposal", log_proposal, jnp.shape(q_samples), "`q_samples`")
  dtype, shape = jnp.result_type(q_samples), jnp.shape(q_samples)
  _checks.check_positive("alpha", alpha, shape[:-1], finite=True, dtype=dtype)
  # alpha log E[exp(Q / alpha) / q'] = soft_value(Q - alpha log q') - alpha log M.
  alpha = jnp.asarray(alpha, dtype)
  if alpha.ndim:  # explicit broadcasts: the library runs under rank-promotion "raise"
    alpha = jnp.broadcast_to(alpha, shape[:-1])
  log_proposal = jnp.broadcast_to(jnp.asarray(log_proposal, dtype), shape)
  per_sample = alpha if alpha.ndim == 0 else alpha[..., None]
  log_m = math.log(jnp.shape(q_samples)[-1])
  return soft_value(q_samples - per_sample * log_proposal, alpha) - alpha * log_m


def box_mixture_log_density(
    actions: jax.Array, center: jax.Array, std, uniform_fraction
) -> jax.Array:
  """log q'(a) of a proposal on the box [-1, 1]^d: a mixture of the uniform density and a
  normal of `std` around `center`, truncated to the box independently per dimension.

      q'(a) = f U(a) + (1 - f) prod_i TN(a_i; center_i, std, -1, 1),   U(a) = 2^-d

  With M_u = f M of the M samples uniform and the others from the truncated normal, the
  soft value of `importance_sampled_soft_value` with this log q' is the balance
  heuristic's multiple importance sampling estimate (Veach and Guibas 1995): unbiased in
  E[exp(Q / alpha)] like the uniform proposal of Haarnoja et al. 2017 (eq. 10), and of far
  lower variance when exp(Q / alpha) is peaked near `center` (a sampler's action).

  Args:
    actions: [..., M, d] in [-1, 1]^d (ValueError otherwise, for concrete values).
    center: [..., d] in [-1, 1]^d, the truncated normal's centre (the same leading axes).
    std: > 0 and finite, a scalar (traced too: a swept or learned width).
    uniform_fraction: f in [0, 1], a Python float (static: a traced value is refused with
      a TypeError; pass it to `jax.jit` as a static argument, or close over it).

  Returns:
    log q'(a_j) [..., M].
  """
  _checks.check_floating("actions", actions)
  _checks.check_min_rank("actions", actions, 2, "particles and action dimensions [..., M, d]")
  _checks.check_floating("center", center)
  shape = jnp.shape(actions)
  _checks.check_shape("center", center, shape[:-2] + shape[-1:], "`actions` less its M axis")
  _checks.check_entries("actions", actions, -1.0, 1.0, " (the box)")
  _checks.check_entries("center", center, -1.0, 1.0, " (the box)")
  _check_scalar_std(std)
  _checks.check_entries("std", std, 0.0, _FINITE_MAX, bounds="> 0 and finite")
  _checks.check_static("uniform_fraction", uniform_fraction, "float")  # branched on below
  _checks.check_in_unit_interval("uniform_fraction", uniform_fraction)
  d = shape[-1]
  dtype = jnp.result_type(actions, center)
  # Half precision is evaluated in float32 (jax.scipy's normal CDF refuses bfloat16).
  acc = jnp.promote_types(dtype, jnp.float32)
  _checks.check_positive("std", std, finite=True, dtype=acc)
  actions, mu = jnp.asarray(actions, acc), jnp.asarray(center, acc)[..., None, :]
  # The normal's mass in the box, Phi((1 - mu) / std) - Phi((-1 - mu) / std), as a sum of
  # two erfs of non-negative arguments (mu in [-1, 1]): no cancellation, so a std far wider
  # than the box keeps its mass (about 2 / (std sqrt(2 pi))), where the CDFs' difference
  # rounds to 0 (std 1e8: log q' was +inf and the soft values NaN).
  scale = std * math.sqrt(2.0)
  mass = 0.5 * (
      jax.scipy.special.erf((1.0 - mu) / scale) + jax.scipy.special.erf((1.0 + mu) / scale)
  )
  per_dim = jax.scipy.stats.norm.logpdf((actions - mu) / std) - jnp.log(std)
  log_normal = jnp.sum(per_dim - jnp.log(mass), axis=-1)
  log_uniform = -d * math.log(2.0)
  if uniform_fraction == 0.0:
    return log_normal.astype(dtype)
  if uniform_fraction == 1.0:
    return jnp.full(shape[:-1], log_uniform, dtype)
  return jnp.logaddexp(
      math.log(uniform_fraction) + log_uniform, math.log1p(-uniform_fraction) + log_normal
  ).astype(dtype)


def _check_scalar_std(std) -> None:
  if jnp.ndim(std):
    raise ValueError(f"`std` must be a scalar (one width for every action dimension), got "
                     f"shape {tuple(jnp.shape(std))}")  # fmt: skip


def sample_box_mixture(
    key: jax.Array, center: jax.Array, std, num_uniform: int, num_normal: int
) -> jax.Array:
  """[..., num_uniform + num_normal, d] actions: the first uniform in [-1, 1]^d, the
  others from the normal of `std` (a scalar) around `center` [..., d] (in the box: ValueError
  otherwise, for concrete values) truncated to the box (see `box_mixture_log_density`,
  with f = num_uniform / (num_uniform + num_normal))."""
  _checks.check_floating("center", center)
  _checks.check_min_rank("center", center, 1, "action dimensions [..., d]")
  _checks.check_entries("center", center, -1.0, 1.0, " (the box)")
  _check_scalar_std(std)  # (an array spread over the samples, not the batch)
  _checks.check_entries("std", std, 0.0, _FINITE_MAX, bounds="> 0 and finite")
  _checks.check_positive("std", std, finite=True, dtype=jnp.result_type(center))
  num_uniform = _checks.static_int("num_uniform", num_uniform, 0)
  num_normal = _checks.static_int("num_normal", num_normal, 0)
  std = jnp.asarray(std, center.dtype)  # a NumPy float64 leaves float32 actions float32
  uniform_key, normal_key = jax.random.split(key)
  lead, d = jnp.shape(center)[:-1], jnp.shape(center)[-1]
  uniform = jax.random.uniform(uniform_key, lead + (num_uniform, d), center.dtype, -1.0, 1.0)
  mu = center[..., None, :]
  z = jax.random.truncated_normal(
      normal_key, (-1.0 - mu) / std, (1.0 - mu) / std, lead + (num_normal, d), center.dtype
  )
  normal = jnp.clip(mu + std * z, -1.0, 1.0)
  return jnp.concatenate([uniform, normal], axis=-2)


def rbf_kernel(x: jax.Array, y: jax.Array, bandwidth=None) -> RbfKernelOutput:
  """RBF kernel k(x, y) = exp(-||x - y||^2 / h) between two sets of particles.

  With `bandwidth=None`, h = median_{k,m} ||x_k - y_m||^2 / log(K + 1), at least
  `MIN_BANDWIDTH`, treated as a constant (stop_gradient): the adaptive bandwidth of Liu
  and Wang and of Haarnoja et al.'s code (which divides by log K; K + 1 keeps K = 1
  defined). For an even number of pairs the median is the mean of the two middle values.

  Args:
    x: particles [..., K, d].
    y: particles [..., M, d] (the same leading axes and d).
    bandwidth: None (adaptive) or h > 0, a scalar or an array of x.shape[:-2]'s rank that
      broadcasts to it.

  Returns:
    `RbfKernelOutput(kappa [..., K, M], grad_x [..., K, M, d])`, grad_x the gradient of
    kappa[..., k, m] w.r.t. x[..., k, :], -2 (x_k - y_m) / h * kappa.
  """
  _check_particles("x", x, "y", y)
  diff = x[..., :, None, :] - y[..., None, :, :]
  sq_dist = jnp.sum(jnp.square(diff), axis=-1)
  if bandwidth is None:
    pairs = sq_dist.reshape(sq_dist.shape[:-2] + (math.prod(sq_dist.shape[-2:]),))
    h = jnp.median(pairs, axis=-1) / math.log(jnp.shape(x)[-2] + 1)
    h = jax.lax.stop_gradient(jnp.maximum(h, MIN_BANDWIDTH))
  else:
    _checks.check_positive("bandwidth", bandwidth, jnp.shape(x)[:-2], dtype=sq_dist.dtype)
    h = jnp.broadcast_to(jnp.asarray(bandwidth, sq_dist.dtype), jnp.shape(x)[:-2])
  h = h[..., None, None]
  kappa = jnp.exp(-sq_dist / h)
  return RbfKernelOutput(kappa, -2.0 * diff / h[..., None] * kappa[..., None])


def svgd_direction(
    fixed_actions: jax.Array, grad_log_p: jax.Array, updated_actions: jax.Array, bandwidth=None
) -> jax.Array:
  """The Stein variational gradient at the updated particles (Haarnoja et al. 2017, eq. 13).

      phi(a_j) = mean_k [k(a_k, a_j) grad log p(a_k) + grad_{a_k} k(a_k, a_j)]

  over the fixed particles a_k, with the RBF kernel of `rbf_kernel`. Moving a_j along phi
  decreases KL(particles || p) fastest in the kernel's function space. In soft Q-learning
  p(a) is exp(Q(s, a) / alpha); for actions squashed by tanh the authors add the correction
  sum_i log(1 - a_i^2 + eps) to log p. The sampler's parameters follow phi through the
  surrogate loss -mean(stop_gradient(phi) * updated_actions).

  Args:
    fixed_actions: particles a_k [..., K, d].
    grad_log_p: grad_a log p(a_k) [..., K, d].
    updated_actions: particles a_j [..., M, d] (the same leading axes and d).
    bandwidth: as in `rbf_kernel`.

  Returns:
    phi(a_j) [..., M, d].
  """
  _check_particles("fixed_actions", fixed_actions, "updated_actions", updated_actions)
  _checks.check_floating("grad_log_p", grad_log_p)
  _checks.check_shape("grad_log_p", grad_log_p, jnp.shape(fixed_actions), "`fixed_actions`")
  kernel = rbf_kernel(fixed_actions, updated_actions, bandwidth)
  driving = jnp.einsum("...km,...kd->...md", kernel.kappa, grad_log_p)
  repulsive = jnp.sum(kernel.grad_x, axis=-3)
  return (driving + repulsive) / jnp.shape(fixed_actions)[-2]


def _check_particles(x_name: str, x, y_name: str, y) -> None:
  for name, v in ((x_name, x), (y_name, y)):
    _checks.check_floating(name, v)
    _checks.check_min_rank(name, v, 2, "particles and action dimensions [..., K, d]")
    _checks.check_nonempty(name, v, -2, "particles")
  x_shape, y_shape = jnp.shape(x), jnp.shape(y)
  if x_shape[:-2] != y_shape[:-2] or x_shape[-1] != y_shape[-1]:
    raise ValueError(
        f"`{y_name}` must have the leading axes and last axis of `{x_name}` "
        f"{x_shape[:-2]} + (M, {x_shape[-1]}), got shape {y_shape}."
    )


def _check_broadcasts_to(name: str, x, shape: tuple[int, ...], ref: str) -> None:
  try:
    out = jnp.broadcast_shapes(jnp.shape(x), tuple(shape))
  except ValueError:
    out = None
  if out != tuple(shape):
    raise ValueError(
        f"`{name}` must broadcast to shape {tuple(shape)} (matching {ref}), got shape "
        f"{jnp.shape(x)}."
    )
