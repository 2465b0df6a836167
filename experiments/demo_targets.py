"""A short tour of the targets on a hand-sized, time-major batch.

Two columns, T = 5 transitions (row s: from step s to step s+1). Column 0: transition 1
ends the episode in a terminal state (discount 0); column 1: transition 1 ends it at a
time limit (discount gamma: the true final observation's value is bootstrapped).
Transition 2 is the auto-reset one in both columns (mask False), so nothing after it
flows back.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from offpolicy_ac import losses
from offpolicy_ac.cli import parse_plain
from offpolicy_ac.cli import script_main
from offpolicy_ac.training import refusals


@dataclasses.dataclass(frozen=True)
class Args:
  gamma: float = 0.9
  """Discount factor."""
  alpha: float = 0.1
  """Soft-Q temperature."""


def check(args: Args) -> None:
  """Refuses (ValueError) a discount outside [0, 1] and a temperature that is not a finite
  number > 0, before any target is computed."""
  if not 0.0 <= args.gamma <= 1.0:
    raise ValueError(f"--gamma must lie in [0, 1], got {args.gamma}")
  if not (math.isfinite(args.alpha) and args.alpha > 0):
    raise ValueError(f"--alpha must be a finite number > 0, got {args.alpha}")


def main(args: Args) -> None:
  with refusals():  # one line and exit code 2 (script_main)
    check(args)
  g = args.gamma
  r_t = jnp.array([[1.0, 1.0], [1.0, 1.0], [9.0, 9.0], [0.0, 0.0], [1.0, 1.0]])
  discount_t = jnp.array([[g, g], [0.0, g], [g, g], [g, g], [g, g]])
  mask = jnp.array([[True, True], [True, True], [False, False], [True, True], [True, True]])
  v_tm1 = jnp.zeros((5, 2))
  v_t = jnp.array([[0.5, 0.5], [0.5, 2.0], [0.5, 0.5], [0.5, 0.5], [0.5, 0.5]])
  rho = jnp.array([[1.0, 1.0], [2.0, 0.5], [1.0, 1.0], [1.0, 1.0], [0.2, 3.0]])
  out = jax.jit(losses.vtrace)(v_tm1, v_t, r_t, discount_t, rho, mask=mask)
  np.set_printoptions(precision=3, suppress=True)
  print("V-trace targets v_s (rows: time, columns: batch)")
  print(np.asarray(out.errors + v_tm1))
  print("policy-gradient advantages")
  print(np.asarray(out.pg_advantage))

  q_t = jnp.stack([v_t, 2 * v_t, -v_t], axis=-1)
  print(f"soft-Q lambda=0.5 targets (alpha={args.alpha})")
  print(
      np.asarray(
          losses.soft_q_targets(r_t, discount_t, q_t, alpha=args.alpha, lambda_=0.5, mask=mask)
      )
  )
  pi_t = jax.nn.softmax(q_t)
  a_t = jnp.zeros((5, 2), jnp.int32)
  print("Retrace (lambda=1, ACER's Q^ret) targets")
  print(
      np.asarray(
          losses.retrace_targets(q_t, a_t, r_t, discount_t, pi_t, jnp.full((5, 2), 0.5), mask=mask)
      )
  )


if __name__ == "__main__":
  script_main(lambda: parse_plain(Args, __doc__), main)
