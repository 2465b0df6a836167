"""Plain float64 NumPy loop references for the loss tests (one section per estimator family)."""

# =============================================================================
# References for soft-Q / SQL / SQIL, the distribution helpers, the IMPALA
# loss and the ACER pieces. Plain float64 NumPy loops over time (and over the
# flattened batch columns), written from the papers' recursions, not from the
# library's vectorised formulation.
# =============================================================================

import numpy as _np


def _sq_cols(x, trailing=0, dtype=_np.float64):
  """[T, *batch, *trailing] -> ([T, N, *trailing] copy, batch_shape)."""
  x = _np.asarray(x)
  if dtype is not None:
    x = x.astype(dtype)
  t = x.shape[0]
  batch = x.shape[1 : x.ndim - trailing]
  tail = x.shape[x.ndim - trailing :]
  return x.reshape((t, -1) + tail), batch


def _sq_uncols(x, batch):
  return x.reshape((x.shape[0],) + tuple(batch) + x.shape[2:])


def sq_random_layout(
    rng,
    t,
    batch_shape=(),
    *,
    p_term=0.15,
    p_trunc=0.15,
    p_start_masked=0.15,
    gamma_range=(0.5, 1.0),
):
  """Random episode structure for [T, *batch] sequences.

  Returns (discount_t, mask, kind) with kind 0 = MID, 1 = termination (LAST,
  discount 0), 2 = truncation (LAST, env discount 1, i.e. discount_t = gamma),
  3 = masked auto-reset step (follows every LAST; garbage discount 7).
  Sequences may also start with a masked step (an unroll boundary right after
  a LAST step).
  """
  n = int(_np.prod(batch_shape, dtype=_np.int64))
  discount = _np.zeros((t, n))
  mask = _np.ones((t, n), bool)
  kind = _np.zeros((t, n), _np.int64)
  for j in range(n):
    gamma = rng.uniform(*gamma_range)
    prev_last = rng.random() < p_start_masked
    for s in range(t):
      if prev_last:
        mask[s, j] = False
        discount[s, j] = 7.0
        kind[s, j] = 3
        prev_last = False
        continue
      u = rng.random()
      if u < p_term:
        discount[s, j], kind[s, j], prev_last = 0.0, 1, True
      elif u < p_term + p_trunc:
        discount[s, j], kind[s, j], prev_last = gamma, 2, True
      else:
        discount[s, j] = gamma
  shape = (t,) + tuple(batch_shape)
  return discount.reshape(shape), mask.reshape(shape), kind.reshape(shape)


def sq_garble(rng, x, mask, scale=1e3):
  """Replaces the entries of masked steps by large garbage (finite) values."""
  x = _np.array(x, copy=True)
  m = _np.asarray(mask)
  m = m.reshape(m.shape + (1,) * (x.ndim - m.ndim))
  garbage = rng.uniform(-scale, scale, size=x.shape).astype(x.dtype)
  return _np.where(m, x, garbage)


# ----------------------------------------------------------------------------
# Soft values and soft-Q targets.
# ----------------------------------------------------------------------------


def np_logsumexp(x, axis=-1):
  x = _np.asarray(x, _np.float64)
  m = _np.max(x, axis=axis, keepdims=True)
  m = _np.where(_np.isfinite(m), m, 0.0)
  with _np.errstate(divide="ignore"):
    out = _np.log(_np.sum(_np.exp(x - m), axis=axis, keepdims=True)) + m
  return _np.squeeze(out, axis=axis)


def np_softmax(x, axis=-1):
  x = _np.asarray(x, _np.float64)
  m = _np.max(x, axis=axis, keepdims=True)
  e = _np.exp(x - m)
  return e / _np.sum(e, axis=axis, keepdims=True)


def np_soft_value(q, alpha):
  """alpha * log sum_a exp(q_a / alpha), element by element (alpha scalar)."""
  q = _np.asarray(q, _np.float64)
  flat = q.reshape(-1, q.shape[-1])
  out = _np.empty(flat.shape[0])
  for i, row in enumerate(flat):
    z = row / alpha
    m = _np.max(z)
    out[i] = alpha * (m + _np.log(_np.sum(_np.exp(z - m))))
  return out.reshape(q.shape[:-1])


def np_soft_q_targets(r_t, discount_t, q_t, alpha, lambda_=0.0, mask=None):
  """Soft lambda-returns; alpha=None uses the hard max (Q(lambda) targets).

  G_s = r_s + d_s ((1 - l_s) V(q_t[s]) + l_s G_{s+1}),
  l_s = lambda if s + 1 < T and mask[s + 1] else 0;  G_s = 0 if not mask[s].
  """
  r, batch = _sq_cols(r_t)
  d, _ = _sq_cols(discount_t)
  q, _ = _sq_cols(q_t, trailing=1)
  m = _np.ones(r.shape, bool) if mask is None else _sq_cols(mask, dtype=bool)[0]
  t, n = r.shape
  g = _np.zeros((t, n))
  for j in range(n):
    for s in reversed(range(t)):
      if not m[s, j]:
        continue
      v = _np.max(q[s, j]) if alpha is None else np_soft_value(q[s, j], alpha)
      lam = lambda_ if (s + 1 < t and m[s + 1, j]) else 0.0
      nxt = g[s + 1, j] if lam else 0.0
      g[s, j] = r[s, j] + d[s, j] * ((1.0 - lam) * v + lam * nxt)
  return _sq_uncols(g, batch)


def np_soft_nstep_targets(r_t, discount_t, q_t, alpha, n, mask=None):
  """n-step soft returns, truncated at the end and before masked steps."""
  r, batch = _sq_cols(r_t)
  d, _ = _sq_cols(discount_t)
  q, _ = _sq_cols(q_t, trailing=1)
  m = _np.ones(r.shape, bool) if mask is None else _sq_cols(mask, dtype=bool)[0]
  t, cols = r.shape
  g = _np.zeros((t, cols))
  for j in range(cols):
    for s in range(t):
      if not m[s, j]:
        continue
      total, disc, k = 0.0, 1.0, s
      for used in range(1, n + 1):
        total += disc * r[k, j]
        disc *= d[k, j]
        if used == n or k + 1 >= t or not m[k + 1, j]:
          total += disc * np_soft_value(q[k, j], alpha)
          break
        k += 1
      g[s, j] = total
  return _sq_uncols(g, batch)


# ----------------------------------------------------------------------------
# Distributions.
# ----------------------------------------------------------------------------


def np_log_softmax(x):
  x = _np.asarray(x, _np.float64)
  return x - np_logsumexp(x)[..., None]


def np_categorical_entropy(logits):
  log_p = np_log_softmax(logits)
  p = _np.exp(log_p)
  with _np.errstate(invalid="ignore"):
    terms = _np.where(p > 0, p * log_p, 0.0)
  return -_np.sum(terms, axis=-1)


def np_categorical_kl(p_logits, q_logits):
  log_p, log_q = np_log_softmax(p_logits), np_log_softmax(q_logits)
  p = _np.exp(log_p)
  with _np.errstate(invalid="ignore"):
    terms = _np.where(p > 0, p * (log_p - log_q), 0.0)
  return _np.sum(terms, axis=-1)


def np_gaussian_kl(mean_p, log_std_p, mean_q, log_std_q):
  """Closed-form KL(N(mp, sp^2) || N(mq, sq^2)), summed over the last axis."""
  mp, lsp, mq, lsq = (_np.asarray(x, _np.float64) for x in (mean_p, log_std_p, mean_q, log_std_q))
  sp2, sq2 = _np.exp(2 * lsp), _np.exp(2 * lsq)
  return _np.sum(lsq - lsp + (sp2 + (mp - mq) ** 2) / (2 * sq2) - 0.5, -1)


# ----------------------------------------------------------------------------
# V-trace (as used by the IMPALA loss) and the IMPALA loss.
# ----------------------------------------------------------------------------


def np_vtrace_for_impala(
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
  vt1, batch = _sq_cols(v_tm1)
  vt = _sq_cols(v_t)[0]
  r = _sq_cols(r_t)[0]
  d = _sq_cols(discount_t)[0]
  rho = _sq_cols(rho_tm1)[0]
  m = _np.ones(r.shape, bool) if mask is None else _sq_cols(mask, dtype=bool)[0]
  t, n = r.shape
  err = _np.zeros((t, n))
  pg = _np.zeros((t, n))
  qe = _np.zeros((t, n))
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


def np_impala_loss(
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
):
  """The IMPALA loss terms and their gradients, as a dict of float64 arrays."""
  log_pi = _np.asarray(log_pi_tm1, _np.float64)
  log_mu = _np.asarray(log_mu_tm1, _np.float64)
  ent = _np.asarray(entropy_tm1, _np.float64)
  shape = log_pi.shape
  rho = _np.exp(log_pi - log_mu)
  err, pg, qe = np_vtrace_for_impala(
      v_tm1, v_t, r_t, discount_t, rho, mask, lambda_, clip_rho, clip_c, clip_pg
  )
  m = _np.ones(shape, bool) if mask is None else _np.asarray(mask, bool)
  w = _np.ones(shape) if weights is None else _np.asarray(weights, _np.float64)
  w = _np.where(m, w, 0.0)
  # Loops, to keep the reference free of the library's masking tricks.
  wf, pgf, lpf, errf, entf, rhof = (x.reshape(-1) for x in (w, pg, log_pi, err, ent, rho))
  total = 0.0
  pol = val = en = mrho = clipped = 0.0
  for i in range(wf.size):
    if wf[i] == 0:
      continue
    total += wf[i]
    pol += wf[i] * -pgf[i] * lpf[i]
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
  out["grad_log_pi"] = -w * pg / denom
  out["grad_v_tm1"] = -2.0 * value_weight * w * err / denom
  out["grad_entropy"] = -entropy_weight * w / denom
  return out


# ----------------------------------------------------------------------------
# ACER.
# ----------------------------------------------------------------------------


def np_acer_returns(q_a_t, v_t, r_t, discount_t, c_t, mask=None):
  """ACER's Algorithm 2/3 recursion over [T, ...] arrays.

      Q^ret <- V(x_T)                           (the bootstrap at the end)
      for s = T-1 .. 0:
        Q^ret <- r_s + gamma_s Q^ret            (the target of step s)
        Q^ret <- c_s (Q^ret - Q(x_s, a_s)) + V(x_s)

  where (x_s, a_s) for the second line is read from index s-1 of the `_t`
  arrays (q_a_t[s-1] = Q(x_s, a_s), v_t[s-1] = V(x_s), c_t[s-1] = c_s). A
  masked step s has target 0 and restarts the carry at V(x_s) = v_t[s-1].
  """
  qa, batch = _sq_cols(q_a_t)
  v = _sq_cols(v_t)[0]
  r = _sq_cols(r_t)[0]
  d = _sq_cols(discount_t)[0]
  c = _sq_cols(c_t)[0]
  m = _np.ones(r.shape, bool) if mask is None else _sq_cols(mask, dtype=bool)[0]
  t, n = r.shape
  g = _np.zeros((t, n))
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


def np_acer_q_ret(q_t, a_t, r_t, discount_t, pi_t, mu_t, mask=None, eps=1e-8):
  """Discrete Q^ret: V = sum_a pi Q, c = min(1, pi(a)/mu(a)) (Algorithm 2)."""
  q = _np.asarray(q_t, _np.float64)
  pi = _np.asarray(pi_t, _np.float64)
  a = _np.asarray(a_t)
  mu = _np.asarray(mu_t, _np.float64)
  q_a = _np.take_along_axis(q, a[..., None], -1)[..., 0]
  pi_a = _np.take_along_axis(pi, a[..., None], -1)[..., 0]
  v = _np.sum(pi * q, axis=-1)
  c = _np.minimum(1.0, pi_a / (mu + eps))
  return np_acer_returns(q_a, v, r_t, discount_t, c, mask)


def np_acer_continuous_targets(q_a_t, v_t, r_t, discount_t, log_rho_t, action_dim, mask=None):
  """(Q^ret with c = min(1, rho^(1/d)), Q^opc with c = 1) (Algorithm 3)."""
  rho = _np.exp(_np.asarray(log_rho_t, _np.float64))
  c_ret = _np.minimum(1.0, rho ** (1.0 / action_dim))
  return (
      np_acer_returns(q_a_t, v_t, r_t, discount_t, c_ret, mask),
      np_acer_returns(q_a_t, v_t, r_t, discount_t, _np.ones_like(rho), mask),
  )


def np_acer_policy_objective(pi, mu, a, q, q_ret, clip_c=10.0, eps=1e-8):
  """ACER's per-step objective and its gradient g w.r.t. the probabilities.

  objective = min(c, rho_a) (Q^ret - V) log pi_a
              + sum_b [1 - c/rho_b]_+ pi_b (Q_b - V) log pi_b
  g_b = 1[b = a] min(c, rho_a) (Q^ret - V) / pi_a + [1 - c/rho_b]_+ (Q_b - V)
  (the paper's g with the statistics phi = pi; the pi_b of the correction
  cancels against d log pi_b / d pi_b = 1/pi_b).
  """
  pi = _np.asarray(pi, _np.float64)
  shape, n_act = pi.shape[:-1], pi.shape[-1]
  pi2 = pi.reshape(-1, n_act)
  mu2 = _np.asarray(mu, _np.float64).reshape(-1, n_act)
  q2 = _np.asarray(q, _np.float64).reshape(-1, n_act)
  a2 = _np.asarray(a).reshape(-1)
  qr2 = _np.asarray(q_ret, _np.float64).reshape(-1)
  obj = _np.zeros(pi2.shape[0])
  g = _np.zeros(pi2.shape)
  for i in range(pi2.shape[0]):
    rho = pi2[i] / (mu2[i] + eps)
    v = sum(pi2[i, b] * q2[i, b] for b in range(n_act))
    ai = a2[i]
    coef = min(clip_c, rho[ai]) * (qr2[i] - v)
    obj[i] += coef * _np.log(pi2[i, ai])
    g[i, ai] += coef / pi2[i, ai]
    for b in range(n_act):
      corr = max(0.0, 1.0 - clip_c / rho[b]) if rho[b] > 0 else 0.0
      if corr * pi2[i, b] * (q2[i, b] - v) != 0.0:
        obj[i] += corr * pi2[i, b] * (q2[i, b] - v) * _np.log(pi2[i, b])
      g[i, b] += corr * (q2[i, b] - v)
  return obj.reshape(shape), g.reshape(pi.shape)


def np_trust_region_projection(g, k, delta):
  """z* = g - max(0, (k.g - delta) / |k|^2) k, row by row."""
  g = _np.asarray(g, _np.float64)
  k = _np.asarray(k, _np.float64)
  g2, k2 = g.reshape(-1, g.shape[-1]), k.reshape(-1, g.shape[-1])
  z = _np.array(g2, copy=True)
  for i in range(g2.shape[0]):
    kg = float(_np.dot(k2[i], g2[i]))
    kk = float(_np.dot(k2[i], k2[i]))
    if kk > 0 and kg > delta:
      z[i] = g2[i] - (kg - delta) / kk * k2[i]
  return z.reshape(g.shape)


def np_acer_continuous_policy_objective(
    log_pi_a, log_pi_sample, log_rho_a, log_rho_sample, q_opc, q_sample, v, clip_c=10.0
):
  """Returns (objective, d obj / d log_pi_a, d obj / d log_pi_sample)."""
  lpa, lps, lra, lrs, qo, qs, vv = (
      _np.asarray(x, _np.float64).reshape(-1)
      for x in (log_pi_a, log_pi_sample, log_rho_a, log_rho_sample, q_opc, q_sample, v)
  )
  obj, ga, gs = (_np.zeros(lpa.size) for _ in range(3))
  for i in range(lpa.size):
    rho_a, rho_s = _np.exp(lra[i]), _np.exp(lrs[i])
    ga[i] = min(clip_c, rho_a) * (qo[i] - vv[i])
    gs[i] = max(0.0, 1.0 - clip_c / rho_s) * (qs[i] - vv[i])
    obj[i] = ga[i] * lpa[i] + gs[i] * lps[i]
  shape = _np.shape(log_pi_a)
  return obj.reshape(shape), ga.reshape(shape), gs.reshape(shape)


def np_acer_continuous_value_losses(q_tilde_a, v, q_ret, log_rho_a):
  """Returns (loss, d loss / d q_tilde_a, d loss / d v)."""
  qt, vv, qr, lr = (_np.asarray(x, _np.float64) for x in (q_tilde_a, v, q_ret, log_rho_a))
  v_target = _np.minimum(1.0, _np.exp(lr)) * (qr - qt) + vv
  loss = 0.5 * (qr - qt) ** 2 + 0.5 * (v_target - vv) ** 2
  return loss, -(qr - qt), -(v_target - vv)


def sq_junction_layout(lengths, lead_masked=False):
  """Episodes of the given lengths joined in time by one masked step each.

  Returns (mask [T] bool, slices) where slices[i] indexes episode i in the
  concatenated time axis; the masked junction steps hold garbage.
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
  return _np.asarray(mask, bool), slices


# =============================================================================
# References for the reverse linear recurrence, V-trace and the general
# off-policy returns (Retrace, Q(lambda)). Plain float64 NumPy loops over time
# and over the batch columns, written from the definitions (the explicit sums
# of the papers where that is a different form from the library's recursion),
# independently of `offpolicy_ac`.
#
# Mask semantics: mask[s] False marks a step that is not a real transition. It
# gets zero outputs and cuts the trace: the "segment" of a real step s runs
# from s to end(s), the last index e >= s such that mask[s..e] are all True.
# =============================================================================

_rnp = _np


def _ref_f64(x):
  return _rnp.array(x, dtype=_rnp.float64, copy=True)


def _ref_mask(mask, shape):
  if mask is None:
    return _rnp.ones(shape, dtype=bool)
  mask = _rnp.asarray(mask)
  assert mask.dtype == bool and mask.shape == tuple(shape), (mask.dtype, mask.shape, shape)
  return mask


def _ref_columns(shape):
  """Index tuples (slice over time, batch index...) of every column."""
  return [(slice(None),) + idx for idx in _rnp.ndindex(*shape[1:])]


def _ref_segment_end(mask_col, s):
  """Last index e >= s with mask_col[s..e] all True (mask_col[s] is True)."""
  e = s
  while e + 1 < len(mask_col) and mask_col[e + 1]:
    e += 1
  return e


def ref_reverse_linear_recurrence(a, b, init=None):
  """acc_t = b_t + a_t acc_{t+1} for t = T-1..0, acc_T = init (0 if None)."""
  a, b = _ref_f64(a), _ref_f64(b)
  assert a.shape == b.shape
  t_len = b.shape[0]
  init = _rnp.zeros(b.shape[1:]) if init is None else _ref_f64(init).reshape(b.shape[1:])
  acc = _rnp.zeros(b.shape)
  for col in _ref_columns(b.shape):
    carry = init[col[1:]]
    for t in reversed(range(t_len)):
      carry = b[col][t] + a[col][t] * carry
      acc[(t,) + col[1:]] = carry
  return acc


def ref_vtrace(
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
  v_tm1, v_t, r_t = _ref_f64(v_tm1), _ref_f64(v_t), _ref_f64(r_t)
  discount_t, rho_tm1 = _ref_f64(discount_t), _ref_f64(rho_tm1)
  shape = r_t.shape
  mask = _ref_mask(mask, shape)
  errors = _rnp.zeros(shape)
  pg_adv = _rnp.zeros(shape)
  q_est = _rnp.zeros(shape)
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


def ref_nstep_bootstrapped_returns(v_t, r_t, discount_t, mask=None):
  """Discounted rewards to the end of the segment, then bootstrap.

      G_s = sum_{t=s}^{e} (prod_{i=s}^{t-1} d_i) r_t + (prod_{i=s}^{e} d_i) v_t[e]

  (zero at masked steps).
  """
  v_t, r_t, discount_t = _ref_f64(v_t), _ref_f64(r_t), _ref_f64(discount_t)
  shape = r_t.shape
  mask = _ref_mask(mask, shape)
  out = _rnp.zeros(shape)
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


def ref_general_off_policy_returns(q_a_t, v_t, r_t, discount_t, c_t, mask=None):
  """G_s = r_s + d_s (v_t[s] - c'_s q_a_t[s] + c'_s G_{s+1}), backwards.

  c'_s = c_t[s] if s+1 < T and mask[s+1] else 0; G_s = 0 where mask[s] False.
  """
  q_a_t, v_t, r_t = _ref_f64(q_a_t), _ref_f64(v_t), _ref_f64(r_t)
  discount_t, c_t = _ref_f64(discount_t), _ref_f64(c_t)
  shape = r_t.shape
  mask = _ref_mask(mask, shape)
  out = _rnp.zeros(shape)
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


def ref_retrace(
    q_tm1, q_t, a_tm1, a_t, r_t, discount_t, pi_t, mu_t, mask=None, lambda_=1.0, eps=1e-8
):
  """Retrace (Munos et al. 2016). Returns (errors, targets), float64.

  c_t = lambda min(1, pi_t[a_t] / (mu_t + eps)), V(x_{s+1}) = sum_a pi_t Q_t,
  targets from `ref_general_off_policy_returns`, errors = targets - Q(x_s, a_s)
  (zero at masked steps).
  """
  q_tm1, q_t, pi_t = _ref_f64(q_tm1), _ref_f64(q_t), _ref_f64(pi_t)
  a_tm1, a_t = _rnp.asarray(a_tm1), _rnp.asarray(a_t)
  mu_t, r_t = _ref_f64(mu_t), _ref_f64(r_t)
  shape = r_t.shape
  mask = _ref_mask(mask, shape)
  num_actions = q_t.shape[-1]
  c_t = _rnp.zeros(shape)
  v_t = _rnp.zeros(shape)
  q_a_t = _rnp.zeros(shape)
  q_a_tm1 = _rnp.zeros(shape)
  for idx in _rnp.ndindex(*shape):
    total = 0.0
    for b in range(num_actions):
      total += pi_t[idx][b] * q_t[idx][b]
    v_t[idx] = total
    q_a_t[idx] = q_t[idx][a_t[idx]]
    q_a_tm1[idx] = q_tm1[idx][a_tm1[idx]]
    with _rnp.errstate(divide="ignore", invalid="ignore"):
      ratio = pi_t[idx][a_t[idx]] / (mu_t[idx] + eps)
    c_t[idx] = lambda_ * min(1.0, ratio) if mask[idx] else 0.0
  targets = ref_general_off_policy_returns(q_a_t, v_t, r_t, discount_t, c_t, mask)
  errors = _rnp.where(mask, targets - q_a_tm1, 0.0)
  return errors, targets


def ref_q_lambda_errors(q_tm1, a_tm1, q_t, pi_t, r_t, discount_t, mask=None, lambda_=1.0):
  """Q(lambda) (Harutyunyan et al. 2016) as a sum of expected-TD errors.

      G_s - Q(x_s, a_s) = sum_{t=s}^{e} (prod_{i=s}^{t-1} lambda d_i) delta_t,
      delta_t = r_t + d_t sum_a pi_t[a] q_t[a] - Q(x_t, a_t)   (Q from q_tm1).

  Equal to Retrace with c = lambda when the arrays are consistent within a
  segment (q_t[s, a_t[s]] == q_tm1[s+1, a_tm1[s+1]]).
  """
  q_tm1, q_t, pi_t = _ref_f64(q_tm1), _ref_f64(q_t), _ref_f64(pi_t)
  r_t, discount_t = _ref_f64(r_t), _ref_f64(discount_t)
  a_tm1 = _rnp.asarray(a_tm1)
  shape = r_t.shape
  mask = _ref_mask(mask, shape)
  num_actions = q_t.shape[-1]
  out = _rnp.zeros(shape)
  for col in _ref_columns(shape):
    bidx = col[1:]
    m, d = mask[col], discount_t[col]

    delta = [0.0] * shape[0]
    for t in range(shape[0]):
      idx = (t,) + bidx
      v_next = sum(pi_t[idx][b] * q_t[idx][b] for b in range(num_actions))
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


def ref_episode_layout(
    rng, t_len, batch_shape=(), *, p_term=0.12, p_trunc=0.12, p_start_masked=0.15, gamma=None
):
  """Random episode structure for [T, *batch] sequences.

  Returns (discount_t, mask, kind), kind: 0 MID (discount gamma), 1 LAST by
  termination (discount 0), 2 LAST by truncation (discount gamma: the final
  observation's value is bootstrapped), 3 masked auto-reset step (follows
  every LAST that is not the last step of the window; its discount is left at
  gamma and should be overwritten by garbage by the caller). A window may
  start with a masked step (the unroll began right after a LAST step).
  """
  shape = (t_len,) + tuple(batch_shape)
  discount = _rnp.zeros(shape)
  mask = _rnp.ones(shape, dtype=bool)
  kind = _rnp.zeros(shape, dtype=_rnp.int64)
  for col in _ref_columns(shape):
    g = rng.uniform(0.5, 1.0) if gamma is None else gamma
    after_last = rng.random() < p_start_masked
    for s in range(t_len):
      idx = (s,) + col[1:]
      if after_last:
        mask[idx], kind[idx], discount[idx] = False, 3, g
        after_last = False
        continue
      u = rng.random()
      if u < p_term:
        kind[idx], discount[idx], after_last = 1, 0.0, True
      elif u < p_term + p_trunc:
        kind[idx], discount[idx], after_last = 2, g, True
      else:
        kind[idx], discount[idx] = 0, g
  return discount, mask, kind


def ref_fill_masked(x, mask, value):
  """Copy of `x` with every masked step ([T, *batch] mask, broadcast over any
  trailing axes of x) set to `value` (a scalar or an array like x)."""
  x = _rnp.array(x, copy=True)
  m = _rnp.asarray(mask).reshape(_rnp.shape(mask) + (1,) * (x.ndim - _rnp.ndim(mask)))
  return _rnp.where(m, x, _rnp.asarray(value, dtype=x.dtype))
