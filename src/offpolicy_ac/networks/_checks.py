"""Argument checks of the network constructors: a bad argument is refused (ValueError) when
the network is built, with a message naming the class (or function), the argument and the
value, rather than at `init` with a flax/JAX error that names none of them.

Integers, shapes and numbers are checked by `envs._timestep`'s `check_int`, `check_ints` and
`check_number`: ints and NumPy integers, not bools.
"""

from __future__ import annotations

import inspect
import math
from typing import Any

import flax.linen as nn
import flax.linen.activation
import jax

from offpolicy_ac.envs._timestep import check_bool
from offpolicy_ac.envs._timestep import check_int
from offpolicy_ac.envs._timestep import check_ints
from offpolicy_ac.envs._timestep import check_number

__all__ = [
    "ACTIVATIONS",
    "check_activation",
    "check_bool",
    "check_finite",
    "check_positive_int",
    "check_sizes",
]

ACTIVATIONS = tuple(
    sorted(
        name
        for name, value in vars(flax.linen.activation).items()
        if not name.startswith("_")
        and name not in ("compact", "one_hot")  # a decorator; needs num_classes
        and callable(value)
        and not inspect.isclass(value)
        and getattr(nn, name, None) is value
    )
)
"""The names `MLPTorso(activation=...)` takes: flax.linen's activation functions (not its
classes, such as `nn.PReLU`, or other attributes of `nn`, such as `nn.Dense`)."""


def check_positive_int(owner: str, name: str, value: Any) -> int:
  """`value` as an int; raises ValueError ("{owner}: {name} must be ...") unless it is an
  int or NumPy integer (not a bool) >= 1."""
  return check_int(f"{owner}: {name}", value, 1)


def check_sizes(owner: str, name: str, value: Any) -> tuple[int, ...]:
  """`value` (layer widths, or one observation's shape) as a tuple; raises ValueError
  unless it is a tuple or list of positive ints (NumPy integers too, not bools)."""
  return check_ints(f"{owner}: {name}", value)


def check_finite(owner: str, name: str, value: Any) -> None:
  """Raises ValueError unless `value` is one finite real number (an int, float, or a NumPy
  or JAX scalar of one; not a bool). Traced values pass."""
  if isinstance(value, jax.core.Tracer):
    return
  if not math.isfinite(check_number(f"{owner}: {name}", value)):
    raise ValueError(f"{owner}: {name} must be a finite number, got {value!r}")


def check_activation(owner: str, value: Any) -> str:
  """Raises ValueError unless `value` names one of flax.linen's activation functions."""
  if not isinstance(value, str) or value not in ACTIVATIONS:
    raise ValueError(
        f"{owner}: activation must be the name of a flax.linen activation function (e.g. "
        f"'tanh', 'relu', 'gelu', 'silu'; one of {ACTIVATIONS}), got {value!r}"
    )
  return value
