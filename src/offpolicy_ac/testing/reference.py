"""Float64 NumPy loop references for every target and loss the library computes.

Each function is written from its paper's recursion (or the explicit sum, where
that is a different form from the library's), as plain Python loops over time
and over the flattened batch columns, independently of `offpolicy_ac.losses`.
They are slow and exact: use them as the `reference` of
`offpolicy_ac.testing.assert_matches_reference` on small inputs.

Shapes are time-major, `[T, *batch]` (`[T, *batch, A]` for action values and
probabilities); results are float64 NumPy arrays.

Mask semantics: `mask[s]` False marks a step that is not a real transition (the
auto-reset junction after a LAST step). It gets zero outputs and cuts the
trace: the segment of a real step `s` runs from `s` to the last index `e >= s`
such that `mask[s..e]` are all True, and the bootstrap at `e` is `v_t[e]`
(or `q_t[e]`).

References:
  Espeholt et al. 2018, IMPALA (V-trace): https://arxiv.org/abs/1802.01561
  Munos et al. 2016, Retrace: https://arxiv.org/abs/1606.02647
  Harutyunyan et al. 2016, Q(lambda) with off-policy corrections:
    https://arxiv.org/abs/1602.04951
  Wang et al. 2017, ACER: https://arxiv.org/abs/1611.01224
  Haarnoja et al. 2017, soft Q-learning: https://arxiv.org/abs/1702.08165
  Reddy et al. 2020, SQIL: https://arxiv.org/abs/1905.11108
  Liu and Wang 2016, Stein variational gradient descent: https://arxiv.org/abs/1608.04471
"""

import math

import numpy as np

# Validation: the references refuse what `offpolicy_ac.losses` refuses (concrete values),
# with the same messages, so that a reference never silently computes what the library
# would not.


def _shown(x):
  """A refused value as `offpolicy_ac.losses` shows it (None as None, not as NaN)."""
  if x is None:
    return None
  v = np.asarray(x, np.float64)
  return v if v.ndim == 0 else v.tolist()


def _values(name, x):
  """`x` as float64 (None as NaN, refused by every check), refusing a str."""
  if isinstance(x, (str, bytes)):
    raise ValueError(f"`{name}` must be a number or an array of numbers, got {x!r}.")
  return np.asarray(np.nan if x is None else x, np.float64)


def _check_unit_interval(name, x):
  v = _values(name, x)
  if not np.all((v >= 0) & (v <= 1)):
    raise ValueError(f"`{name}` must lie in [0, 1], got {_shown(x)}.")


def _check_positive(name, x, finite=False):
  v = _values(name, x)
  ok = (v > 0) & np.isfinite(v) if finite else v > 0
  if not np.all(ok):
    bound = "> 0 and finite" if finite else "> 0"
    raise ValueError(f"`{name}` must be {bound}, got {_shown(x)}.")


def _check_non_negative(name, x):
  v = _values(name, x)
  if not np.all(v >= 0):
    raise ValueError(f"`{name}` must be >= 0, got {_shown(x)}.")


def _check_count(name, value, minimum=1):
  """`value` as an int >= `minimum` (a NumPy integer too; not a bool or a float)."""
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
    raise ValueError(f"`{name}` must be an int >= {minimum}, got {value!r}.")
  return int(value)


def _check_discounts(discount_t, mask=None):
  """`discount_t` in [0, 1] at the real steps (`mask`; a masked step's is never used)."""
  v = np.asarray(discount_t, np.float64)
  bad = ~((v >= 0) & (v <= 1))
  if mask is not None:
    bad &= np.broadcast_to(np.asarray(mask, bool), v.shape)
  if np.any(bad):
    where = tuple(int(i) for i in np.argwhere(bad)[0])
    raise ValueError(
        f"`discount_t` must be in [0, 1] (gamma times the environment's discount), got "
        f"{v[where].item()} at index {where}; {int(np.sum(bad))} of {v.size} entries are not."
    )


# Soft-Q / SQL / SQIL, the distribution helpers, the IMPALA loss and ACER.


def _sq_cols(x, trailing=0, dtype=np.float64):
  """[T, *batch, *trailing] -> ([T, N, *trailing] copy, batch_shape)."""
  x = np.asarray(x)
  if dtype is not None:
    x = x.astype(dtype)
  t = x.shape[0]
  batch = x.shape[1 : x.ndim - trailing]
  tail = x.shape[x.ndim - trailing :]
  return x.reshape((t, -1) + tail), batch


def _sq_uncols(x, batch):
  return x.reshape((x.shape[0],) + tuple(batch) + x.shape[2:])


# ----------------------------------------------------------------------------
# Soft values and soft-Q targets.
# ----------------------------------------------------------------------------


def logsumexp(x, axis=-1):
  """log sum exp(x) over `axis`, float64, stable for -inf entries."""
  x = np.asarray(x, np.float64)
  m = np.max(x, axis=axis, keepdims=True)
  m = np.where(np.isfinite(m), m, 0.0)
  with np.errstate(divide="ignore"):
    out = np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True)) + m
  return np.squeeze(out, axis=axis)


def softmax(x, axis=-1):
  """exp(x) / sum exp(x) over `axis`, float64."""
  x = np.asarray(x, np.float64)
  m = np.max(x, axis=axis, keepdims=True)
  e = np.exp(x - m)
  return e / np.sum(e, axis=axis, keepdims=True)


def soft_value(q, alpha):
  """Soft value alpha * log sum_a exp(q_a / alpha) (Haarnoja et al. 2017, eq. 9).

  q: [..., A]; alpha: a positive scalar. Returns [...], float64.
  """
  _check_positive("alpha", alpha, finite=True)
  q = np.asarray(q, np.float64)
  flat = q.reshape(-1, q.shape[-1])
  out = np.empty(flat.shape[0])
  for i, row in enumerate(flat):
    z = row / alpha
    m = np.max(z)
    out[i] = alpha * (m + np.log(np.sum(np.exp(z - m))))
  return out.reshape(q.shape[:-1])


def soft_q_targets(r_t, discount_t, q_t, alpha, lambda_=0.0, mask=None):
  """Soft lambda-returns (soft Q-learning targets); alpha=None uses the hard max.

      G_s = r_s + d_s ((1 - l_s) V(q_t[s]) + l_s G_{s+1}),
      l_s = lambda if s + 1 < T and mask[s + 1] else 0;  G_s = 0 if not mask[s],

  with V the soft value `soft_value(q_t[s], alpha)` (Haarnoja et al. 2017), or
  max_a q_t[s] when alpha is None (Peng's Q(lambda) targets).

  Args: r_t, discount_t, mask [T, *batch]; q_t [T, *batch, A] = Q(x_{s+1}, .).
  Returns [T, *batch] float64.
  """
  if alpha is not None:
    _check_positive("alpha", alpha, finite=True)
  _check_unit_interval("lambda_", lambda_)
  _check_discounts(discount_t, mask)
  r, batch = _sq_cols(r_t)
  d, _ = _sq_cols(discount_t)
  q, _ = _sq_cols(q_t, trailing=1)
  m = np.ones(r.shape, bool) if mask is None else _sq_cols(mask, dtype=bool)[0]
  t, n = r.shape
  g = np.zeros((t, n))
  for j in range(n):
    for s in reversed(range(t)):
      if not m[s, j]:
        continue
      v = np.max(q[s, j]) if alpha is None else soft_value(q[s, j], alpha)
      lam = lambda_ if (s + 1 < t and m[s + 1, j]) else 0.0
      nxt = g[s + 1, j] if lam else 0.0
      g[s, j] = r[s, j] + d[s, j] * ((1.0 - lam) * v + lam * nxt)
  return _sq_uncols(g, batch)


def soft_nstep_targets(r_t, discount_t, q_t, alpha, n, mask=None):
  """n-step soft returns, truncated at the window's end and before masked steps.

      G_s = sum_{k=s}^{e} (prod_{i=s}^{k-1} d_i) r_k + (prod_{i=s}^{e} d_i) V(q_t[e]),

  e = min(s + n - 1, the last step of s's segment), V the soft value; 0 at masked
  steps. Shapes as in `soft_q_targets`.
  """
  n = _check_count("n", n)
  _check_positive("alpha", alpha, finite=True)
  _check_discounts(discount_t, mask)
  r, batch = _sq_cols(r_t)
  d, _ = _sq_cols(discount_t)
  q, _ = _sq_cols(q_t, trailing=1)
  m = np.ones(r.shape, bool) if mask is None else _sq_cols(mask, dtype=bool)[0]
  t, cols = r.shape
  g = np.zeros((t, cols))
  for j in range(cols):
    for s in range(t):
      if not m[s, j]:
        continue
      total, disc, k = 0.0, 1.0, s
      for used in range(1, n + 1):
        total += disc * r[k, j]
        disc *= d[k, j]
        if used == n or k + 1 >= t or not m[k + 1, j]:
          total += disc * soft_value(q[k, j], alpha)
          break
        k += 1
      g[s, j] = total
  return _sq_uncols(g, batch)


def importance_sampled_soft_value(q_samples, log_proposal, alpha):
  """alpha * log((1/M) sum_j exp(q_j / alpha) / q'(a_j)) (Haarnoja et al. 2017, eq. 10).

  q_samples: [..., M]; log_proposal: broadcastable to it; alpha: a positive scalar or
  broadcastable to [...]. Returns [...], float64.
  """
  _check_positive("alpha", alpha, finite=True)
  q = np.asarray(q_samples, np.float64)
  log_p = np.broadcast_to(np.asarray(log_proposal, np.float64), q.shape)
  alphas = np.broadcast_to(np.asarray(alpha, np.float64), q.shape[:-1])
  out = np.empty(q.shape[:-1])
  for idx in np.ndindex(*q.shape[:-1]):
    z = q[idx] / alphas[idx] - log_p[idx]
    m = np.max(z)
    out[idx] = alphas[idx] * (m + np.log(np.mean(np.exp(z - m))))
  return out


def box_mixture_log_density(actions, center, std, uniform_fraction):
  """log(f 2^-d + (1 - f) prod_i TN(a_i; center_i, std, -1, 1)) per sample.

  actions: [..., M, d]; center: [..., d]. Float64 loops with math.erf, summed in log space
  (a narrow normal's density far from its centre underflows); returns [..., M].
  """
  _check_unit_interval("uniform_fraction", uniform_fraction)
  a = np.asarray(actions, np.float64)
  c = np.asarray(center, np.float64)
  lead, (m, d) = a.shape[:-2], a.shape[-2:]
  cdf = lambda z: 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))  # noqa: E731
  out = np.empty(lead + (m,))
  for idx in np.ndindex(*lead):
    for j in range(m):
      log_normal = 0.0
      for i in range(d):
        mu, x = c[idx][i], a[idx][j, i]
        mass = cdf((1.0 - mu) / std) - cdf((-1.0 - mu) / std)
        z = (x - mu) / std
        log_normal += -0.5 * z * z - math.log(math.sqrt(2.0 * math.pi) * std * mass)
      terms = []
      if uniform_fraction > 0.0:
        terms.append(math.log(uniform_fraction) - d * math.log(2.0))
      if uniform_fraction < 1.0:
        terms.append(math.log(1.0 - uniform_fraction) + log_normal)
      out[idx + (j,)] = np.logaddexp.reduce(terms)
  return out


def rbf_kernel(x, y, bandwidth=None, min_bandwidth=1e-3):
  """(kappa [..., K, M], grad_x [..., K, M, d]) of exp(-|x_k - y_m|^2 / h).

  bandwidth None: h = max(median of the K * M squared distances / log(K + 1),
  min_bandwidth). Float64 loops over the leading axes and the pairs.
  """
  if bandwidth is not None:
    _check_positive("bandwidth", bandwidth)
  x = np.asarray(x, np.float64)
  y = np.asarray(y, np.float64)
  lead, (k, d), m = x.shape[:-2], x.shape[-2:], y.shape[-2]
  hs = None if bandwidth is None else np.broadcast_to(np.asarray(bandwidth, np.float64), lead)
  kappa = np.empty(lead + (k, m))
  grad = np.empty(lead + (k, m, d))
  for idx in np.ndindex(*lead):
    sq = np.array([[np.sum((x[idx][i] - y[idx][j]) ** 2) for j in range(m)] for i in range(k)])
    h = max(np.median(sq) / np.log(k + 1), min_bandwidth) if hs is None else hs[idx]
    for i in range(k):
      for j in range(m):
        kappa[idx + (i, j)] = np.exp(-sq[i, j] / h)
        grad[idx + (i, j)] = -2.0 * (x[idx][i] - y[idx][j]) / h * kappa[idx + (i, j)]
  return kappa, grad


def svgd_direction(fixed_actions, grad_log_p, updated_actions, bandwidth=None):
  """phi(a_j) = (1/K) sum_k [k(a_k, a_j) grad log p(a_k) + grad_{a_k} k(a_k, a_j)]
  (Haarnoja et al. 2017, eq. 13), [..., M, d], float64 loops."""
  fixed = np.asarray(fixed_actions, np.float64)
  g = np.asarray(grad_log_p, np.float64)
  updated = np.asarray(updated_actions, np.float64)
  kappa, grad = rbf_kernel(fixed, updated, bandwidth)
  k, m = kappa.shape[-2:]
  phi = np.zeros(updated.shape)
  for idx in np.ndindex(*fixed.shape[:-2]):
    for j in range(m):
      for i in range(k):
        phi[idx][j] += (kappa[idx + (i, j)] * g[idx][i] + grad[idx + (i, j)]) / k
  return phi


# ----------------------------------------------------------------------------
# Distributions.
# ----------------------------------------------------------------------------


def log_softmax(x):
  """x - logsumexp(x) over the last axis, float64."""
  x = np.asarray(x, np.float64)
  return x - logsumexp(x)[..., None]


def categorical_entropy(logits):
  """-sum_a p_a log p_a of softmax(logits) over the last axis (0 log 0 = 0)."""
  log_p = log_softmax(logits)
  p = np.exp(log_p)
  with np.errstate(invalid="ignore"):
    terms = np.where(p > 0, p * log_p, 0.0)
  return -np.sum(terms, axis=-1)


def categorical_kl(p_logits, q_logits):
  """KL(softmax(p_logits) || softmax(q_logits)) over the last axis."""
  log_p, log_q = log_softmax(p_logits), log_softmax(q_logits)
  p = np.exp(log_p)
  with np.errstate(invalid="ignore"):
    terms = np.where(p > 0, p * (log_p - log_q), 0.0)
  return np.sum(terms, axis=-1)


def gaussian_kl(mean_p, log_std_p, mean_q, log_std_q):
  """Closed-form KL(N(mp, sp^2) || N(mq, sq^2)), summed over the last axis."""
  mp, lsp, mq, lsq = (np.asarray(x, np.float64) for x in (mean_p, log_std_p, mean_q, log_std_q))
  sp2, sq2 = np.exp(2 * lsp), np.exp(2 * lsq)
  return np.sum(lsq - lsp + (sp2 + (mp - mq) ** 2) / (2 * sq2) - 0.5, -1)


# ----------------------------------------------------------------------------
# V-trace (as used by the IMPALA loss) and the IMPALA loss.
# ----------------------------------------------------------------------------


def _vtrace_recursion(
    v_tm1,
    v_t,
    r_t,
    discount_t,
    rho_tm1,
    mask=None,
    lambda_=1.0,
    clip_rho=1.0,
    clip_c=1.0,
    clip_pg=1.0,
):
  """Returns (errors, pg_advantage, q_estimate), each [T, ...].

  err_s = rho_v (r + d v_t - v_tm1) + d c err_{s+1}   (no trace into a masked
  next step); q_s = r + d (vs_{s+1} if the next step exists and is real else
  v_t); pg_s = min(clip_pg, rho) (q_s - v_tm1). Zero at masked steps.
  """
  _check_discounts(discount_t, mask)
  _check_unit_interval("lambda_", lambda_)
  for name, x in (("clip_rho", clip_rho), ("clip_c", clip_c), ("clip_pg", clip_pg)):
    _check_positive(name, x)
  vt1, batch = _sq_cols(v_tm1)
  vt = _sq_cols(v_t)[0]
  r = _sq_cols(r_t)[0]
  d = _sq_cols(discount_t)[0]
  rho = _sq_cols(rho_tm1)[0]
  m = np.ones(r.shape, bool) if mask is None else _sq_cols(mask, dtype=bool)[0]
  t, n = r.shape
  err = np.zeros((t, n))
  pg = np.zeros((t, n))
  qe = np.zeros((t, n))
  for j in range(n):
    for s in reversed(range(t)):
      if not m[s, j]:
        continue
      rho_v = min(clip_rho, rho[s, j])
      c = lambda_ * min(clip_c, rho[s, j])
      delta = rho_v * (r[s, j] + d[s, j] * vt[s, j] - vt1[s, j])
      nxt_ok = s + 1 < t and m[s + 1, j]
      err[s, j] = delta + (d[s, j] * c * err[s + 1, j] if nxt_ok else 0.0)
    for s in range(t):
      if not m[s, j]:
        continue
      nxt_ok = s + 1 < t and m[s + 1, j]
      boot = vt1[s + 1, j] + err[s + 1, j] if nxt_ok else vt[s, j]
      qe[s, j] = r[s, j] + d[s, j] * boot
      pg[s, j] = min(clip_pg, rho[s, j]) * (qe[s, j] - vt1[s, j])
  return tuple(_sq_uncols(x, batch) for x in (err, pg, qe))


def impala_loss(
    v_tm1,
    v_t,
    r_t,
    discount_t,
    log_pi_tm1,
    log_mu_tm1,
    entropy_tm1,
    mask=None,
    weights=None,
    value_weight=0.5,
    entropy_weight=0.01,
    lambda_=1.0,
    clip_rho=1.0,
    clip_c=1.0,
    clip_pg=1.0,
    surrogate_clip=None,
):
  """The IMPALA loss terms and their gradients (Espeholt et al. 2018), as a dict.

  Per-step arguments are [T, *batch] (log_pi_tm1 / log_mu_tm1: log-probabilities
  of a_s under the learner and the behaviour policy; entropy_tm1 the learner's
  entropy at x_s). The terms are weighted means over real steps (weights default
  to 1): policy_loss = mean(-pg_advantage log pi), value_loss = mean(errors^2),
  entropy = mean(entropy); loss = policy_loss + value_weight value_loss -
  entropy_weight entropy. Also returns mean_rho, clipped_rho_fraction, the
  per-step V-trace outputs (pg_advantage, vtrace_errors, q_estimate), and the
  gradients grad_log_pi, grad_v_tm1, grad_entropy, all float64.

  With `surrogate_clip` = epsilon the policy term is instead mean(-min(rho A, clip(rho,
  1 - epsilon, 1 + epsilon) A)) with A = q_estimate - v_tm1 (PPO's clipped surrogate).
  """
  _check_non_negative("value_weight", value_weight)
  _check_non_negative("entropy_weight", entropy_weight)
  log_pi = np.asarray(log_pi_tm1, np.float64)
  log_mu = np.asarray(log_mu_tm1, np.float64)
  ent = np.asarray(entropy_tm1, np.float64)
  shape = log_pi.shape
  rho = np.exp(log_pi - log_mu)
  err, pg, qe = _vtrace_recursion(
      v_tm1, v_t, r_t, discount_t, rho, mask, lambda_, clip_rho, clip_c, clip_pg
  )
  m = np.ones(shape, bool) if mask is None else np.asarray(mask, bool)
  w = np.ones(shape) if weights is None else np.asarray(weights, np.float64)
  w = np.where(m, w, 0.0)
  # Loops, to keep the reference free of the library's masking tricks.
  adv = qe - np.asarray(v_tm1, np.float64)
  wf, pgf, lpf, errf, entf, rhof, advf = (
      x.reshape(-1) for x in (w, pg, log_pi, err, ent, rho, adv)
  )
  total = 0.0
  pol = val = en = mrho = clipped = 0.0
  d_log_pi = np.zeros(wf.size)  # d (sum_s w_s policy term_s) / d log pi_s
  for i in range(wf.size):
    if wf[i] == 0:
      continue
    total += wf[i]
    if surrogate_clip is None:
      pol += wf[i] * -pgf[i] * lpf[i]
      d_log_pi[i] = -wf[i] * pgf[i]
    else:
      low, high = 1.0 - surrogate_clip, 1.0 + surrogate_clip
      unclipped = rhof[i] * advf[i]
      bounded = min(max(rhof[i], low), high) * advf[i]
      pol += wf[i] * -min(unclipped, bounded)
      # d(rho A)/d log pi = rho A; the clipped branch is flat outside the range.
      if unclipped <= bounded or low <= rhof[i] <= high:
        d_log_pi[i] = -wf[i] * unclipped
    val += wf[i] * errf[i] ** 2
    en += wf[i] * entf[i]
    mrho += wf[i] * rhof[i]
    clipped += wf[i] * float(rhof[i] > clip_rho * (1 + 1e-5))  # losses.CLIP_RTOL
  denom = total if total > 0 else 1.0
  out = dict(
      policy_loss=pol / denom,
      value_loss=val / denom,
      entropy=en / denom,
      mean_rho=mrho / denom,
      clipped_rho_fraction=clipped / denom,
      pg_advantage=pg,
      vtrace_errors=err,
      q_estimate=qe,
  )
  out["loss"] = (
      out["policy_loss"] + value_weight * out["value_loss"] - entropy_weight * out["entropy"]
  )
  out["grad_log_pi"] = d_log_pi.reshape(shape) / denom
  out["grad_v_tm1"] = -2.0 * value_weight * w * err / denom
  out["grad_entropy"] = -entropy_weight * w / denom
  return out


# ----------------------------------------------------------------------------
# ACER.
# ----------------------------------------------------------------------------


def acer_returns(q_a_t, v_t, r_t, discount_t, c_t, mask=None):
  """ACER's Algorithm 2/3 recursion over [T, ...] arrays.

      Q^ret <- V(x_T)                           (the bootstrap at the end)
      for s = T-1 .. 0:
        Q^ret <- r_s + gamma_s Q^ret            (the target of step s)
        Q^ret <- c_s (Q^ret - Q(x_s, a_s)) + V(x_s)

  where (x_s, a_s) for the second line is read from index s-1 of the `_t`
  arrays (q_a_t[s-1] = Q(x_s, a_s), v_t[s-1] = V(x_s), c_t[s-1] = c_s). A
  masked step s has target 0 and restarts the carry at V(x_s) = v_t[s-1].
  """
  _check_discounts(discount_t, mask)
  qa, batch = _sq_cols(q_a_t)
  v = _sq_cols(v_t)[0]
  r = _sq_cols(r_t)[0]
  d = _sq_cols(discount_t)[0]
  c = _sq_cols(c_t)[0]
  m = np.ones(r.shape, bool) if mask is None else _sq_cols(mask, dtype=bool)[0]
  t, n = r.shape
  g = np.zeros((t, n))
  for j in range(n):
    q_ret = v[t - 1, j]
    for s in reversed(range(t)):
      if not m[s, j]:
        if s >= 1:
          q_ret = v[s - 1, j]
        continue
      q_ret = r[s, j] + d[s, j] * q_ret
      g[s, j] = q_ret
      if s >= 1:
        q_ret = c[s - 1, j] * (q_ret - qa[s - 1, j]) + v[s - 1, j]
  return _sq_uncols(g, batch)


def acer_q_ret(q_t, a_t, r_t, discount_t, pi_t, mu_t, mask=None, eps=1e-8):
  """Discrete Q^ret: V = sum_a pi Q, c = min(1, pi(a)/mu(a)) (Algorithm 2)."""
  _check_non_negative("eps", eps)
  q = np.asarray(q_t, np.float64)
  pi = np.asarray(pi_t, np.float64)
  a = np.asarray(a_t)
  mu = np.asarray(mu_t, np.float64)
  q_a = np.take_along_axis(q, a[..., None], -1)[..., 0]
  pi_a = np.take_along_axis(pi, a[..., None], -1)[..., 0]
  v = np.sum(pi * np.where(pi > 0, q, 0.0), axis=-1)  # an illegal action's -inf: no term
  c = np.minimum(1.0, pi_a / (mu + eps))
  return acer_returns(q_a, v, r_t, discount_t, c, mask)


def acer_continuous_targets(q_a_t, v_t, r_t, discount_t, log_rho_t, action_dim, mask=None):
  """(Q^ret with c = min(1, rho^(1/d)), Q^opc with c = 1) (Algorithm 3)."""
  action_dim = _check_count("action_dim", action_dim)
  rho = np.exp(np.asarray(log_rho_t, np.float64))
  c_ret = np.minimum(1.0, rho ** (1.0 / action_dim))
  return (
      acer_returns(q_a_t, v_t, r_t, discount_t, c_ret, mask),
      acer_returns(q_a_t, v_t, r_t, discount_t, np.ones_like(rho), mask),
  )


def acer_policy_objective(pi, mu, a, q, q_ret, clip_c=10.0, eps=1e-8):
  """ACER's per-step objective and its gradient g w.r.t. the probabilities.

  objective = min(c, rho_a) (Q^ret - V) log pi_a
              + sum_b [1 - c/rho_b]_+ pi_b (Q_b - V) log pi_b
  g_b = 1[b = a] min(c, rho_a) (Q^ret - V) / pi_a + [1 - c/rho_b]_+ (Q_b - V)
  (the paper's g with the statistics phi = pi; the pi_b of the correction
  cancels against d log pi_b / d pi_b = 1/pi_b).
  """
  _check_positive("clip_c", clip_c)
  _check_non_negative("eps", eps)
  pi = np.asarray(pi, np.float64)
  shape, n_act = pi.shape[:-1], pi.shape[-1]
  pi2 = pi.reshape(-1, n_act)
  mu2 = np.asarray(mu, np.float64).reshape(-1, n_act)
  q2 = np.asarray(q, np.float64).reshape(-1, n_act)
  a2 = np.asarray(a).reshape(-1)
  qr2 = np.asarray(q_ret, np.float64).reshape(-1)
  obj = np.zeros(pi2.shape[0])
  g = np.zeros(pi2.shape)
  for i in range(pi2.shape[0]):
    rho = pi2[i] / (mu2[i] + eps)
    v = sum(pi2[i, b] * q2[i, b] for b in range(n_act))
    ai = a2[i]
    coef = min(clip_c, rho[ai]) * (qr2[i] - v)
    obj[i] += coef * np.log(pi2[i, ai])
    g[i, ai] += coef / pi2[i, ai]
    for b in range(n_act):
      corr = max(0.0, 1.0 - clip_c / rho[b]) if rho[b] > 0 else 0.0
      if corr * pi2[i, b] * (q2[i, b] - v) != 0.0:
        obj[i] += corr * pi2[i, b] * (q2[i, b] - v) * np.log(pi2[i, b])
      g[i, b] += corr * (q2[i, b] - v)
  return obj.reshape(shape), g.reshape(pi.shape)


def trust_region_projection(g, k, delta):
  """z* = g - max(0, (k.g - delta) / |k|^2) k, row by row."""
  _check_non_negative("delta", delta)
  g = np.asarray(g, np.float64)
  k = np.asarray(k, np.float64)
  g2, k2 = g.reshape(-1, g.shape[-1]), k.reshape(-1, g.shape[-1])
  z = np.array(g2, copy=True)
  for i in range(g2.shape[0]):
    kg = float(np.dot(k2[i], g2[i]))
    kk = float(np.dot(k2[i], k2[i]))
    if kk > 0 and kg > delta:
      z[i] = g2[i] - (kg - delta) / kk * k2[i]
  return z.reshape(g.shape)


def acer_continuous_policy_objective(
    log_pi_a, log_pi_sample, log_rho_a, log_rho_sample, q_opc, q_sample, v, clip_c=10.0
):
  """Returns (objective, d obj / d log_pi_a, d obj / d log_pi_sample)."""
  _check_positive("clip_c", clip_c)
  lpa, lps, lra, lrs, qo, qs, vv = (
      np.asarray(x, np.float64).reshape(-1)
      for x in (log_pi_a, log_pi_sample, log_rho_a, log_rho_sample, q_opc, q_sample, v)
  )
  obj, ga, gs = (np.zeros(lpa.size) for _ in range(3))
  for i in range(lpa.size):
    rho_a, rho_s = np.exp(lra[i]), np.exp(lrs[i])
    ga[i] = min(clip_c, rho_a) * (qo[i] - vv[i])
    gs[i] = max(0.0, 1.0 - clip_c / rho_s) * (qs[i] - vv[i])
    obj[i] = ga[i] * lpa[i] + gs[i] * lps[i]
  shape = np.shape(log_pi_a)
  return obj.reshape(shape), ga.reshape(shape), gs.reshape(shape)


def acer_continuous_value_losses(q_tilde_a, v, q_ret, log_rho_a):
  """Returns (loss, d loss / d q_tilde_a, d loss / d v)."""
  qt, vv, qr, lr = (np.asarray(x, np.float64) for x in (q_tilde_a, v, q_ret, log_rho_a))
  v_target = np.minimum(1.0, np.exp(lr)) * (qr - qt) + vv
  loss = 0.5 * (qr - qt) ** 2 + 0.5 * (v_target - vv) ** 2
  return loss, -(qr - qt), -(v_target - vv)


# The reverse linear recurrence, V-trace, n-step returns and the general off-policy
# returns (Retrace, Q(lambda)).


def _ref_f64(x):
  return np.array(x, dtype=np.float64, copy=True)


def _ref_mask(mask, shape):
  if mask is None:
    return np.ones(shape, dtype=bool)
  mask = np.asarray(mask)
  assert mask.dtype == bool and mask.shape == tuple(shape), (mask.dtype, mask.shape, shape)
  return mask


def _ref_columns(shape):
  """Index tuples (slice over time, batch index...) of every column."""
  return [(slice(None),) + idx for idx in np.ndindex(*shape[1:])]


def _ref_segment_end(mask_col, s):
  """Last index e >= s with mask_col[s..e] all True (mask_col[s] is True)."""
  e = s
  while e + 1 < len(mask_col) and mask_col[e + 1]:
    e += 1
  return e


def reverse_linear_recurrence(a, b, init=None):
  """acc_t = b_t + a_t acc_{t+1} for t = T-1..0, acc_T = init (0 if None)."""
  a, b = _ref_f64(a), _ref_f64(b)
  assert a.shape == b.shape
  t_len = b.shape[0]
  init = np.zeros(b.shape[1:]) if init is None else _ref_f64(init).reshape(b.shape[1:])
  acc = np.zeros(b.shape)
  for col in _ref_columns(b.shape):
    carry = init[col[1:]]
    for t in reversed(range(t_len)):
      carry = b[col][t] + a[col][t] * carry
      acc[(t,) + col[1:]] = carry
  return acc


def vtrace(
    v_tm1,
    v_t,
    r_t,
    discount_t,
    rho_tm1,
    mask=None,
    lambda_=1.0,
    clip_rho_threshold=1.0,
    clip_c_threshold=1.0,
    clip_pg_rho_threshold=1.0,
):
  """V-trace from the explicit sum of Espeholt et al. (eq. 1), per column.

      v_s = V(x_s) + sum_{t=s}^{e} (prod_{i=s}^{t-1} d_i c_i) delta_t,
      delta_t = min(rho_bar, rho_t) (r_t + d_t V(x_{t+1}) - V(x_t)),
      c_i = lambda min(c_bar, rho_i),

  with e the end of the segment of s (the trace never enters a masked step).
  q_s = r_s + d_s v_{s+1} if s+1 is in the segment, else r_s + d_s v_t[s];
  pg_s = min(rho_bar_pg, rho_s) (q_s - V(x_s)). All zero at masked steps.

  Returns (errors = v_s - V(x_s), pg_advantage, q_estimate), float64.
  """
  _check_discounts(discount_t, mask)
  _check_unit_interval("lambda_", lambda_)
  for name, x in (
      ("clip_rho_threshold", clip_rho_threshold),
      ("clip_c_threshold", clip_c_threshold),
      ("clip_pg_rho_threshold", clip_pg_rho_threshold),
  ):
    _check_positive(name, x)
  v_tm1, v_t, r_t = _ref_f64(v_tm1), _ref_f64(v_t), _ref_f64(r_t)
  discount_t, rho_tm1 = _ref_f64(discount_t), _ref_f64(rho_tm1)
  shape = r_t.shape
  mask = _ref_mask(mask, shape)
  errors = np.zeros(shape)
  pg_adv = np.zeros(shape)
  q_est = np.zeros(shape)
  t_len = shape[0]
  for col in _ref_columns(shape):
    vm, vt, r, d, rho, m = (x[col] for x in (v_tm1, v_t, r_t, discount_t, rho_tm1, mask))
    err = [0.0] * t_len
    for s in range(t_len):
      if not m[s]:
        continue
      e = _ref_segment_end(m, s)
      total, weight = 0.0, 1.0  # weight = prod_{i=s}^{t-1} d_i c_i
      for t in range(s, e + 1):
        delta = min(clip_rho_threshold, rho[t]) * (r[t] + d[t] * vt[t] - vm[t])
        total += weight * delta
        weight *= d[t] * lambda_ * min(clip_c_threshold, rho[t])
      err[s] = total
    for s in range(t_len):
      if not m[s]:
        continue
      if s + 1 < t_len and m[s + 1]:
        bootstrap = vm[s + 1] + err[s + 1]
      else:
        bootstrap = vt[s]
      q = r[s] + d[s] * bootstrap
      idx = (s,) + col[1:]
      errors[idx] = err[s]
      q_est[idx] = q
      pg_adv[idx] = min(clip_pg_rho_threshold, rho[s]) * (q - vm[s])
  return errors, pg_adv, q_est


def nstep_bootstrapped_returns(v_t, r_t, discount_t, mask=None):
  """Discounted rewards to the end of the segment, then bootstrap.

      G_s = sum_{t=s}^{e} (prod_{i=s}^{t-1} d_i) r_t + (prod_{i=s}^{e} d_i) v_t[e]

  (zero at masked steps).
  """
  _check_discounts(discount_t, mask)
  v_t, r_t, discount_t = _ref_f64(v_t), _ref_f64(r_t), _ref_f64(discount_t)
  shape = r_t.shape
  mask = _ref_mask(mask, shape)
  out = np.zeros(shape)
  for col in _ref_columns(shape):
    vt, r, d, m = v_t[col], r_t[col], discount_t[col], mask[col]
    for s in range(shape[0]):
      if not m[s]:
        continue
      e = _ref_segment_end(m, s)
      total, disc = 0.0, 1.0
      for t in range(s, e + 1):
        total += disc * r[t]
        disc *= d[t]
      out[(s,) + col[1:]] = total + disc * vt[e]
  return out


def general_off_policy_returns(q_a_t, v_t, r_t, discount_t, c_t, mask=None):
  """G_s = r_s + d_s (v_t[s] - c'_s q_a_t[s] + c'_s G_{s+1}), backwards.

  c'_s = c_t[s] if s+1 < T and mask[s+1] else 0; G_s = 0 where mask[s] False.
  """
  _check_discounts(discount_t, mask)
  q_a_t, v_t, r_t = _ref_f64(q_a_t), _ref_f64(v_t), _ref_f64(r_t)
  discount_t, c_t = _ref_f64(discount_t), _ref_f64(c_t)
  shape = r_t.shape
  mask = _ref_mask(mask, shape)
  out = np.zeros(shape)
  t_len = shape[0]
  for col in _ref_columns(shape):
    qa, vt, r, d, c, m = (x[col] for x in (q_a_t, v_t, r_t, discount_t, c_t, mask))
    g_next = 0.0
    for s in reversed(range(t_len)):
      if not m[s]:
        g_next = 0.0
        continue
      c_eff = c[s] if (s + 1 < t_len and m[s + 1]) else 0.0
      g = r[s] + d[s] * (vt[s] - c_eff * qa[s] + c_eff * g_next)
      out[(s,) + col[1:]] = g
      g_next = g
  return out


def retrace(q_tm1, q_t, a_tm1, a_t, r_t, discount_t, pi_t, mu_t, mask=None, lambda_=1.0, eps=1e-8):
  """Retrace (Munos et al. 2016). Returns (errors, targets), float64.

  c_t = lambda min(1, pi_t[a_t] / (mu_t + eps)), V(x_{s+1}) = sum_a pi_t Q_t (over the
  actions with pi_t > 0),
  targets from `general_off_policy_returns`, errors = targets - Q(x_s, a_s)
  (zero at masked steps).
  """
  _check_unit_interval("lambda_", lambda_)
  _check_non_negative("eps", eps)
  q_tm1, q_t, pi_t = _ref_f64(q_tm1), _ref_f64(q_t), _ref_f64(pi_t)
  a_tm1, a_t = np.asarray(a_tm1), np.asarray(a_t)
  mu_t, r_t = _ref_f64(mu_t), _ref_f64(r_t)
  shape = r_t.shape
  mask = _ref_mask(mask, shape)
  num_actions = q_t.shape[-1]
  c_t = np.zeros(shape)
  v_t = np.zeros(shape)
  q_a_t = np.zeros(shape)
  q_a_tm1 = np.zeros(shape)
  for idx in np.ndindex(*shape):
    total = 0.0
    for b in range(num_actions):
      if pi_t[idx][b] > 0:  # an action pi never takes may have a Q of -inf (illegal)
        total += pi_t[idx][b] * q_t[idx][b]
    v_t[idx] = total
    q_a_t[idx] = q_t[idx][a_t[idx]]
    q_a_tm1[idx] = q_tm1[idx][a_tm1[idx]]
    with np.errstate(divide="ignore", invalid="ignore"):
      ratio = pi_t[idx][a_t[idx]] / (mu_t[idx] + eps)
    c_t[idx] = lambda_ * min(1.0, ratio) if mask[idx] else 0.0
  targets = general_off_policy_returns(q_a_t, v_t, r_t, discount_t, c_t, mask)
  errors = np.where(mask, targets - q_a_tm1, 0.0)
  return errors, targets


def q_lambda_errors(q_tm1, a_tm1, q_t, pi_t, r_t, discount_t, mask=None, lambda_=1.0):
  """Q(lambda) (Harutyunyan et al. 2016) as a sum of expected-TD errors.

      G_s - Q(x_s, a_s) = sum_{t=s}^{e} (prod_{i=s}^{t-1} lambda d_i) delta_t,
      delta_t = r_t + d_t sum_a pi_t[a] q_t[a] - Q(x_t, a_t)   (Q from q_tm1).

  Equal to Retrace with c = lambda when the arrays are consistent within a
  segment (q_t[s, a_t[s]] == q_tm1[s+1, a_tm1[s+1]]).
  """
  _check_discounts(discount_t, mask)
  _check_unit_interval("lambda_", lambda_)
  q_tm1, q_t, pi_t = _ref_f64(q_tm1), _ref_f64(q_t), _ref_f64(pi_t)
  r_t, discount_t = _ref_f64(r_t), _ref_f64(discount_t)
  a_tm1 = np.asarray(a_tm1)
  shape = r_t.shape
  mask = _ref_mask(mask, shape)
  num_actions = q_t.shape[-1]
  out = np.zeros(shape)
  for col in _ref_columns(shape):
    bidx = col[1:]
    m, d = mask[col], discount_t[col]

    delta = [0.0] * shape[0]
    for t in range(shape[0]):
      idx = (t,) + bidx
      v_next = sum(pi_t[idx][b] * q_t[idx][b] for b in range(num_actions) if pi_t[idx][b] > 0)
      delta[t] = r_t[idx] + discount_t[idx] * v_next - q_tm1[idx][a_tm1[idx]]

    for s in range(shape[0]):
      if not m[s]:
        continue
      e = _ref_segment_end(m, s)
      total, weight = 0.0, 1.0
      for t in range(s, e + 1):
        total += weight * delta[t]
        weight *= lambda_ * d[t]
      out[(s,) + bidx] = total
  return out
