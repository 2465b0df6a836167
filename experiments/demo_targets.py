"""A short tour of the targets on a hand-sized, time-major batch.

Two columns, T = 5 transitions (row s: from step s to step s+1). Column 0: transition 1
ends the episode in a terminal state (discount 0); column 1: transition 1 ends it at a
time limit (discount gamma: the true final observation's value is bootstrapped).
Transition 2 is the auto-reset one in both columns (mask False), so nothing after it
flows back.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from offpolicy_ac import losses
from offpolicy_ac.cli import parse_plain


@dataclasses.dataclass(frozen=True)
class Args:
  gamma: float = 0.9
  """Discount factor."""
  alpha: float = 0.1
  """Soft-Q temperature."""


def main(args: Args) -> None:
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
  main(parse_plain(Args, __doc__))
