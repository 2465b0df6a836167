"""Agent factories by algorithm name: a run directory's agent is rebuilt from its
config.json's algorithm and agent config (`training.load_run`, `--resume`, a compiled run,
`--sweep`). A custom agent trained with `training.run_experiment` is registered first, under
a name of its own, in every process that trains or loads it (`register_agent`)."""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import functools
import inspect
import json
import numbers
import typing
from typing import Any
from typing import Callable

import jax
import numpy as np

from offpolicy_ac._definitions import redefines
from offpolicy_ac.agents.acer import AcerConfig
from offpolicy_ac.agents.acer import make_acer
from offpolicy_ac.agents.impala import ImpalaConfig
from offpolicy_ac.agents.impala import make_impala
from offpolicy_ac.agents.sqil import make_sqil
from offpolicy_ac.agents.sql import SqlConfig
from offpolicy_ac.agents.sql import make_sql
from offpolicy_ac.analysis.metrics_file import config_jsonable

AGENTS: dict[str, tuple[Any, type]] = {
    "impala": (make_impala, ImpalaConfig),
    "acer": (make_acer, AcerConfig),
    "sql": (make_sql, SqlConfig),
    "sqil": (make_sqil, SqlConfig),
}
BUILT_IN = frozenset(AGENTS)


def register_agent(name: str, make_agent: Callable[[Any, Any], Any], config_cls: type) -> None:
  """Registers `make_agent(spec, config) -> Agent`, with `config_cls` its frozen config
  dataclass, as algorithm `name` (`training.run_experiment(name, ...)`, `load_run`).
  The class may name its sweepable fields in a `TUNABLE` tuple (`agents.hyperparams`) and
  check a config in a `validate()` method, which each swept setting then passes.

  Registering a name again with the same factory and config class does nothing; with a
  factory and config class of the same module and qualified names (redefined: a notebook
  cell run again; not lambdas or functions defined in functions, which share their names),
  it registers the new ones.

  Raises:
    ValueError: a name that is empty, built in, taken by another factory, or not a file
      name of its own (a '/' or '\\', control characters, leading or trailing whitespace),
      a `make_agent` that is not callable, or a `config_cls` that is not a dataclass.
  """
  if not isinstance(name, str) or not name:
    raise ValueError(f"an algorithm's name must be a non-empty str, got {name!r}")
  if name != name.strip() or not name.isprintable() or any(c in name for c in "/\\"):
    raise ValueError(
        f"an algorithm's name must not hold a path separator ('/', '\\') or control "
        f"characters, nor start or end with whitespace: it begins its default run directory's "
        f"name (runs/<name>-<task>-seed<k>-<time>), got {name!r}"
    )
  if not callable(make_agent):
    raise ValueError(f"make_agent must be callable (spec, config) -> Agent, got {make_agent!r}")
  if not (isinstance(config_cls, type) and dataclasses.is_dataclass(config_cls)):
    raise ValueError(f"config_cls must be a dataclass, got {config_cls!r}")
  old = AGENTS.get(name, (make_agent, config_cls))
  if old != (make_agent, config_cls) and (
      name in BUILT_IN or not (redefines(make_agent, old[0]) and redefines(config_cls, old[1]))
  ):
    raise ValueError(
        f"algorithm {name!r} is registered with another factory "
        f"({getattr(old[0], '__qualname__', old[0])}, {old[1].__qualname__})"
        f"{' (built in)' if name in BUILT_IN else ''}: choose another name"
    )
  AGENTS[name] = (make_agent, config_cls)


def _code(fn: Any) -> Any:
  """The code a function runs, through partials and wrappers (`jax.jit`, functools.wraps)."""
  while isinstance(fn := inspect.unwrap(fn), functools.partial):
    fn = fn.func
  return getattr(fn, "__code__", type(fn))


def _settings(fn: Any, depth: int = 0, seen: Any = None) -> list[str]:
  """The plain values (numbers, strings, None) that a function closes over or a partial
  binds, through nested functions, partials and tuples, lists and dicts of them: what a
  factory may have been given besides the config."""
  if isinstance(fn, (bool, int, float, str, np.generic)) or fn is None:
    return [repr(fn)]
  seen = {} if seen is None else seen
  if depth > 8 or id(fn) in seen:
    return []
  seen[id(fn)] = fn  # kept alive: a freed temporary's id is given to the next object
  if isinstance(fn, (tuple, list)):
    return [v for x in fn for v in _settings(x, depth + 1, seen)]
  if isinstance(fn, dict):
    return [v for x in fn.values() for v in _settings(x, depth + 1, seen)]
  if not callable(fn):
    return []
  fn = inspect.unwrap(fn)
  if isinstance(fn, functools.partial):
    bound = [*fn.args, *fn.keywords.values()]
    return _settings(bound, depth + 1, seen) + _settings(fn.func, depth + 1, seen)
  cells = getattr(fn, "__closure__", None) or ()
  values = []
  for cell in cells:
    with contextlib.suppress(ValueError):  # an empty cell
      values.append(cell.cell_contents)
  return _settings([*values, *(getattr(fn, "__defaults__", None) or ())], depth + 1, seen)


def check_registered(algorithm: str, agent: Any) -> None:
  """Refuses (ValueError) an agent that `algorithm`'s registered factory would not rebuild
  from its config: a run directory could not load it (`load_run`, evaluate.py), resume it,
  or compile and sweep it, without silently building another network or update.

  The agent's `init`, `act`, `greedy_act` and `update` must run the code of those that
  `make_agent(agent.spec, agent.config)` returns, with the same plain values (numbers,
  strings) in their closures and partials, and `init` must give a state of the same
  arrays; its config must be `config_cls`'s, one that config.json gives back.
  """
  if algorithm not in AGENTS:
    raise ValueError(
        f"unknown algorithm {algorithm!r}; known: {sorted(AGENTS)}. A custom agent needs a "
        "name of its own, registered with agents.register_agent(name, make_agent, "
        "ConfigClass) before it trains or loads"
    )
  make_agent, config_cls = AGENTS[algorithm]
  if not isinstance(agent.config, config_cls):
    raise ValueError(
        f"the agent's config is {type(agent.config).__name__}; {algorithm!r} takes "
        f"{config_cls.__name__}"
    )
  try:
    restored = config_from_dict(config_cls, json.loads(json.dumps(config_jsonable(agent.config))))
  except (TypeError, ValueError) as e:
    raise ValueError(
        f"the agent's config ({type(agent.config).__name__}) cannot be rebuilt as "
        f"{config_cls.__name__} from config.json ({e}): register the agent with its own "
        "config class under a name of its own (agents.register_agent)"
    ) from None
  if not _equal(restored, agent.config):  # e.g. a nested dataclass comes back as a dict
    try:
      jax.eval_shape(make_agent(agent.spec, restored).init, jax.random.PRNGKey(0))
    except Exception as e:  # pylint: disable=broad-except
      raise ValueError(
          f"the agent's config comes back from config.json as {restored}, and {algorithm!r}'s "
          f"factory cannot build from it ({type(e).__name__}: {e}): a run directory could not "
          "load or resume it; make the config's fields JSON values (numbers, strings, bools, "
          "None, tuples of them)"
      ) from None
  _check_config_survives(agent.config, restored)
  rebuilt = make_agent(agent.spec, agent.config)
  fields = ("init", "act", "greedy_act", "update")
  differ = [f for f in fields if _code(getattr(agent, f)) is not _code(getattr(rebuilt, f))]
  if differ:
    raise ValueError(
        f"{algorithm!r}'s factory ({getattr(make_agent, '__name__', make_agent)}) builds "
        f"other {'/'.join(differ)} functions than the agent's, and it rebuilds a run's agent "
        "from the run's config (load_run, --resume, a compiled run, --sweep): register the "
        "custom agent under a name of its own with agents.register_agent(name, make_agent, "
        "ConfigClass)"
    )
  lost = "a setting given to the factory besides the config would be lost; make it a field "
  lost += "of the config class"
  rebuilt_from = f"{algorithm!r}'s factory builds from the agent's config"
  settings = {f: (_settings(getattr(agent, f)), _settings(getattr(rebuilt, f))) for f in fields}
  closing = [f for f, (mine, theirs) in settings.items() if mine != theirs]
  if closing:
    mine, theirs = settings[closing[0]]
    a, b = next(((a, b) for a, b in zip(mine, theirs) if a != b), (len(mine), len(theirs)))
    verb = "close" if len(closing) > 1 else "closes"
    raise ValueError(
        f"the agent's {'/'.join(closing)} {verb} over other values than those {rebuilt_from} "
        f"({a} in the agent's {closing[0]}, {b} rebuilt), and a run's agent is rebuilt from "
        f"its config (load_run, --resume, a compiled run, --sweep): {lost}"
    )
  key = jax.random.PRNGKey(0)
  mine, theirs = (jax.eval_shape(a.init, key) for a in (agent, rebuilt))
  if jax.tree.structure(mine) != jax.tree.structure(theirs):
    raise ValueError(f"the agent's state has another structure than the one {rebuilt_from}: {lost}")
  for (path, x), y in zip(jax.tree_util.tree_flatten_with_path(mine)[0], jax.tree.leaves(theirs)):
    if (x.shape, x.dtype) != (y.shape, y.dtype):
      raise ValueError(
          f"the agent's state{jax.tree_util.keystr(path)} is {x.dtype}{list(x.shape)}, and "
          f"{y.dtype}{list(y.shape)} in the one {rebuilt_from} (a network's sizes?): {lost}"
      )


def _check_config_survives(config: Any, restored: Any) -> None:
  """Refuses (ValueError) a config whose fields do not all come back from config.json
  (`restored`) as they are: an Enum or a function comes back as its str, so a run directory
  would silently rebuild another agent (`load_run`) and `--resume` would refuse it. Lists
  and tuples are alike (the loader gives tuples), as are NumPy and JAX scalars and the
  numbers they come back as."""
  lost = [
      f"{f.name} = {getattr(config, f.name)!r} (back: {getattr(restored, f.name)!r})"
      for f in dataclasses.fields(config)
      if not _survives(getattr(config, f.name), getattr(restored, f.name))
  ]
  if lost:
    raise ValueError(
        f"the agent's config ({type(config).__name__}) does not come back from config.json "
        f"as it is, in {'; '.join(lost)}: a run directory would rebuild another agent from it "
        "(load_run, --resume, a compiled run, --sweep); make each field a JSON value (a "
        f"number, string, bool, None, or a list or tuple of them) that {type(config).__name__}"
        " is rebuilt from, e.g. an Enum's value or a function's name"
    )


def _survives(value: Any, back: Any) -> bool:
  """Whether config value `value` came back from config.json as `back`, the same value."""
  if isinstance(value, enum.Enum):  # even a str or int Enum: another type comes back
    return False
  if isinstance(value, (list, tuple)):
    return (isinstance(back, (list, tuple)) and len(back) == len(value)
            and all(_survives(v, w) for v, w in zip(value, back)))  # fmt: skip
  if isinstance(value, dict):
    return (isinstance(back, dict) and list(back) == list(value)
            and all(_survives(v, back[k]) for k, v in value.items()))  # fmt: skip
  if isinstance(value, (numbers.Number, np.generic)) or (
      hasattr(value, "__array__") and hasattr(value, "dtype") and np.shape(value) == ()
  ):  # NumPy and JAX scalars come back as the Python numbers they hold
    return isinstance(back, (bool, int, float)) and _equal(np.asarray(value).item(), back)
  return type(back) is type(value) and _equal(value, back)


def _equal(a: Any, b: Any) -> bool:
  """`a == b`, False where the comparison fails (arrays of several elements)."""
  try:
    return bool(a == b)
  except Exception:  # pylint: disable=broad-except
    return False


def config_from_dict(config_cls: type, values: dict) -> Any:
  """Rebuilds a frozen config dataclass from its JSON form (`config_jsonable`: lists back
  to tuples, "inf" and "-inf" back to floats in the fields that take a float)."""
  names = {f.name for f in dataclasses.fields(config_cls)}
  unknown = set(values) - names
  if unknown:
    raise ValueError(f"unknown {config_cls.__name__} fields in config: {sorted(unknown)}")
  floats = _float_fields(config_cls)

  def value(name: str, v: Any) -> Any:
    if isinstance(v, list):
      return tuple(v)
    return float(v) if name in floats and v in ("inf", "-inf") else v

  return config_cls(**{k: value(k, v) for k, v in values.items()})


def _float_fields(config_cls: type) -> set[str]:
  """The fields of `config_cls` that take a float: annotated `float` (alone, or in a union
  such as Optional[float]), or, where the annotations cannot be resolved, with a float
  default."""
  try:
    hints = typing.get_type_hints(config_cls)
  except Exception:  # pylint: disable=broad-except  # a custom config's unresolvable names
    return {f.name for f in dataclasses.fields(config_cls) if isinstance(f.default, float)}
  return {name for name, hint in hints.items() if hint is float or float in typing.get_args(hint)}


def make_agent(algorithm: str, spec: Any, agent_config: dict) -> Any:
  if algorithm not in AGENTS:
    raise ValueError(
        f"unknown algorithm {algorithm!r}; known: {sorted(AGENTS)} (a custom agent: "
        "agents.register_agent first)"
    )
  factory, config_cls = AGENTS[algorithm]
  return factory(spec, config_from_dict(config_cls, agent_config))
