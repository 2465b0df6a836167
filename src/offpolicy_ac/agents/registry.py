"""Agent factories by algorithm name (used to rebuild an agent from a run's config.json)."""

from __future__ import annotations

import dataclasses
from typing import Any

from offpolicy_ac.agents.acer import AcerConfig
from offpolicy_ac.agents.acer import make_acer
from offpolicy_ac.agents.impala import ImpalaConfig
from offpolicy_ac.agents.impala import make_impala
from offpolicy_ac.agents.sqil import make_sqil
from offpolicy_ac.agents.sql import SqlConfig
from offpolicy_ac.agents.sql import make_sql

AGENTS: dict[str, tuple[Any, type]] = {
    "impala": (make_impala, ImpalaConfig),
    "acer": (make_acer, AcerConfig),
    "sql": (make_sql, SqlConfig),
    "sqil": (make_sqil, SqlConfig),
}


def config_from_dict(config_cls: type, values: dict) -> Any:
  """Rebuilds a frozen config dataclass from its JSON form (lists back to tuples)."""
  names = {f.name for f in dataclasses.fields(config_cls)}
  unknown = set(values) - names
  if unknown:
    raise ValueError(f"unknown {config_cls.__name__} fields in config: {sorted(unknown)}")
  return config_cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})


def make_agent(algorithm: str, spec: Any, agent_config: dict) -> Any:
  if algorithm not in AGENTS:
    raise ValueError(f"unknown algorithm {algorithm!r}; known: {sorted(AGENTS)}")
  factory, config_cls = AGENTS[algorithm]
  return factory(spec, config_from_dict(config_cls, agent_config))
