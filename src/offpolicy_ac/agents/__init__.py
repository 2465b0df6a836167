"""Stateless agents: IMPALA, ACER, SQL, SQIL (init / act / greedy_act / update)."""

from offpolicy_ac.agents.base import Agent
from offpolicy_ac.agents.base import AgentState
from offpolicy_ac.agents.impala import ImpalaConfig
from offpolicy_ac.agents.impala import make_impala

__all__ = ["Agent", "AgentState", "ImpalaConfig", "make_impala"]
