"""Hyper-parameters as data: an agent config's tunable numbers passed as arrays.

    hp = hyperparams_of(config)                  # {"learning_rate": 3e-3, "gamma": 0.99, ...}
    agent = make_impala(spec, with_hyperparams(config, traced_hp))   # inside jit / vmap
    settings = parse_sweep(config, ["learning_rate=1e-3,3e-3", "gamma=0.99,0.995"])

The tunable fields of a config class are its `TUNABLE` class attribute: numbers that enter
the agent's functions only through arithmetic (learning rate, discount, lambda, clip
thresholds, temperatures, loss weights, target-update rates), so a traced or vmapped array
can stand in for them. Every other field is static: it shapes the program (network sizes,
the optimizer's kind, n-step lengths, flags) and cannot vary inside one compiled program.

Agents read their config's fields directly, so `make_...(spec, with_hyperparams(config,
hp))` called inside a traced function gives an agent whose hyper-parameters are the arrays
in `hp`: `jax.vmap` over `hp` then trains one learner per setting in one program (the
Anakin sweep, `training.make_train`). Validation skips traced values (`base.check_*`), so
`check_setting` validates each concrete setting before anything compiles.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any
from typing import Mapping
from typing import Optional
from typing import Sequence

import jax.numpy as jnp

__all__ = [
    "canonical_sweep",
    "check_setting",
    "hyperparams_of",
    "parse_sweep",
    "sweep_settings",
    "tunable_fields",
    "with_hyperparams",
]


def tunable_fields(config: Any) -> tuple[str, ...]:
  """The names of the config's tunable fields (its class's `TUNABLE`)."""
  return tuple(getattr(type(config), "TUNABLE", ()))


def hyperparams_of(config: Any) -> dict[str, Any]:
  """The config's tunable fields as float32 scalars (the arrays `make_train` takes)."""
  return {name: jnp.asarray(getattr(config, name), jnp.float32) for name in tunable_fields(config)}


def with_hyperparams(config: Any, hyperparams: Mapping[str, Any]) -> Any:
  """A copy of the config whose tunable fields are the given (possibly traced) arrays.

  Raises:
    ValueError: a name that is not a tunable field, or a value that is not a scalar
      (several values are several learners: `jax.vmap` over them).
  """
  _check_names(config, hyperparams)
  for name, value in hyperparams.items():
    if jnp.shape(value) != ():
      raise ValueError(
          f"hyper-parameter {name!r} must be a scalar, got shape {jnp.shape(value)}: for "
          "several values, jax.vmap over them (one learner each)"
      )
  return dataclasses.replace(config, **dict(hyperparams))


def check_setting(config: Any, setting: Mapping[str, float]) -> Any:
  """The config with one concrete setting applied, validated (by its `validate()`, where
  its class has one); raises ValueError naming the field (unknown, static, or out of
  range) before anything compiles: "the setting {...} is invalid: ..." where the setting
  is at fault, the config's own error where it is not (an empty setting, or a field the
  setting leaves alone)."""
  _check_names(config, setting)
  for name, value in setting.items():
    try:
      float(value)
    except (TypeError, ValueError):
      raise ValueError(f"the setting of {name} must be a number, got {value!r}") from None
  changed = dataclasses.replace(config, **{k: float(v) for k, v in setting.items()})
  if not callable(getattr(changed, "validate", None)):  # a custom agent's config may have none
    return changed
  try:
    changed.validate()
  except ValueError as error:
    if setting and _error_of(config) != str(error):
      raise ValueError(f"the setting {dict(setting)} is invalid: {error}") from None
    raise
  return changed


def _error_of(config: Any) -> Optional[str]:
  """The message of the ValueError `config.validate()` raises, if any."""
  try:
    config.validate()
  except ValueError as error:
    return str(error)
  return None


def parse_sweep(config: Any, specs: Sequence[str]) -> dict[str, list[float]]:
  """`["learning_rate=1e-3,3e-3", "gamma=0.99"]` -> {"learning_rate": [...], ...}: the
  values per field, each field validated (see `check_setting`)."""
  values: dict[str, list[float]] = {}
  if isinstance(specs, str):
    raise ValueError(f"the sweep is a list of FIELD=V1,V2,... strings, got the string {specs!r}")
  for spec in specs:
    name, eq, listed = spec.partition("=")
    name = name.strip().replace("-", "_")
    fields = {f.name for f in dataclasses.fields(config)}
    if name not in fields and f"{name}_" in fields:  # the flag's spelling: --lambda
      name = f"{name}_"
    if not eq or not name or not listed.strip():
      raise ValueError(f"--sweep takes FIELD=V1,V2,..., got {spec!r}")
    if name in values:
      raise ValueError(f"--sweep names {name!r} twice")
    _check_names(config, {name: None})
    parts = [v.strip() for v in listed.split(",")]
    if any(parts) and not all(parts):  # 1e-3,,3e-3
      raise ValueError(f"--sweep {name}: a value is missing in {listed!r}")
    try:
      values[name] = [float(v) for v in parts if v]
    except ValueError:
      raise ValueError(f"--sweep {name}: the values must be numbers, got {listed!r}") from None
    if not values[name]:
      raise ValueError(f"--sweep takes FIELD=V1,V2,..., got {spec!r}: no value")
    if len(set(values[name])) != len(values[name]):
      raise ValueError(f"--sweep {name}: a value is repeated in {listed!r}")
    for v in values[name]:
      check_setting(config, {name: v})
  return values


def canonical_sweep(config: Any, specs: Sequence[str]) -> tuple[str, ...]:
  """`specs` written one way, as config.json keeps a sweep: each field as `config` names it
  (`lambda_` for `lambda`, `learning_rate` for `learning-rate`), its values as Python
  reads them (`0.001` for `1e-3`). Validates them (`parse_sweep`)."""
  values = parse_sweep(config, specs)
  return tuple(f"{name}={','.join(map(repr, listed))}" for name, listed in values.items())


def sweep_settings(values: Mapping[str, Sequence[float]]) -> list[dict[str, float]]:
  """Every combination of the swept values (the first field varies slowest); [{}] for
  no sweep."""
  names = list(values)
  return [dict(zip(names, combo)) for combo in itertools.product(*(values[n] for n in names))]


def _check_names(config: Any, named: Mapping[str, Any]) -> None:
  tunable = tunable_fields(config)
  fields = {f.name for f in dataclasses.fields(config)}
  for name in named:
    if name not in fields:
      raise ValueError(
          f"{type(config).__name__} has no field {name!r}; its tunable fields are "
          f"{list(tunable)}"
      )
    if name not in tunable:
      raise ValueError(
          f"{name!r} is a static field of {type(config).__name__} (it shapes the compiled "
          f"program) and cannot be swept or passed as data; tunable fields: {list(tunable)}"
      )
