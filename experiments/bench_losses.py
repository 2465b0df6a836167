"""Benchmark: our targets vs vmapped rlax vs the elementwise memory bound.

For each estimator (V-trace, Retrace, soft-Q lambda-returns) and each
time-major float32 shape [T, B], times in one process:

* ours      -- `offpolicy_ac.losses.<estimator>` on [T, B] (method per flag),
* rlax      -- `jax.jit(jax.vmap(rlax.<same estimator>, in_axes=1, out_axes=1))`,
* bound     -- one jitted elementwise pass reading the same inputs and writing
               the same outputs, with no recurrence (a floor no target beats);
* unchecked -- for Retrace, which indexes by action: ours traced with
               `losses.without_range_checks`, as the agents' updates are. Its
               in-program range check gives `jax.jit(losses.retrace)` an effect,
               which JAX dispatches through its slower Python path (docs/api/losses.md);

and prints medians and the ratios rlax/ours (speed-up) and bound/ours
(fraction of the elementwise bound). Timings are medians over `--repeats`
calls after compilation; this machine is noisy, so compare ratios.

    python experiments/bench_losses.py
    python experiments/bench_losses.py --methods scan associative   # on a GPU
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import time
from typing import Callable
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np

try:
  import rlax
except ModuleNotFoundError:  # a development dependency
  raise SystemExit("bench_losses compares with rlax: pip install 'offpolicy_ac[dev]'") from None

from offpolicy_ac import losses
from offpolicy_ac.cli import check_output_file
from offpolicy_ac.cli import check_suffix
from offpolicy_ac.cli import parse_plain
from offpolicy_ac.cli import script_main
from offpolicy_ac.training import refusals


@dataclasses.dataclass(frozen=True)
class Args:
  shapes: tuple[str, ...] = ("128x1024", "512x4096")
  """Time-major shapes TxB to time."""
  num_actions: int = 4
  """Action-axis size A for Retrace and soft-Q ([T, B, A] Q-values)."""
  methods: tuple[Literal["auto", "scan", "associative"], ...] = ("auto",)
  """Recurrence implementations of ours to time (auto, scan, associative)."""
  estimators: tuple[Literal["vtrace", "retrace", "soft_q"], ...] = ("vtrace", "retrace", "soft_q")
  """Which estimators to time."""
  repeats: int = 30
  """Timed calls per measurement (median reported)."""
  rounds: int = 3
  """Interleaved rounds; the median over all rounds' calls is reported."""
  json_out: str | None = None
  """Optional path to write the results as JSON."""


def _median_ms(fn: Callable, args: tuple, repeats: int) -> list[float]:
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append((time.perf_counter() - start) * 1e3)
  return times


def _inputs(t: int, b: int, a: int, seed: int = 0) -> dict[str, jax.Array]:
  rng = np.random.default_rng(seed)
  f32 = lambda x: jnp.asarray(x, jnp.float32)
  logits = rng.normal(size=(t, b, a))
  pi = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
  done = rng.uniform(size=(t, b)) < 0.02
  return dict(
      v_tm1=f32(rng.normal(size=(t, b))),
      v_t=f32(rng.normal(size=(t, b))),
      r_t=f32(rng.normal(size=(t, b))),
      discount_t=f32(0.99 * (1.0 - done)),
      rho_tm1=f32(np.exp(rng.normal(scale=0.5, size=(t, b)))),
      q_tm1=f32(rng.normal(size=(t, b, a))),
      q_t=f32(rng.normal(size=(t, b, a))),
      a_tm1=jnp.asarray(rng.integers(0, a, size=(t, b)), jnp.int32),
      a_t=jnp.asarray(rng.integers(0, a, size=(t, b)), jnp.int32),
      pi_t=f32(pi),
      mu_t=f32(rng.uniform(0.1, 1.0, size=(t, b))),
  )


def _cases(x: dict[str, jax.Array], method: str):
  """(name, ours, rlax, bound, args) per estimator; all jitted."""
  vm = functools.partial(jax.vmap, in_axes=1, out_axes=1)
  soft_alpha, soft_lambda = 0.1, 0.5

  def rlax_soft(r_t, discount_t, q_t):
    # rlax has no soft-Q target; its user composes one: the soft value with
    # jax.nn.logsumexp, then rlax.lambda_returns, vmapped over the batch.
    v_t = soft_alpha * jax.nn.logsumexp(q_t / soft_alpha, axis=-1)
    return rlax.lambda_returns(r_t, discount_t, v_t, soft_lambda)

  vtrace_args = (x["v_tm1"], x["v_t"], x["r_t"], x["discount_t"], x["rho_tm1"])
  retrace_args = (
      x["q_tm1"],
      x["q_t"],
      x["a_tm1"],
      x["a_t"],
      x["r_t"],
      x["discount_t"],
      x["pi_t"],
      x["mu_t"],
  )
  soft_args = (x["r_t"], x["discount_t"], x["q_t"])

  def vtrace_bound(v_tm1, v_t, r_t, d, rho):  # 5 inputs -> 3 outputs
    td = jnp.minimum(1.0, rho) * (r_t + d * v_t - v_tm1)
    return td, td + v_tm1, r_t + d * td

  def retrace_bound(q_tm1, q_t, a_tm1, a_t, r_t, d, pi_t, mu_t):  # 8 inputs -> 1 output
    qs = q_tm1 + q_t * pi_t
    total = qs[..., 0]
    for k in range(1, qs.shape[-1]):
      total = total + qs[..., k]
    return total + r_t + d * mu_t + (a_tm1 + a_t).astype(r_t.dtype)

  def soft_bound(r_t, d, q_t):
    return r_t + d * losses.soft_value(q_t, soft_alpha)

  return {
      "vtrace": (
          jax.jit(functools.partial(losses.vtrace, method=method)),
          jax.jit(vm(rlax.vtrace_td_error_and_advantage)),
          jax.jit(vtrace_bound),
          vtrace_args,
          None,  # no action index: nothing to check
      ),
      "retrace": (
          jax.jit(functools.partial(losses.retrace, lambda_=0.9, method=method)),
          jax.jit(vm(functools.partial(rlax.retrace, lambda_=0.9))),
          jax.jit(retrace_bound),
          retrace_args,
          jax.jit(
              losses.without_range_checks(
                  functools.partial(losses.retrace, lambda_=0.9, method=method)
              )
          ),
      ),
      "soft_q": (
          jax.jit(
              functools.partial(
                  losses.soft_q_targets, alpha=soft_alpha, lambda_=soft_lambda, method=method
              )
          ),
          jax.jit(vm(rlax_soft)),
          jax.jit(soft_bound),
          soft_args,
          None,
      ),
  }


def main(args: Args) -> list[dict]:
  with refusals():  # bad arguments: one line and exit code 2 (script_main), before any work
    if not args.shapes or not args.methods or not args.estimators:
      raise ValueError("--shapes, --methods and --estimators need at least one value each")
    for shape in args.shapes:
      if not re.fullmatch(r"[1-9][0-9]*x[1-9][0-9]*", shape.lower()):
        raise ValueError(f"--shapes takes TxB sizes such as 128x1024, got {shape!r}")
    if args.repeats < 1 or args.rounds < 1 or args.num_actions < 1:
      raise ValueError("--repeats, --rounds and --num-actions must be >= 1")
    out = None
    if args.json_out:
      out = check_output_file("--json-out", args.json_out)
      check_suffix("--json-out", out, ".json", "JSON")
  print(
      f"jax {jax.__version__} on {jax.devices()[0].device_kind} "
      f"({jax.default_backend()}), rlax {rlax.__version__}"
  )
  header = (
      f"{'estimator':9s} {'shape':>9s} {'method':>11s} {'ours ms':>8s} "
      f"{'rlax ms':>8s} {'bound ms':>8s} {'rlax/ours':>9s} "
      f"{'bound/ours':>10s} {'unchecked ms':>12s} {'rlax/unchecked':>14s}"
  )
  print(header)
  results = []
  for shape in args.shapes:
    t, b = (int(s) for s in shape.lower().split("x"))
    x = _inputs(t, b, args.num_actions)
    for method in args.methods:
      cases = _cases(x, method)
      for name in args.estimators:
        ours, ref, bound, fn_args, unchecked = cases[name]
        timed = [("ours", ours), ("rlax", ref), ("bound", bound)]
        timed += [("unchecked", unchecked)] if unchecked is not None else []
        for _, fn in timed:  # compile (tests/losses check that they agree)
          jax.block_until_ready(fn(*fn_args))
        samples = {key: [] for key, _ in timed}
        for _ in range(args.rounds):  # interleave to share the noise
          for key, fn in timed:
            samples[key] += _median_ms(fn, fn_args, args.repeats)
        med = {k: float(np.median(v)) for k, v in samples.items()}
        row = dict(
            estimator=name,
            T=t,
            B=b,
            method=method,
            ours_ms=med["ours"],
            rlax_ms=med["rlax"],
            bound_ms=med["bound"],
            speedup_vs_rlax=med["rlax"] / med["ours"],
            fraction_of_bound=med["bound"] / med["ours"],
            unchecked_ms=med.get("unchecked"),
            speedup_unchecked_vs_rlax=(
                med["rlax"] / med["unchecked"] if "unchecked" in med else None
            ),
            device=jax.devices()[0].device_kind,
        )
        results.append(row)
        print(
            f"{name:9s} {shape:>9s} {method:>11s} {med['ours']:8.3f} "
            f"{med['rlax']:8.3f} {med['bound']:8.3f} "
            f"{row['speedup_vs_rlax']:9.2f} {row['fraction_of_bound']:10.2f}"
            + (
                f" {med['unchecked']:12.3f} {row['speedup_unchecked_vs_rlax']:14.2f}"
                if "unchecked" in med
                else f" {'-':>12s} {'-':>14s}"
            ),
            flush=True,
        )
  if out is not None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
  return results


if __name__ == "__main__":
  script_main(lambda: parse_plain(Args, __doc__), main)
