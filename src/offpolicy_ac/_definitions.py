"""What makes a registration again the same one: `agents.register_agent` and
`networks.register_torso` take a redefined function or class (a notebook cell run again)
in place of the old one, and refuse another under a taken name."""

from __future__ import annotations

import functools
from typing import Any


def redefines(new: Any, old: Any) -> bool:
  """Whether `new` is `old`, or a function or class defined again where `old` was: the
  same module and qualified name. Lambdas and functions defined inside functions share
  their names, so they match only when their code and default arguments are the same too
  (and they close over nothing). Partials match when their functions do and their
  arguments are equal."""
  if new is old:
    return True
  if isinstance(new, functools.partial) and isinstance(old, functools.partial):
    return _equal((new.args, new.keywords), (old.args, old.keywords)) and redefines(
        new.func, old.func
    )
  where = [(getattr(x, "__module__", None), getattr(x, "__qualname__", None)) for x in (new, old)]
  if where[0] != where[1] or not all(where[0]):
    return False
  if "<" not in where[0][1]:
    return True
  code = [getattr(x, "__code__", None) for x in (new, old)]
  closed = [getattr(x, "__closure__", None) for x in (new, old)]
  defaults = [(getattr(x, "__defaults__", None), getattr(x, "__kwdefaults__", None))
              for x in (new, old)]  # fmt: skip
  same_code = code[0] is not None and code[0] == code[1] and closed == [None, None]
  return same_code and _equal(*defaults)


def _equal(a: Any, b: Any) -> bool:
  """`a == b`, False where == is not a bool (arrays among the arguments)."""
  try:
    return bool(a == b)
  except (TypeError, ValueError):
    return False
