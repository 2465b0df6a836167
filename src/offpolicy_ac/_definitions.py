"""What makes a registration again the same one: `agents.register_agent` and
`networks.register_torso` take a redefined function or class (a notebook cell run again)
in place of the old one, and refuse another under a taken name."""

from __future__ import annotations

from typing import Any


def redefines(new: Any, old: Any) -> bool:
  """Whether `new` is `old`, or a function or class defined again where `old` was: the
  same module and qualified name. Lambdas and functions defined inside functions share
  their names, so they only match themselves."""
  if new is old:
    return True
  where = [(getattr(x, "__module__", None), getattr(x, "__qualname__", None)) for x in (new, old)]
  return where[0] == where[1] and all(where[0]) and "<" not in where[0][1]
